"""Bob's kernels as the plan sees them: names, block widths, arguments.

The seed's four (the loss-gradient in two modes), the fused schedule's
training kernel (in two modes), and the health check that ends every training
invocation. Each pointer declares the bytes the kernel
reaches through it as a function of the launch (its u32 arguments), so the
certificate can check every launch. Pointers come first, then 4-byte scalars:
the parameter block layout is then exactly CUDA's kernel parameter layout for
these signatures.
"""

from __future__ import annotations

from dataclasses import replace

from bob.plan.model import (
    ClusterSlices,
    Footprint,
    Param,
    PointerParam,
    Region,
    ScalarParam,
    Target,
)

GATHER = "bob-row-gather"
LOSS_HARD = "bob-loss-gradient"
LOSS_CORPUS = "bob-loss-gradient-corpus"
ADAMW = "bob-adamw"
ARGMAX = "bob-greedy-argmax"
FUSED_HARD = "bob-fused-train"
FUSED_CORPUS = "bob-fused-train-corpus"
# The same kernels for rows that stay on chip (1024 < V <= 4096): other resources, same bits.
FUSED_WIDE_HARD = "bob-fused-train-wide"
FUSED_WIDE_CORPUS = "bob-fused-train-wide-corpus"
# And for rows of 4096 < V <= 8192, on chip in a block of 1024 threads: same bits.
FUSED_TALL_HARD = "bob-fused-train-tall"
FUSED_TALL_CORPUS = "bob-fused-train-tall-corpus"
# And for streamed rows with V % 4 == 0 (beyond those): float4 loads and stores, so the
# tables (and corpus weights) must be 16-byte aligned. Same bits.
FUSED_STREAM_HARD = "bob-fused-train-stream"
FUSED_STREAM_CORPUS = "bob-fused-train-stream-corpus"
# And for rows beyond TALL's, any V: a block of 512 threads per SM, looping over rows, holds as
# much of a row's w in shared memory as the target leaves it (a row of 52224 floats on sm_90),
# so each update reads w from memory once. Same bits.
FUSED_HELD_HARD = "bob-fused-train-held"
FUSED_HELD_CORPUS = "bob-fused-train-held-corpus"
# And for rows past TALL's that no one SM holds for a launch: a thread-block cluster of C
# CTAs (sm_90) holds the row's w, m, v and exponentials (and corpus weights) in its
# distributed shared memory for all of a launch's updates, CTA c the columns of tree lanes
# c 256/C .. (c + 1) 256/C - 1. Same bits.
FUSED_CLUSTER_HARD = "bob-fused-train-cluster"
FUSED_CLUSTER_CORPUS = "bob-fused-train-cluster-corpus"
HEALTH = "bob-health"
# Sparse corpus input: each (key, value) pair into its cell of a V x V table of weights, once
# per load; and the corpus loss alone (validation: no gradient is written).
SCATTER = "bob-scatter"
LOSS_ONLY_CORPUS = "bob-loss-corpus"

# The collapsed tables' regions (bob.kernels.collapsed): tables of V + K classes (a rest
# class per row, then the K exception columns), indexed by row_offsets u32[V + 1] and
# columns u32[K], with lane_order u32[K] (each row's exceptions by lane, then column).
# AdamW and the argmax are the dense regions' own (AdamW over 1 x (V + K) elements).
COLLAPSED_GATHER = "bob-collapsed-gather"
COLLAPSED_LOSS_HARD = "bob-collapsed-loss-gradient"
COLLAPSED_LOSS_CORPUS = "bob-collapsed-loss-gradient-corpus"
COLLAPSED_LOSS_ONLY = "bob-collapsed-loss-corpus"
COLLAPSED_FUSED_HARD = "bob-collapsed-fused-train"
COLLAPSED_FUSED_CORPUS = "bob-collapsed-fused-train-corpus"
COLLAPSED_SCATTER = "bob-collapsed-scatter"
COLLAPSED_HEALTH = "bob-collapsed-health"
COLLAPSED_REGIONS = (COLLAPSED_GATHER, COLLAPSED_LOSS_HARD, COLLAPSED_LOSS_CORPUS,
                     COLLAPSED_LOSS_ONLY, COLLAPSED_FUSED_HARD, COLLAPSED_FUSED_CORPUS,
                     COLLAPSED_SCATTER, COLLAPSED_HEALTH)
