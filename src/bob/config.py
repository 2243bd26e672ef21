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

# The distribution's name on the package index ("bob" there is another project): what
# `pip install` takes, with an extra: pip install 'bob-bigram[cuda]'. The command and the
# import stay `bob`.
DISTRIBUTION = "bob-bigram"

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
# Collapsed tables (a rest class per row and the data's columns) reach V = 2^20: Llama 3's
# 128256, Gemma's 256000. Pair keys (prev * V + next) and data digests are then 64-bit.
MAX_VOCAB = 1 << 20
# Dense V x V tables stop here: 16 GiB f32 each, every size and offset already 64-bit.
MAX_DENSE_VOCAB = 65536
# How a table is held: dense (V x V, the seed's program and the reference) or collapsed
# (one rest class per row and its exception columns); "auto" chooses from the data.
Tables = Literal["dense", "collapsed"]
TABLES: tuple[Tables, ...] = ("dense", "collapsed")
TABLES_CHOICES: tuple[str, ...] = ("auto", *TABLES)
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
# Whose machine code the plan's regions run: NVRTC's (compiled from bob_kernels.cu, the
# default) or Bob's own (bob.kernels.own, encoded by bob.isa; nv and nv-sim, the plans it
# covers: bob.kernels.own_regions.coverage_refusal).
KERNELS = ("nvrtc", "own")
DEFAULT_KERNELS = "nvrtc"
# The backends' names, and which of them run Bob's command stream, are the backend
# registry's (bob.backends.registry): this floor knows no backend.



def require_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """BadInput naming `name` and its choices unless `value` is one of them."""
    if value not in choices:
        raise BadInput(f"{name} must be one of {', '.join(choices)}, not {value!r}")


def require_dense_vocab(vocab: int, what: str, element_bytes: int) -> None:
    """BadInput, one line naming the bytes a V x V array of `what` would need, where V is
    past MAX_DENSE_VOCAB: above it only sparse and collapsed forms exist, never V x V."""
    if vocab > MAX_DENSE_VOCAB:
        need = vocab * vocab * element_bytes
        raise BadInput(f"{what} at V={vocab} would be a V x V array of {need:,} bytes "
                       f"({need / (1 << 30):,.0f} GiB); dense tables go up to "
                       f"V={MAX_DENSE_VOCAB}")


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
    # The learning-rate schedule, nanoGPT's get_lr (`lr_at`): lr rises linearly over the
    # first warmup_steps updates, then falls along a cosine to min_lr at lr_decay_steps and
    # stays there. 0 and None: lr throughout (the device program is the same either way:
    # the host writes every update's scalars).
    warmup_steps: int = 0
    lr_decay_steps: int | None = None  # None: no decay (after any warmup, lr)
    min_lr: float | None = None  # with lr_decay_steps; None there: lr / 10, nanoGPT's ratio

    def __post_init__(self) -> None:
        for name in HYPER_FIELDS:
            problem = _hyper_problem(name, getattr(self, name))
            if problem:
                raise BadInput(f"{name} = {getattr(self, name)!r} {problem}")
        problem = self._schedule_problem()
        if problem:
            raise BadInput(problem)
        if self.lr_decay_steps is not None and self.min_lr is None:
            object.__setattr__(self, "min_lr", self.lr / 10)

    def _schedule_problem(self) -> str | None:
        """What is wrong with the schedule's fields (named as the command line names them)."""
        for name in ("warmup_steps", "lr_decay_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_SCHEDULE_STEP):
                return (f"--{name.replace('_', '-')} {value!r} is not a whole number of "
                        f"updates in [0, 2**53]")
        decay, warmup = self.lr_decay_steps, self.warmup_steps
        if decay is not None and decay <= warmup:
            return (f"--lr-decay-steps {decay} is not past --warmup-steps {warmup}: the cosine "
                    "decay runs from the end of the warmup to it")
        if self.min_lr is None:
            return None
        if decay is None:
            return "--min-lr is where the cosine decay ends: it needs --lr-decay-steps"
        if isinstance(self.min_lr, bool) or not isinstance(self.min_lr, Real) \
                or not math.isfinite(self.min_lr) or self.min_lr < 0:
            return f"--min-lr {self.min_lr!r} is not a finite number >= 0"
        if self.min_lr > self.lr:
            return (f"--min-lr {self.min_lr:g} is above --lr {self.lr:g}: the decay would "
                    "raise the learning rate")
        return None

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes from update to update."""
        return self.warmup_steps > 0 or self.lr_decay_steps is not None

    def lr_at(self, step: int) -> float:
        """The learning rate of global update `step` (from 1), in float64: nanoGPT's
        get_lr(it) for it = step - 1 (its first iteration is Bob's update 1), with
        warmup_iters = warmup_steps, lr_decay_iters = lr_decay_steps (None: no decay) and
        min_lr, evaluated as it evaluates it (math.cos), so the AdamW scalars follow."""
        if not self.scheduled:
            return self.lr
        it = step - 1
        if it < self.warmup_steps:
            return self.lr * (it + 1) / (self.warmup_steps + 1)
        if self.lr_decay_steps is None:
            return self.lr
        assert self.min_lr is not None  # set with lr_decay_steps
        if it > self.lr_decay_steps:
            return self.min_lr
        decay_ratio = (it - self.warmup_steps) / (self.lr_decay_steps - self.warmup_steps)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return self.min_lr + coeff * (self.lr - self.min_lr)


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


# AdamW's own five; the schedule's fields are optional beside them in every file.
SCHEDULE_FIELDS = ("warmup_steps", "lr_decay_steps", "min_lr")
HYPER_FIELDS = tuple(f.name for f in fields(Hyper) if f.name not in SCHEDULE_FIELDS)
MAX_SCHEDULE_STEP = 1 << 53  # the largest step a checkpoint holds
