"""Bob's configuration facts, kept once: every layer and the command line read them here.

Ground floor: it imports only ``bob.errors``. The program, the records, the
host and the CLI take their names, limits and rules from this module; the CLI's
choices are these tuples, never literals of their own (the backends' names are the
backend registry's, ``bob.backends.registry``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from numbers import Real
from typing import Literal

from bob.errors import BadInput

# -- the program's shape ----------------------------------------------------------
Mode = Literal["hard", "corpus"]
MODES: tuple[Mode, ...] = ("hard", "corpus")  # a mode's index is its code in a record
Schedule = Literal["seed", "fused"]
SCHEDULES: tuple[Schedule, ...] = ("seed", "fused")
# What `bob train` and the API ask for: a schedule, or "auto", the fused schedule wherever
# Bob has fused kernels for the run, else the seed's (bob.backends.resolve_schedule). A plan
# (BobConfig) always names one of SCHEDULES: auto is resolved before it is built.
SCHEDULE_CHOICES: tuple[str, ...] = ("auto", *SCHEDULES)
AUTO_SCHEDULE = "auto"
# How a plan's launches reach the device. per-launch (the seed's, the reference):
# every launch its own submission, dispatched by the pushbuffer, each with its own
# semaphore release. chained: consecutive launches of one submission are linked in
# the command stream (each QMD schedules the next when it completes), one
# semaphore release per submission. A plan's default stays per-launch: the
# reference, and the policy of every backend that runs launches in order whatever
# their grouping (cpu, cuda).
SubmissionPolicy = Literal["per-launch", "chained"]
SUBMISSION_POLICIES: tuple[SubmissionPolicy, ...] = ("per-launch", "chained")
DEFAULT_SUBMISSION_POLICY: SubmissionPolicy = "per-launch"
# What the command line and the API ask for: a policy, or "auto", the chosen backend's
# own default (bob.backends.resolve_submission: chained on the backends that run Bob's
# command stream, where it is the faster policy).
SUBMISSION_CHOICES: tuple[str, ...] = ("auto", *SUBMISSION_POLICIES)
AUTO_SUBMISSION = "auto"

MIN_VOCAB = 2  # a softmax over one column learns nothing
MAX_VOCAB = 65536  # 16 GiB f32 tables: every size and offset is 64-bit
MAX_PROMPTS = 4096
MAX_UPDATES = 100_000
# A sparse corpus input's pairs: the scatter counts them in a u32, and 2^31 of them (24 GiB
# of keys and values) is past any corpus's distinct pairs at V = 65536.
MAX_PAIRS = 1 << 31

# The arena's first three tensors, in arena order: what a checkpoint holds.
CHECKPOINT_TENSORS = ("parameters", "first_moment", "second_moment")
# The result record's tensors, in arena order: what every invocation reads back.
RESULT_TENSORS = ("initial_loss", "training_loss", "logit_rows", "predictions")

# -- where a plan runs -----------------------------------------------------------
TARGET_NAMES = ("sm_86", "sm_90")  # the parameter-block layouts a plan is placed for
DEFAULT_TARGET = "sm_90"  # the nv-sim backend's default: the H200's architecture
ARENA_KINDS = ("device", "host")  # cuda and nv: arena in device memory or mapped host memory
# Whose machine code the seed's regions run: NVRTC's (compiled from bob_kernels.cu, the
# default) or Bob's own (bob.kernels.own, encoded by bob.isa; nv and nv-sim, seed schedule).
KERNELS = ("nvrtc", "own")
DEFAULT_KERNELS = "nvrtc"
# The backends' names, and which of them run Bob's command stream, are the backend
# registry's (bob.backends.registry): this floor knows no backend.



def require_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """BadInput naming `name` and its choices unless `value` is one of them."""
    if value not in choices:
        raise BadInput(f"{name} must be one of {', '.join(choices)}, not {value!r}")


# -- AdamW -----------------------------------------------------------------------
@dataclass(frozen=True)
class Hyper:
    """AdamW hyperparameters (torch.optim.AdamW's names and defaults, but lr).

    One rule set, checked on construction wherever the values come from (the
    command line, the API, a checkpoint's metadata): every value a finite real
    number, lr > 0 (lr 0 never moves the table), 0 <= beta < 1 (beta 1 freezes a
    moment and its bias correction divides by zero), eps > 0 (the update divides
    by sqrt(v) + eps, and v is 0 where a gradient has been 0), weight_decay >= 0.
    As in torch, lr * weight_decay above 1 is allowed: a run that diverges stops
    with a non-finite loss and keeps its last good checkpoint.
    """

    lr: float = 0.1  # a bigram table tolerates a large step; 1000 updates reach the optimum
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        for name in HYPER_FIELDS:
            problem = _hyper_problem(name, getattr(self, name))
            if problem:
                raise BadInput(f"{name} = {getattr(self, name)!r} {problem}")


def _hyper_problem(name: str, value: object) -> str | None:
    """What is wrong with one hyperparameter's value, or None."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        return "is not a finite number"
    if name in ("beta1", "beta2"):
        return None if 0 <= value < 1 else "is outside [0, 1)"
    if value < 0:
        return "is negative"
    if value == 0 and name in ("lr", "eps"):
        return "is zero (it must be positive)"
    return None


HYPER_FIELDS = tuple(f.name for f in fields(Hyper))
