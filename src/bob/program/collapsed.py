"""Bob's program over collapsed tables: a rest class per row and its exception columns.

The dense program's schedules and records with tables of classes in place of V x V ones
(``bob.records.collapsed``): the parameters, both moments and the gradients are
f32[V + K] (class r < V is row r's rest, class V + i exception i), indexed by
``row_offsets`` u32[V + 1], ``columns`` u32[K] and ``lane_order`` u32[K] (each row's
exceptions by lane of the reductions, then column), which the host writes with the
tables. The input record is the dense program's (hard targets, or the corpus's sparse
pairs); corpus weights are f32[K], one per exception (the rest's is 0), scattered from the
pairs by ``bob-collapsed-scatter`` (every pair's column is an exception: the host makes
the index from the data), and likewise the validation weights.

Launches, in the dense program's order and counts:

- loads (corpus): the scatters into ``weights`` and ``validation_weights``;
- forward: the initial loss, the validation loss of the starting table, per prompt the
  expanded row's gather and its greedy argmax (the dense ``bob-greedy-argmax``);
- training, ``seed``: per update ``bob-adamw`` over the 1 x (V + K) classes, then the
  collapsed loss-gradient; ``fused``: one ``bob-collapsed-fused-train`` launch runs all N
  updates (the classes are a few bytes a row: they stay on chip);
- the health check over the classes, the validation loss of the trained table, the
  predictions again.

Every launch leaves in every row the bytes the dense program leaves in the expanded row
(ARITHMETIC.md, "Collapsed tables").
"""

from __future__ import annotations

import math

