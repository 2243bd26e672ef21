"""What one invocation of Bob's program moves between the host and the arena.

The program (``bob.program.bob``) declares the tensors; this module says which of them
the host writes, clears and reads for one invocation of a configuration, so that the
host applies the layout without knowing the schedules:

- a full load writes the checkpoint's tables (``checkpoint``, contiguous in arena
  order) and the input record (``input``), and zeroes ``cleared_on_load``;
- an invocation from the state the arena already holds writes the input only where it
  changed and zeroes ``cleared_when_resident``;
- whenever the inputs are written (the corpus input, and the validation input when the
  program validates), the tables their pairs are scattered into (``input_tables``) are
  zeroed and the first ``load_submissions`` submissions run (the scatters); otherwise
  the invocation starts past them;
- update k's AdamW scalars (global step t = the first step + k) reach the device as
  ``adam_scalars`` says: the rows of a tensor (fused) or patched into launches (seed);
- a forward invocation reads back the result record (``results``) and the validation
  losses; a training one also the health counts (``training_reads``), and the tables
  (``checkpoint``) when its state is wanted on the host.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from bob.config import CHECKPOINT_TENSORS, RESULT_TENSORS
from bob.plan.model import Plan
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    VALIDATION_INITIAL_LOSS,
    VALIDATION_INPUT,
    VALIDATION_LOSS,
    VALIDATION_WEIGHTS,
    WEIGHTS_TENSOR,
    BobConfig,
)
from bob.program.collapsed import INDEX_TENSORS


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
    # What a training invocation reads back besides the tables: the result record, the
    # validation losses, the health counts.
    training_reads: tuple[str, ...]
    adam_scalars: ScalarRows | ScalarPatches | None  # None: no update, no scalars
    # The validation input's tensor, None when the program does not validate.
    validation_input: str | None = None
    # The tables the load launches scatter the inputs' pairs into: zeroed first, since a
    # scatter writes only the cells it has pairs for.
    input_tables: tuple[str, ...] = ()
    load_submissions: int = 0  # the first submissions: the scatters (corpus mode)
    # The validation losses of the starting and of the trained table (row losses), or None.
    validation_losses: tuple[str, str] | None = None
    # What a load writes beside the tables from the starting point itself (its attributes
    # of these names): a collapsed table's index. Never read back: no launch writes it.
    index: tuple[str, ...] = ()

    def reads(self, trains: bool, tables: bool = True) -> tuple[str, ...]:
        """What settling an invocation needs: with updates `training_reads`, and the tables
        when `tables` (its state is wanted on the host); else the result record and the
        validation losses."""
        if not trains:
            return (*self.results, *(self.validation_losses or ()))
        return (*self.training_reads, *(self.checkpoint if tables else ()))


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
    validation = (VALIDATION_INITIAL_LOSS, VALIDATION_LOSS) if config.validates else None
    health = (HEALTH_TENSOR,) if trains else ()  # no health check runs without updates
    input_tables = () if config.mode == "hard" else (WEIGHTS_TENSOR,)
    if config.validates:
        input_tables += (VALIDATION_WEIGHTS,)
    return InvocationLayout(
        checkpoint=CHECKPOINT_TENSORS,
        input="input",
        cleared_on_load=("gradients", "training_loss", HEALTH_TENSOR),
        cleared_when_resident=("training_loss", HEALTH_TENSOR),
        results=RESULT_TENSORS,
        health=HEALTH_TENSOR,
        training_reads=(*RESULT_TENSORS, *(validation or ()), *health),
        adam_scalars=adam_scalars,
        validation_input=VALIDATION_INPUT if config.validates else None,
        input_tables=input_tables,
        load_submissions=config.load_submissions,
        validation_losses=validation,
        index=INDEX_TENSORS if config.collapsed else (),
    )


def plan_config(plan: Plan) -> BobConfig:
    """The configuration a plan of Bob's program was built for (from its attributes)."""
    if plan.attributes.get("program") != "bob":
        raise ValueError("not a plan of Bob's program: its attributes name no configuration")
    # Plans of dense tables name no layout (plans made before collapsed tables too).
    optional = {"rows", "tables", "exceptions"}
    values = {field.name: plan.attributes[field.name] for field in fields(BobConfig)
              if field.name not in optional}
    values.update({name: plan.attributes[name] for name in ("tables", "exceptions")
                   if name in plan.attributes})
    rows = plan.attributes.get("rows")  # "first:last" in a shard's plan, else absent
    if isinstance(rows, str):
        values["rows"] = tuple(int(part) for part in rows.split(":"))
    return BobConfig(**values)  # type: ignore[arg-type]