# The collapsed loss kernels run a warp per row: this many rows a block of BLOCK threads.
COLLAPSED_ROWS_PER_BLOCK = 8

BLOCK = 256  # threads per block; reductions run over 256 lanes whatever the block
# Regions launched with other blocks (their kernels trap on any other width).
# bob_kernels.cu: TALL_HARD_THREADS and TALL_CORPUS_THREADS's defaults (tests check they agree)
TALL_BLOCKS = {FUSED_TALL_HARD: 1024, FUSED_TALL_CORPUS: 512}
BLOCKS = {**TALL_BLOCKS, FUSED_HELD_HARD: 512, FUSED_HELD_CORPUS: 512,
          FUSED_CLUSTER_HARD: 512, FUSED_CLUSTER_CORPUS: 512}
# The cluster regions and how each CTA's slice of a row sits in its shared memory.
# A corpus slice needs the same four: its kernel holds the row's weights as a fifth array
# where the dynamic shared memory has room, and reads them from global memory where not.
CLUSTER_SLICES = {FUSED_CLUSTER_HARD: ClusterSlices(arrays=4),  # w, m, v, e
                  FUSED_CLUSTER_CORPUS: ClusterSlices(arrays=4)}
# Regions that ask, at launch, for all the shared memory their target leaves beyond the
# image's own (dynamic shared memory): the kernel reads how much it got.
# The cluster regions do too (CLUSTER_SLICES), and their kernels trap below their slice.
SHARED_REST = frozenset({FUSED_HELD_HARD, FUSED_HELD_CORPUS})
# Every region that takes all of an SM's shared memory, so runs one CTA an SM.
WHOLE_SM_SHARED = SHARED_REST | CLUSTER_SLICES.keys()
# The regions that run many updates a launch past ONE_LAUNCH_MAX_VOCAB (the program's
# HELD_UPDATES_PER_LAUNCH): those whose rows, or their w, stay in shared memory.
HELD_ROWS = frozenset({FUSED_HELD_HARD, FUSED_HELD_CORPUS, *CLUSTER_SLICES})
# The held kernels' static shared memory, for plans made before any image is compiled:
# bob_held.cuh's HeldShared at 512 threads (two rounds of staged quads, the staged scalars,
# the lane partials, the warp keys, the result: 21584 bytes) and the 1 KiB per block the
# system reserves, which sm_90 images count with it (cubin.py). sm_86 images leave that KiB
# out, so there the figure errs 1 KiB high: on the safe side.
HELD_STATIC_SHARED_BYTES = 21584 + 1024
# The cluster kernels' static shared memory, likewise: bob_cluster.cuh's ClusterShared at
# 512 threads (two turns of 256 lane partials, two max keys, the warp keys, the staged
# scalars, the result: 6224 bytes) and the reserved KiB.
CLUSTER_STATIC_SHARED_BYTES = 6224 + 1024
# Regions whose compiled image names their block (its launch bounds): a kernel compiled with
# other bounds (dev/cuda/bench_tall.py's TALL_*_THREADS variants) is planned with its own.
BLOCK_FROM_IMAGE = frozenset({FUSED_TALL_HARD, FUSED_TALL_CORPUS, FUSED_HELD_HARD,
                              FUSED_HELD_CORPUS, *CLUSTER_SLICES})


def block_of(region: str) -> int:
    """Threads per block the region's kernel runs with."""
    return BLOCKS.get(region, BLOCK)

