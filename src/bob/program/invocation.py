"""What one invocation of Bob's program moves between the host and the arena.

The program (``bob.program.bob``) declares the tensors; this module says which of them
the host writes, clears and reads for one invocation of a configuration, so that the
host applies the layout without knowing the schedules:

- a full load writes the checkpoint's tables (``checkpoint``, contiguous in arena
  order) and the input record (``input``), and zeroes ``cleared_on_load``;
- an invocation from the state the arena already holds writes the input only where it
  changed and zeroes ``cleared_when_resident``;
- update k's AdamW scalars (global step t = the first step + k) reach the device as
  ``adam_scalars`` says: the rows of a tensor (fused) or patched into launches (seed);
- a forward invocation reads back the result record (``results``); a training one
  ``training_reads``: the result record, the health counts and the tables.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from bob.config import CHECKPOINT_TENSORS, RESULT_TENSORS
from bob.plan.model import Plan
from bob.program.bob import ADAM_SCALAR_NAMES, ADAM_SCALARS_TENSOR, HEALTH_TENSOR, BobConfig


@dataclass(frozen=True)
class ScalarRows:
    """The AdamW table (``adam_scalar_table``) written whole as the tensor `tensor`: row k
    is update k's scalars."""

    tensor: str


@dataclass(frozen=True)
class ScalarPatches:
    """The AdamW table's first ``len(names)`` columns patched into launches: row k into
    the scalars `names` of launch ``launches[k]`` (one ``set_scalars_many``)."""

    launches: tuple[int, ...]
    names: tuple[str, ...]


@dataclass(frozen=True)
class InvocationLayout:
    """The tensors one invocation of a configuration writes, clears and reads."""

    checkpoint: tuple[str, ...]  # what a checkpoint loads, in arena order
    input: str  # the input record's payload
    # A loaded arena holds nothing of what ran in it before: the training loss (a forward
    # request does not write it), the health counts (the health check adds to them) and the
    # gradients (launch 0 writes them again, but a loaded arena is known before it runs).
    cleared_on_load: tuple[str, ...]
    # From the arena's own state: launch 0 writes every gradient of every request, so only
    # the training loss and the health counts are zeroed.
    cleared_when_resident: tuple[str, ...]
    results: tuple[str, ...]  # the result record, in arena order
    health: str  # the health check's counts of non-finite elements (u64 per table)
    training_reads: tuple[str, ...]  # what a training invocation reads back
    adam_scalars: ScalarRows | ScalarPatches | None  # None: no update, no scalars

    def reads(self, trains: bool) -> tuple[str, ...]:
        """What settling an invocation needs: `training_reads` when it made updates."""
        return self.training_reads if trains else self.results


@functools.lru_cache(maxsize=64)
def invocation_layout(config: BobConfig) -> InvocationLayout:
    """The layout of one invocation of `config`'s plan."""
    trains = config.updates > 0
    adam_scalars: ScalarRows | ScalarPatches | None = None
    if trains and config.schedule == "fused":
        adam_scalars = ScalarRows(ADAM_SCALARS_TENSOR)
    elif trains:
        adam_scalars = ScalarPatches(
            tuple(config.adamw_launch(k) for k in range(config.updates)), ADAM_SCALAR_NAMES)
    return InvocationLayout(
        checkpoint=CHECKPOINT_TENSORS,
        input="input",
        cleared_on_load=("gradients", "training_loss", HEALTH_TENSOR),
        cleared_when_resident=("training_loss", HEALTH_TENSOR),
        results=RESULT_TENSORS,
        health=HEALTH_TENSOR,
        training_reads=(*RESULT_TENSORS, HEALTH_TENSOR, *CHECKPOINT_TENSORS) if trains
        else RESULT_TENSORS,
        adam_scalars=adam_scalars,
    )


def plan_config(plan: Plan) -> BobConfig:
    """The configuration a plan of Bob's program was built for (from its attributes)."""
    if plan.attributes.get("program") != "bob":
        raise ValueError("not a plan of Bob's program: its attributes name no configuration")
    return BobConfig(**{field.name: plan.attributes[field.name]  # type: ignore[arg-type]
                        for field in fields(BobConfig)})
