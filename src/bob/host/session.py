"""The host: turns requests into certified plans, runs them, keeps the records.

One invocation = one plan run on one backend:

1. build the plan for (V, P, N, mode) and certify it (refusing it otherwise);
2. load the checkpoint (parameters, both moments) and the input payload into
   the arena;
3. write each update's AdamW scalars (global step t = checkpoint step + k + 1):
   into that update's parameter block (seed schedule), or as the rows of the
   ``adam_scalars`` tensor (fused schedule);
4. submit: the forward submissions only (predict) or all of them (train);
5. read back the result record, the health check's counts (24 bytes: is every
   table still finite?) and the new checkpoint.

Long training runs as several invocations, a checkpoint after each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from bob.backends import Backend, BackendChoice
from bob.errors import NonFiniteLoss
from bob.plan.certificate import require_certified
from bob.plan.model import Plan, Scalar
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    BobConfig,
    Hyper,
    adam_scalar_table,
    build_plan,
)
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import Checkpoint

Operation = Literal["predict", "train"]


@dataclass(frozen=True)
class Invocation:
    """What one invocation produced."""

    checkpoint: Checkpoint
    result: ResultRecord
    initial_loss: float  # the objective before the first update
    loss: float  # the objective after the last update (the initial loss when predicting)


def _bytes_view(array: np.ndarray) -> np.ndarray:
    """A flat byte view of a table, so writing it to the arena copies it once."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class Session:
    """A backend with the plans it has opened, reused across invocations."""

    def __init__(self, choice: BackendChoice, hyper: Hyper = Hyper()):
        self.choice = choice
        self.hyper = hyper
        self._open: dict[BobConfig, tuple[Plan, Backend]] = {}
        self.last_backend: Backend | None = None  # the arena of the latest invocation

    def plan_for(self, config: BobConfig) -> Plan:
        return self._backend_for(config)[0]

    def _backend_for(self, config: BobConfig) -> tuple[Plan, Backend]:
        if config not in self._open:
            plan = build_plan(config, self.choice.target, self.hyper,
                              compiled=self.choice.regions)
            certified = require_certified(plan)  # once: the backend takes it as certified
            self._open[config] = (plan, self.choice.open(certified))
        return self._open[config]

    def close(self) -> None:
        for _, backend in self._open.values():
            backend.close()
        self._open.clear()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def invoke(self, config: BobConfig, checkpoint: Checkpoint, record: InputRecord,
               operation: Operation) -> Invocation:
        if operation == "predict":
            config = replace(config, updates=0)
        plan, backend = self._backend_for(config)
        self.last_backend = backend
        self.load(backend, checkpoint, record)
        self.write_update_scalars(config, backend, checkpoint.step + 1)
        submissions = plan.submission_count if operation == "train" else plan.forward_submissions
        backend.run(range(submissions))
        return self.collect(config, backend, checkpoint, operation)

    def write_update_scalars(self, config: BobConfig, backend: Backend, first_step: int) -> None:
        """Update k's AdamW scalars, for global step first_step + k, where the plan reads them."""
        if config.schedule == "fused":
            table = adam_scalar_table(self.hyper, first_step, config.updates)
            backend.write_tensor(ADAM_SCALARS_TENSOR, table.tobytes())
            return
        # The same table, its rows patched into each update's AdamW parameter block.
        bits = adam_scalar_table(self.hyper, first_step, config.updates).view(np.uint32)
        for k, row in enumerate(bits.tolist()):
            backend.set_scalars(config.adamw_launch(k), {
                name: Scalar("f32", word) for name, word in zip(ADAM_SCALAR_NAMES, row,
                                                                 strict=False)})

    @staticmethod
    def load(backend: Backend, checkpoint: Checkpoint, record: InputRecord) -> None:
        backend.write_tensor("parameters", _bytes_view(checkpoint.parameters))
        backend.write_tensor("first_moment", _bytes_view(checkpoint.first_moment))
        backend.write_tensor("second_moment", _bytes_view(checkpoint.second_moment))
        backend.write_tensor("input", record.payload())
        # Not every request writes every block: clear what could be stale.
        # health is added to, never overwritten, by the health check (atomics on a GPU).
        for name in ("gradients", "training_loss", HEALTH_TENSOR):
            backend.write_tensor(name, bytes(backend.plan.tensor(name).bytes))

    def collect(self, config: BobConfig, backend: Backend, checkpoint: Checkpoint,
                operation: Operation) -> Invocation:
        v = config.vocab

        def table(name: str) -> np.ndarray:
            # read-only over the bytes read back: no second copy of a large table
            return np.frombuffer(backend.read_tensor(name), np.float32).reshape(v, v)

        result = ResultRecord.from_arena(
            config.mode, v,
            **{name: backend.read_tensor(name)
               for name in ("initial_loss", "training_loss", "logit_rows", "predictions")})
        initial = result.initial_objective
        if operation == "predict" or config.updates == 0:
            return Invocation(checkpoint, result, initial, initial)
        final = result.training_objective
        if not (math.isfinite(final) and math.isfinite(initial)):
            raise NonFiniteLoss(
                f"the loss became non-finite ({final}) by step {checkpoint.step + config.updates};"
                " the last good checkpoint is kept (try a smaller --lr)")
        require_finite_tables(backend, checkpoint.step + config.updates)
        trained = replace(
            checkpoint,
            parameters=table("parameters"),
            first_moment=table("first_moment"),
            second_moment=table("second_moment"),
            step=checkpoint.step + config.updates,
        )
        return Invocation(trained, result, initial, final)


def require_finite_tables(backend: Backend, step: int) -> None:
    """Raise NonFiniteLoss unless the health check counted no non-finite element in the
    parameters or either moment: 24 bytes read back instead of the three tables."""
    counts = np.frombuffer(backend.read_tensor(HEALTH_TENSOR), np.uint64)
    if counts.any():
        raise NonFiniteLoss(
            f"the table became non-finite by step {step}; the last good checkpoint "
            "is kept (try a smaller --lr)")


def split_updates(steps: int, per_invocation: int) -> list[int]:
    """Updates of each invocation: full ones, then the remainder."""
    if steps < 0 or per_invocation < 1:
        raise ValueError("steps must be >= 0 and updates per invocation >= 1")
    full, rest = divmod(steps, per_invocation)
    return [per_invocation] * full + ([rest] if rest else [])


ProgressCallback = Callable[[Invocation, int], None]


def train(session: Session, config: BobConfig, checkpoint: Checkpoint, record: InputRecord,
          steps: int, after_invocation: ProgressCallback | None = None) -> list[Invocation]:
    """Run `steps` updates as invocations of at most `config.updates` each.

    `after_invocation(invocation, done)` runs after each one (the CLI saves the
    checkpoint and advances its progress bar there).
    """
    invocations = []
    done = 0
    for updates in split_updates(steps, max(1, config.updates)):
        invocation = session.invoke(replace(config, updates=updates), checkpoint, record, "train")
        checkpoint = invocation.checkpoint
        done += updates
        invocations.append(invocation)
        if after_invocation is not None:
            after_invocation(invocation, done)
    return invocations
