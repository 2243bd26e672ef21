"""One launch of one own region, on inputs with edges planted: the plan and its arguments.

A region's own image, NVRTC's and the reference (nv-sim runs it from the stream's bytes)
each run the same one-launch plan; their output tensors must agree byte for byte. On a
GPU this names the region that differs, and the first element, at a launch's cost.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from bob.config import Hyper
from bob.kernels import signatures as sig
from bob.plan.model import (
    Dim3,
    LaunchSpec,
    Plan,
    PointerParam,
    ProgramSpec,
    Region,
    Scalar,
    Submission,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import SM90, place
from bob.program.bob import (
    LN2_BITS,
    LOG2E_BITS,
    adam_scalar_table,
    adam_scalars,
    adamw_grid,
    health_grid,
    inverse_rows_bits,
    scatter_grid,
)
from bob.program.collapsed import row_grid
from bob.records.collapsed import ClassIndex

# Pointers whose elements are indices (u32); every other one holds binary32.
CLASS_INDEX = ("row_offsets", "columns", "lane_order")  # a collapsed table's index
INDEX_POINTERS = {"prompt", "targets", "prediction", *CLASS_INDEX}
SUBNORMALS = np.array([0x00000001, 0x00000003, 0x007FFFFF, 0x80000002, 0x80400000],
                      np.uint32).view(np.float32)
EDGES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0e38, -3.0e38, 1.0e-38],
                 np.float32)


FUSED_UPDATES = 3  # the fused kernels' updates in the one launch, the loss stored after
FUSED = (sig.FUSED_HARD, sig.FUSED_CORPUS)


def pair_count(vocab: int) -> int:
    """The scatter's pairs: a few a row, as a corpus gives."""
    return 3 * vocab