_ROW = Footprint(4, ("vocab",))
_TABLE = Footprint(4, ("vocab", "vocab"))
# The loss kernels run a block per row and reach the rows of their grid only: V in one
# piece, R in a row shard's plan (the R x V tables of rows [first, last)).
_GRID_ROWS = Footprint(4, ("grid.x", "vocab"))
_GRID_ROW = Footprint(4, ("grid.x",))
# AdamW's elements as rows x columns, both u32: V x V reaches 2**32 at V = 65536, past any
# u32 count, and every scalar argument stays 4 bytes (the parameter block layout).
_ELEMENTS = Footprint(4, ("rows", "columns"))
# The fused kernel writes gradients and row losses only when `finish` is 1 (the last
# launch of an invocation), so a launch with finish 0 reaches none of those bytes.
_FINISHED_TABLE = Footprint(4, ("vocab", "vocab", "finish"))
_FINISHED_ROW = Footprint(4, ("vocab", "finish"))
_ADAM_ROWS = Footprint(32, ("updates",))  # one 8-float row of AdamW scalars per update
# The health kernel loads the tables four floats at a time, so it needs them 16-byte aligned.
QUAD_ALIGN = 16
# health: one u64 per table (parameters, first_moment, second_moment), 8-byte aligned for
# the device's 64-bit atomics. A u64 because V x V reaches 2^32 at V = 65536.
HEALTH_COUNTS = ("parameters", "first_moment", "second_moment")
_HEALTH = Footprint(8 * len(HEALTH_COUNTS))
# The scatter's K pairs: u64 keys (row * V + column: V x V needs 33 bits at V = 65536) and
# binary32 values.
_KEYS = Footprint(8, ("count",))
_VALUES = Footprint(4, ("count",))