from bob.config import Hyper
from bob.kernels import signatures as sig
from bob.plan.model import (
    Dim3,
    LaunchSpec,
    ProgramSpec,
    Region,
    Scalar,
    Target,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import SM86
from bob.program.bob import (
    ADAM_SCALAR_STRIDE,
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    LN2_BITS,
    LOG2E_BITS,
    PAIR_BYTES,
    VALIDATION_INITIAL_LOSS,
    VALIDATION_INPUT,
    VALIDATION_LOSS,
    VALIDATION_WEIGHTS,
    WEIGHTS_TENSOR,
    BobConfig,
    adamw_grid,
    adamw_scalar_arguments,
    health_grid,
    inverse_rows_bits,
    program_attributes,
    scatter_grid,
    submission_schedule,
)

# The index a collapsed table's kernels read, written by the host with the tables (in
# arena order after the seed's tensors, so those keep their places).
INDEX_TENSORS = ("row_offsets", "columns", "lane_order")


def tensor_specs(config: BobConfig) -> tuple[TensorSpec, ...]:
    """The dense program's tensors with tables of V + K classes, then the index."""
    v, p, k, classes = config.vocab, config.prompts, config.exceptions, config.classes
    seed = (
        TensorSpec("parameters", "f32", (classes,)),
        TensorSpec("first_moment", "f32", (classes,)),
        TensorSpec("second_moment", "f32", (classes,)),
        TensorSpec("gradients", "f32", (classes,)),
        TensorSpec("input", "u8", (config.input_bytes,)),
        TensorSpec("initial_loss", "f32", (v,)),
        TensorSpec("training_loss", "f32", (v,)),
        TensorSpec("logit_rows", "f32", (p, v)),
        TensorSpec("predictions", "u32", (p,)),
    )
    index = (TensorSpec("row_offsets", "u32", (v + 1,)), TensorSpec("columns", "u32", (k,)),
             TensorSpec("lane_order", "u32", (k,)))
    scalars = () if config.schedule == "seed" else (
        TensorSpec(ADAM_SCALARS_TENSOR, "f32", (config.updates, ADAM_SCALAR_STRIDE)),)
    weights = () if config.mode == "hard" else (TensorSpec(WEIGHTS_TENSOR, "f32", (k,)),)
    validation = () if not config.validates else (
        TensorSpec(VALIDATION_INPUT, "u8", (PAIR_BYTES * config.validation_pairs,)),
        TensorSpec(VALIDATION_WEIGHTS, "f32", (k,)),
        TensorSpec(VALIDATION_INITIAL_LOSS, "f32", (v,)),
        TensorSpec(VALIDATION_LOSS, "f32", (v,)),
    )
    health = TensorSpec(HEALTH_TENSOR, "u32", (len(sig.HEALTH_COUNTS), 2))
    return (*seed, *index, *scalars, *weights, *validation, health)


def declared_regions(config: BobConfig, compiled: dict[str, Region] | None = None,
                     ) -> tuple[Region, ...]:
    """The gather, the loss, AdamW or the fused region, the argmax, the health check; then
    in corpus mode the scatter and, with validation, the loss alone."""
    training = sig.ADAMW if config.schedule == "seed" else (
        sig.COLLAPSED_FUSED_HARD if config.mode == "hard" else sig.COLLAPSED_FUSED_CORPUS)
    names = (sig.COLLAPSED_GATHER, config.loss_region, training, sig.ARGMAX,
             sig.COLLAPSED_HEALTH)
    if config.load_launches:
        names += (sig.COLLAPSED_SCATTER,)
    if config.validates:
        names += (sig.COLLAPSED_LOSS_ONLY,)
    compiled = compiled or {}
    return tuple(compiled.get(name) or sig.declared_region(name) for name in names)


def row_grid(vocab: int) -> int:
    """Blocks of the loss kernels: a warp per row, COLLAPSED_ROWS_PER_BLOCK rows a block."""
    return math.ceil(vocab / sig.COLLAPSED_ROWS_PER_BLOCK)


def build_program(config: BobConfig, target: Target = SM86, hyper: Hyper = Hyper(),
                  first_step: int = 1, compiled: dict[str, Region] | None = None,
                  ) -> ProgramSpec:
    """The collapsed program for `target`; update k's AdamW scalars are those of step
    first_step + k (in the AdamW launches, or the ``adam_scalars`` rows the host writes)."""
    if not config.collapsed:
        raise ValueError("a dense configuration: bob.program.bob.build_program builds it")
    v, block = config.vocab, Dim3(sig.BLOCK)
    regions = declared_regions(config, compiled)
    sizes = (Scalar.u32(v), Scalar.u32(config.exceptions), Scalar.u32(config.classes),
             Scalar.u32(v + 1))
    index = tuple(TensorRef(name) for name in INDEX_TENSORS)
    log2e, ln2 = Scalar.f32_bits(LOG2E_BITS), Scalar.f32_bits(LN2_BITS)
    inverse = (Scalar.f32_bits(inverse_rows_bits(v)),) if config.mode == "hard" else ()
    targets = TensorRef("input" if config.mode == "hard" else WEIGHTS_TENSOR)
    rows = Dim3(row_grid(v))

    def loss(into: str) -> LaunchSpec:
        return LaunchSpec(config.loss_region, rows, block, (
            TensorRef("parameters"), TensorRef("gradients"), targets, TensorRef(into),
            *index, log2e, ln2, *inverse, *sizes), f"loss->{into}")

    def scatter(table: str, pairs: str, count: int) -> LaunchSpec:
        return LaunchSpec(sig.COLLAPSED_SCATTER, Dim3(scatter_grid(count)), block, (
            TensorRef(table), TensorRef(pairs), TensorRef(pairs, 8 * count), *index[:2],
            Scalar.u32(count), *sizes), f"scatter->{table}")

    def validation_loss(into: str) -> LaunchSpec:
        return LaunchSpec(sig.COLLAPSED_LOSS_ONLY, rows, block, (
            TensorRef("parameters"), TensorRef(VALIDATION_WEIGHTS), TensorRef(into), *index,
            log2e, ln2, *sizes), f"validation->{into}")

    def predict(i: int) -> tuple[LaunchSpec, LaunchSpec]:
        row = TensorRef("logit_rows", 4 * v * i)
        gather = LaunchSpec(sig.COLLAPSED_GATHER, Dim3(1), block, (
            row, TensorRef("input", config.input_targets_bytes + 4 * i),
            TensorRef("parameters"), *index, *sizes), f"gather[{i}]")
        argmax = LaunchSpec(sig.ARGMAX, Dim3(1), block, (
            TensorRef("predictions", 4 * i), row, Scalar.u32(v)), f"argmax[{i}]")
        return gather, argmax

    adamw_pointers = (TensorRef("parameters"), TensorRef("gradients"),
                      TensorRef("first_moment"), TensorRef("second_moment"))

    def adamw(k: int, scalars: tuple[Scalar, ...]) -> LaunchSpec:
        # The classes as one row of V + K columns (both u32).
        return LaunchSpec(sig.ADAMW, Dim3(adamw_grid(config.classes)), block, (
            *adamw_pointers, *scalars, Scalar.u32(1), Scalar.u32(config.classes),
        ), f"adamw[{k}]")

    def fused() -> LaunchSpec:
        region = config.fused_region(target)
        return LaunchSpec(region, rows, block, (
            TensorRef("parameters"), TensorRef("first_moment"), TensorRef("second_moment"),
            TensorRef("gradients"), targets, TensorRef("training_loss"),
            TensorRef(ADAM_SCALARS_TENSOR), *index, log2e, ln2, *inverse, *sizes,
            Scalar.u32(config.updates), Scalar.u32(1)), f"fused[0:{config.updates}]")

    def health() -> LaunchSpec:
        tables = tuple(TensorRef(name) for name in sig.HEALTH_COUNTS)
        return LaunchSpec(sig.COLLAPSED_HEALTH, Dim3(health_grid(config.classes)), block,
                          (*tables, TensorRef(HEALTH_TENSOR), Scalar.u32(config.classes)),
                          "health")

    launches: list[LaunchSpec] = []
    if config.load_launches:
        launches.append(scatter(WEIGHTS_TENSOR, "input", config.pairs))
    if config.validates:
        launches.append(scatter(VALIDATION_WEIGHTS, VALIDATION_INPUT, config.validation_pairs))
    launches.append(loss("initial_loss"))
    if config.validates:
        launches.append(validation_loss(VALIDATION_INITIAL_LOSS))
    for i in range(config.prompts):
        launches.extend(predict(i))
    if config.schedule == "seed":
        scalars = adamw_scalar_arguments(hyper, first_step, config.updates)
        training_loss = loss("training_loss")
        for k in range(config.updates):
            launches.extend((adamw(k, scalars[k]), training_loss))
    elif config.updates:
        launches.append(fused())
    if config.health_launches:
        launches.append(health())
        if config.validates:
            launches.append(validation_loss(VALIDATION_LOSS))

    return ProgramSpec(
        regions=regions,
        tensors=tensor_specs(config),
        launches=tuple(launches),
        submissions=submission_schedule(config, target),
        forward_launches=config.forward_launches,
        forward_submissions=config.forward_submissions,
        submission_policy=config.submission,
        attributes=program_attributes(config, first_step),
    )