@cache
def class_index(vocab: int) -> ClassIndex:
    """The collapsed regions' sound index at `vocab`: row 0 with no exceptions, row 1 (the
    prompt's) with most of its columns, row 2 with every one, the last row with its first
    and last columns, and a few columns in every other third row."""
    rng = np.random.default_rng(vocab)
    keys = [vocab + c for c in rng.choice(vocab, vocab - vocab // 4, replace=False)]
    keys += [2 * vocab + c for c in range(vocab)]
    for row in range(3, vocab - 1, 3):
        keys += [row * vocab + c for c in rng.choice(vocab, 3, replace=False)]
    keys += [(vocab - 1) * vocab, vocab * vocab - 1]
    index = ClassIndex.from_keys(vocab, np.unique(np.array(keys, np.int64)))
    assert index.problem() is None
    return index


def grid_of(region: str, vocab: int) -> int:
    if region in sig.COLLAPSED_REGIONS:
        return row_grid(vocab)
    if region in (sig.LOSS_HARD, sig.LOSS_CORPUS, sig.LOSS_ONLY_CORPUS, *FUSED):
        return vocab  # a block per row
    if region == sig.ADAMW:
        return adamw_grid(vocab * vocab)
    if region in (sig.SCATTER, sig.COLLAPSED_SCATTER):
        return scatter_grid(pair_count(vocab))
    if region == sig.COLLAPSED_HEALTH:
        return health_grid(class_index(vocab).classes)
    return 1


def scalars(region: str, vocab: int) -> dict[str, Scalar]:
    values = {"vocab": Scalar.u32(vocab), "rows": Scalar.u32(vocab),
              "columns": Scalar.u32(vocab), "log2e": Scalar.f32_bits(LOG2E_BITS),
              "ln2": Scalar.f32_bits(LN2_BITS),
              "inverse_rows": Scalar.f32_bits(inverse_rows_bits(vocab)),
              "count": Scalar.u32(pair_count(vocab)), "updates": Scalar.u32(FUSED_UPDATES),
              "finish": Scalar.u32(1)}
    values.update(adam_scalars(Hyper(), 3))
    values.update({name: Scalar.u32(size) for name, size in index_sizes(region, vocab).items()})
    return values


def index_sizes(region: str, vocab: int) -> dict[str, int]:
    """A collapsed region's size arguments for class_index(vocab) (none for the others)."""
    if region not in sig.COLLAPSED_REGIONS:
        return {}
    index = class_index(vocab)
    return {"exceptions": index.exceptions, "classes": index.classes, "offsets": vocab + 1}


def tensor_elements(param: PointerParam, region: str, vocab: int, grid: int | None = None,
                    ) -> int:
    factors = {"vocab": vocab, "rows": vocab, "columns": vocab, "count": pair_count(vocab),
               "grid.x": grid_of(region, vocab) if grid is None else grid,
               "updates": FUSED_UPDATES, "finish": 1, **index_sizes(region, vocab)}
    return param.footprint.evaluate(factors) // 4


def one_launch_plan(region: Region, vocab: int, grid: int | None = None) -> Plan:
    """`region` launched once over a tensor per pointer, named as its parameter; `grid`
    blocks where given (a loss region's first rows), else grid_of's."""
    params = sig.SIGNATURES[region.name]
    given = scalars(region.name, vocab)
    blocks = grid_of(region.name, vocab) if grid is None else grid
    tensors = tuple(TensorSpec(p.name, "u32" if p.name in INDEX_POINTERS else "f32",
                               (tensor_elements(p, region.name, vocab, blocks),))
                    for p in params if isinstance(p, PointerParam))
    args = tuple(TensorRef(p.name) if isinstance(p, PointerParam) else given[p.name]
                 for p in params)
    program = ProgramSpec(
        regions=(region,), tensors=tensors,
        launches=(LaunchSpec(region.name, Dim3(blocks), Dim3(sig.BLOCK),
                             args, f"{region.name}-alone"),),
        submissions=(Submission(0, 1, 1),))
    return place(program, SM90)


def inputs(region: str, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Every pointer's starting contents: numbers with edges planted, indices < V (the
    prompt's row has ties and a NaN)."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for param in sig.SIGNATURES[region]:
        if not isinstance(param, PointerParam):
            continue
        count = tensor_elements(param, region, vocab)
        if param.name in CLASS_INDEX:
            index = class_index(vocab)
            arrays[param.name] = {"row_offsets": index.device_offsets(),
                                  "columns": index.columns,
                                  "lane_order": index.lane_order()}[param.name]
            continue
        if param.name in INDEX_POINTERS:
            arrays[param.name] = rng.integers(0, vocab, count, dtype=np.uint32)
            continue
        if param.name == "keys":
            keys = (collapsed_scatter_keys(rng, vocab, count // 2)
                    if region == sig.COLLAPSED_SCATTER else scatter_keys(rng, vocab, count // 2))
            arrays[param.name] = keys.view(np.uint32)
            continue
        if param.name == "adam_scalars":  # updates 1, 2, 3 of the default hyperparameters
            arrays[param.name] = adam_scalar_table(Hyper(), 1, FUSED_UPDATES).reshape(-1)
            continue
        values = rng.standard_normal(count, dtype=np.float32) * 4
        if param.name == "weights":
            values = np.abs(values) / vocab
        if param.name == "second_moment":
            values = np.abs(values) * 1e-3
        planted = np.concatenate([EDGES, SUBNORMALS, -SUBNORMALS])
        if param.name in ("second_moment",):
            planted = np.concatenate([planted, np.float32([-1.0, 1e-45])])
        where = rng.choice(count, min(count // 8, 4 * len(planted)), replace=False)
        values[where] = np.resize(planted, len(where))
        if param.name in ("parameters", "table", "row") and count >= 2 * vocab:
            row = 1 % (count // vocab)
            values[row * vocab:(row + 1) * vocab] = 0.25  # a row of ties
        arrays[param.name] = values.astype(np.float32)
    if "prompt" in arrays:
        arrays["prompt"][:] = 1  # the row of ties
    if region == sig.ARGMAX:
        arrays["row"][:] = 0.5
        arrays["row"][[vocab // 3, vocab // 2]] = 7.0  # two equal maxima: the lower wins
    return arrays


def scatter_keys(rng: np.random.Generator, vocab: int, count: int) -> np.ndarray:
    """`count` distinct u64 keys, shuffled: most in the V x V table, some past it (at
    V x V, and at or above 2^32 with low words inside the table: never written)."""
    cells = vocab * vocab
    outside = np.array([cells, 2**32 - 1, 2**32, 2**32 + 5, 2**63, 2**64 - 1], np.uint64)
    inside = rng.choice(cells, count - len(outside), replace=False).astype(np.uint64)
    keys = np.concatenate([inside, outside])
    rng.shuffle(keys)
    return keys


def collapsed_scatter_keys(rng: np.random.Generator, vocab: int, count: int) -> np.ndarray:
    """`count` distinct u64 keys, shuffled: half of them exceptions of class_index(vocab)
    (where it has so many), the rest cells that are none and scatter_keys' keys past the
    table."""
    exceptions = class_index(vocab).keys()
    hits = rng.choice(exceptions, min(count // 2, exceptions.size), replace=False)
    others = scatter_keys(rng, vocab, count)
    others = others[~np.isin(others, exceptions.astype(np.uint64))]
    keys = np.concatenate([hits.astype(np.uint64), others[:count - hits.size]])
    assert keys.size == count
    rng.shuffle(keys)
    return keys


def run_alone(backend, arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """Write `arrays`, run the one launch, read every tensor back."""
    for name, array in arrays.items():
        backend.write_tensor(name, array.tobytes())
    backend.run(range(1))
    return {name: backend.read_tensor(name) for name in arrays}


def first_difference(name: str, a: bytes, b: bytes) -> str | None:
    if a == b:
        return None
    x, y = np.frombuffer(a, np.uint32), np.frombuffer(b, np.uint32)
    index = int(np.argmax(x != y))
    return (f"{name}[{index}]: {x[index]:#010x} vs {y[index]:#010x} "
            f"({int((x != y).sum())} of {x.size} differ)")