SIGNATURES: dict[str, tuple] = {
    # logits[j] = table[prompt[0]][j]: reads any row of the table.
    GATHER: (
        PointerParam("logits", _ROW, "write"),
        PointerParam("prompt", Footprint(4), "read"),
        PointerParam("table", _TABLE, "read"),
        ScalarParam("vocab", "u32"),
    ),
    # One block per row: row loss and gradient of the hard-target objective.
    LOSS_HARD: (
        PointerParam("parameters", _GRID_ROWS, "read"),
        PointerParam("gradients", _GRID_ROWS, "write"),
        PointerParam("targets", _GRID_ROW, "read"),
        PointerParam("loss", _GRID_ROW, "write"),
        ScalarParam("log2e", "f32"),
        ScalarParam("ln2", "f32"),
        ScalarParam("inverse_rows", "f32"),
        ScalarParam("vocab", "u32"),
    ),
    # One block per row: row loss and gradient against weighted targets.
    LOSS_CORPUS: (
        PointerParam("parameters", _GRID_ROWS, "read"),
        PointerParam("gradients", _GRID_ROWS, "write"),
        PointerParam("weights", _GRID_ROWS, "read"),
        PointerParam("loss", _GRID_ROW, "write"),
        ScalarParam("log2e", "f32"),
        ScalarParam("ln2", "f32"),
        ScalarParam("vocab", "u32"),
    ),
    # Elementwise AdamW over rows x columns parameters; the host writes the scalars.
    ADAMW: (
        PointerParam("parameters", _ELEMENTS, "readwrite"),
        PointerParam("gradients", _ELEMENTS, "read"),
        PointerParam("first_moment", _ELEMENTS, "readwrite"),
        PointerParam("second_moment", _ELEMENTS, "readwrite"),
        ScalarParam("decay", "f32"),
        ScalarParam("beta1", "f32"),
        ScalarParam("one_minus_beta1", "f32"),
        ScalarParam("beta2", "f32"),
        ScalarParam("one_minus_beta2", "f32"),
        ScalarParam("step_size", "f32"),
        ScalarParam("eps_hat", "f32"),
        ScalarParam("rows", "u32"),
        ScalarParam("columns", "u32"),
    ),
    # prediction[0] = lowest j with row[j] maximal.
    ARGMAX: (
        PointerParam("prediction", Footprint(4), "write"),
        PointerParam("row", _ROW, "read"),
        ScalarParam("vocab", "u32"),
    ),
    # One block per row, `updates` updates: AdamW with the gradient of the row (recomputed
    # from the parameters, never read), then with finish 1 the row's loss and gradient.
    FUSED_HARD: (
        PointerParam("parameters", _TABLE, "readwrite"),
        PointerParam("first_moment", _TABLE, "readwrite"),
        PointerParam("second_moment", _TABLE, "readwrite"),
        PointerParam("gradients", _FINISHED_TABLE, "write"),
        PointerParam("targets", _ROW, "read"),
        PointerParam("loss", _FINISHED_ROW, "write"),
        PointerParam("adam_scalars", _ADAM_ROWS, "read"),
        ScalarParam("log2e", "f32"),
        ScalarParam("ln2", "f32"),
        ScalarParam("inverse_rows", "f32"),
        ScalarParam("vocab", "u32"),
        ScalarParam("updates", "u32"),
        ScalarParam("finish", "u32"),
    ),
    FUSED_CORPUS: (
        PointerParam("parameters", _TABLE, "readwrite"),
        PointerParam("first_moment", _TABLE, "readwrite"),
        PointerParam("second_moment", _TABLE, "readwrite"),
        PointerParam("gradients", _FINISHED_TABLE, "write"),
        PointerParam("weights", _TABLE, "read"),
        PointerParam("loss", _FINISHED_ROW, "write"),
        PointerParam("adam_scalars", _ADAM_ROWS, "read"),
        ScalarParam("log2e", "f32"),
        ScalarParam("ln2", "f32"),
        ScalarParam("vocab", "u32"),
        ScalarParam("updates", "u32"),
        ScalarParam("finish", "u32"),
    ),
    # health[t] += the count of non-finite elements (NaN, +-inf) of table t, read only.
    # Adds, so that the device can count with atomics in one pass: the host zeroes health
    # when it loads an invocation (Session.load), and it is read back as a whole.
    HEALTH: (
        PointerParam("parameters", _TABLE, "read", align=QUAD_ALIGN),
        PointerParam("first_moment", _TABLE, "read", align=QUAD_ALIGN),
        PointerParam("second_moment", _TABLE, "read", align=QUAD_ALIGN),
        PointerParam("health", _HEALTH, "readwrite", align=8),
        ScalarParam("vocab", "u32"),
    ),
    # table[keys[i]] = values[i] for i < count; keys are distinct (the host refuses others),
    # so no two threads write one cell, and a key >= V x V is never written.
    SCATTER: (
        PointerParam("table", _TABLE, "write"),
        PointerParam("keys", _KEYS, "read", align=8),
        PointerParam("values", _VALUES, "read"),
        ScalarParam("count", "u32"),
        ScalarParam("vocab", "u32"),
    ),
    # One block per row: bob-loss-gradient-corpus's row loss, bit for bit, and no gradient.
    LOSS_ONLY_CORPUS: (
        PointerParam("parameters", _GRID_ROWS, "read"),
        PointerParam("weights", _GRID_ROWS, "read"),
        PointerParam("loss", _GRID_ROW, "write"),
        ScalarParam("log2e", "f32"),
        ScalarParam("ln2", "f32"),
        ScalarParam("vocab", "u32"),
    ),
}
# -- the collapsed tables' regions ---------------------------------------------------------
# Every table of classes is V + K floats (`classes`), the index's offsets V + 1 u32
# (`offsets`) and its columns and lane order K u32 (`exceptions`): scalar arguments name
# each count, so each footprint is a product of the launch's own values.
_CLASSES = Footprint(4, ("classes",))
_OFFSETS = Footprint(4, ("offsets",))
_EXCEPTION_WORDS = Footprint(4, ("exceptions",))
_INDEX = (
    PointerParam("row_offsets", _OFFSETS, "read"),
    PointerParam("columns", _EXCEPTION_WORDS, "read"),
    PointerParam("lane_order", _EXCEPTION_WORDS, "read"),
)
_SIZES = (ScalarParam("vocab", "u32"), ScalarParam("exceptions", "u32"),
          ScalarParam("classes", "u32"), ScalarParam("offsets", "u32"))
SIGNATURES.update({
    # logits = the expanded row prompt[0] of the parameters.
    COLLAPSED_GATHER: (
        PointerParam("logits", _ROW, "write"),
        PointerParam("prompt", Footprint(4), "read"),
        PointerParam("parameters", _CLASSES, "read"),
        *_INDEX, *_SIZES,
    ),
    # Every row's loss and every class's gradient, hard targets.
    COLLAPSED_LOSS_HARD: (
        PointerParam("parameters", _CLASSES, "read"),
        PointerParam("gradients", _CLASSES, "write"),
        PointerParam("targets", _ROW, "read"),
        PointerParam("loss", _ROW, "write"),
        *_INDEX,
        ScalarParam("log2e", "f32"), ScalarParam("ln2", "f32"),
        ScalarParam("inverse_rows", "f32"), *_SIZES,
    ),
    # Against the exceptions' corpus weights (f32[K]; the rest's weight is 0).
    COLLAPSED_LOSS_CORPUS: (
        PointerParam("parameters", _CLASSES, "read"),
        PointerParam("gradients", _CLASSES, "write"),
        PointerParam("weights", _EXCEPTION_WORDS, "read"),
        PointerParam("loss", _ROW, "write"),
        *_INDEX,
        ScalarParam("log2e", "f32"), ScalarParam("ln2", "f32"), *_SIZES,
    ),
    # The corpus loss alone (validation): no gradient.
    COLLAPSED_LOSS_ONLY: (
        PointerParam("parameters", _CLASSES, "read"),
        PointerParam("weights", _EXCEPTION_WORDS, "read"),
        PointerParam("loss", _ROW, "write"),
        *_INDEX,
        ScalarParam("log2e", "f32"), ScalarParam("ln2", "f32"), *_SIZES,
    ),
    # `updates` updates of every class (gradient, then AdamW with row k of adam_scalars);
    # with finish 1 the loss and gradient of the result. The gradients hold each update's
    # gradient between its two steps: the whole table is reached whatever `finish`.
    COLLAPSED_FUSED_HARD: (
        PointerParam("parameters", _CLASSES, "readwrite"),
        PointerParam("first_moment", _CLASSES, "readwrite"),
        PointerParam("second_moment", _CLASSES, "readwrite"),
        PointerParam("gradients", _CLASSES, "readwrite"),
        PointerParam("targets", _ROW, "read"),
        PointerParam("loss", _FINISHED_ROW, "write"),
        PointerParam("adam_scalars", _ADAM_ROWS, "read"),
        *_INDEX,
        ScalarParam("log2e", "f32"), ScalarParam("ln2", "f32"),
        ScalarParam("inverse_rows", "f32"), *_SIZES,
        ScalarParam("updates", "u32"), ScalarParam("finish", "u32"),
    ),
    COLLAPSED_FUSED_CORPUS: (
        PointerParam("parameters", _CLASSES, "readwrite"),
        PointerParam("first_moment", _CLASSES, "readwrite"),
        PointerParam("second_moment", _CLASSES, "readwrite"),
        PointerParam("gradients", _CLASSES, "readwrite"),
        PointerParam("weights", _EXCEPTION_WORDS, "read"),
        PointerParam("loss", _FINISHED_ROW, "write"),
        PointerParam("adam_scalars", _ADAM_ROWS, "read"),
        *_INDEX,
        ScalarParam("log2e", "f32"), ScalarParam("ln2", "f32"), *_SIZES,
        ScalarParam("updates", "u32"), ScalarParam("finish", "u32"),
    ),
    # weights[i] = values[j] where key j (row * V + column) is exception i, for j < count;
    # a key that is no exception is not written. Keys are distinct: no two threads write
    # one slot.
    COLLAPSED_SCATTER: (
        PointerParam("weights", _EXCEPTION_WORDS, "write"),
        PointerParam("keys", _KEYS, "read", align=8),
        PointerParam("values", _VALUES, "read"),
        PointerParam("row_offsets", _OFFSETS, "read"),
        PointerParam("columns", _EXCEPTION_WORDS, "read"),
        ScalarParam("count", "u32"), *_SIZES,
    ),
    # health[t] += the non-finite classes of table t.
    COLLAPSED_HEALTH: (
        PointerParam("parameters", _CLASSES, "read", align=QUAD_ALIGN),
        PointerParam("first_moment", _CLASSES, "read", align=QUAD_ALIGN),
        PointerParam("second_moment", _CLASSES, "read", align=QUAD_ALIGN),
        PointerParam("health", _HEALTH, "readwrite", align=8),
        ScalarParam("classes", "u32"),
    ),
})
SIGNATURES[FUSED_WIDE_HARD] = SIGNATURES[FUSED_HARD]
SIGNATURES[FUSED_WIDE_CORPUS] = SIGNATURES[FUSED_CORPUS]
SIGNATURES[FUSED_TALL_HARD] = SIGNATURES[FUSED_HARD]
SIGNATURES[FUSED_TALL_CORPUS] = SIGNATURES[FUSED_CORPUS]
# Element by element from global memory (any V): 4-byte aligned tables will do.
SIGNATURES[FUSED_CLUSTER_HARD] = SIGNATURES[FUSED_HARD]
SIGNATURES[FUSED_CLUSTER_CORPUS] = SIGNATURES[FUSED_CORPUS]


def _quad_aligned(params: tuple[Param, ...]) -> tuple[Param, ...]:
    """The signature with the tables it moves as float4 (every V x V one) 16-byte aligned."""
    return tuple(replace(p, align=QUAD_ALIGN)
                 if isinstance(p, PointerParam) and p.footprint in (_TABLE, _FINISHED_TABLE)
                 else p for p in params)


SIGNATURES[FUSED_STREAM_HARD] = _quad_aligned(SIGNATURES[FUSED_HARD])
SIGNATURES[FUSED_STREAM_CORPUS] = _quad_aligned(SIGNATURES[FUSED_CORPUS])
SIGNATURES[FUSED_HELD_HARD] = SIGNATURES[FUSED_STREAM_HARD]
SIGNATURES[FUSED_HELD_CORPUS] = SIGNATURES[FUSED_STREAM_CORPUS]

# The CUDA entry point of each region.
ENTRIES = {
    GATHER: "bob_row_gather",
    LOSS_HARD: "bob_loss_gradient_hard",
    LOSS_CORPUS: "bob_loss_gradient_corpus",
    ADAMW: "bob_adamw",
    ARGMAX: "bob_greedy_argmax",
    FUSED_HARD: "bob_fused_train_hard",
    FUSED_CORPUS: "bob_fused_train_corpus",
    FUSED_WIDE_HARD: "bob_fused_train_wide_hard",
    FUSED_WIDE_CORPUS: "bob_fused_train_wide_corpus",
    FUSED_TALL_HARD: "bob_fused_train_tall_hard",
    FUSED_TALL_CORPUS: "bob_fused_train_tall_corpus",
    FUSED_STREAM_HARD: "bob_fused_train_stream_hard",
    FUSED_STREAM_CORPUS: "bob_fused_train_stream_corpus",
    FUSED_HELD_HARD: "bob_fused_train_held_hard",
    FUSED_HELD_CORPUS: "bob_fused_train_held_corpus",
    FUSED_CLUSTER_HARD: "bob_fused_train_cluster_hard",
    FUSED_CLUSTER_CORPUS: "bob_fused_train_cluster_corpus",
    HEALTH: "bob_health",
    SCATTER: "bob_scatter",
    LOSS_ONLY_CORPUS: "bob_loss_corpus",
    **{name: name.replace("-", "_") for name in COLLAPSED_REGIONS},
}


def declared_region(name: str, code: bytes = b"", registers: int = 32,
                    shared_bytes: int = 0, block_x: int | None = None,
                    dynamic_shared_bytes: int = 0) -> Region:
    """A region as declared; code and resources (and, for BLOCK_FROM_IMAGE, the block) come
    from a compiled image when there is one."""
    return Region(
        name=name,
        code=code,
        registers=registers,
        block_x=block_of(name) if block_x is None else block_x,
        shared_bytes=shared_bytes,
        params=SIGNATURES[name],
        entry=ENTRIES[name],
        dynamic_shared_bytes=dynamic_shared_bytes,
        cluster_slices=CLUSTER_SLICES.get(name),
    )


def shared_rest(target: Target, static_bytes: int) -> int:
    """The dynamic shared memory a SHARED_REST region asks for: what the target allows a
    block beyond the image's static bytes, in whole KiB."""
    return max(0, (target.max_shared_bytes_per_block - static_bytes) // 1024 * 1024)
