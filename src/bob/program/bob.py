"""Bob's device program: the seed's regions, tensors and schedules.

For a configuration (V, P, N, mode, schedule; in corpus mode K pairs, and K_val
validation pairs where validation runs on the device) the program is:

- the load launches, corpus mode only: ``bob-scatter`` writes the input's K sparse
  weights (keys row * V + column and binary32 values, as the host computed them) into
  the ``weights`` table, and a second one the validation input's into
  ``validation_weights``; the host clears both tables first and runs these launches only
  when it has written the inputs (they are the first submissions, ``load_submissions``);
- the forward launches: the initial loss (loss-gradient into ``initial_loss``), with
  validation the validation loss of the starting table (``bob-loss-corpus`` into
  ``validation_initial_loss``), then per prompt i: gather its logits row, then its
  greedy argmax;
- the N training updates, by schedule (a configuration names one; a training run's
  ``auto`` is resolved before, by ``bob.backends.resolve_schedule``):

  - ``seed`` (the default and the reference): per update k, AdamW with update
    k's scalars (in its parameter block), then loss-gradient into
    ``training_loss`` (leaving the next gradients in ``gradients``);
  - ``fused``: the fused region (``bob-fused-train``, or its corpus twin) runs
    AdamW then the loss-gradient of each row, block by block, with update k's
    scalars read from the ``adam_scalars`` tensor (the host writes it each
    invocation). Rows are independent, so a block can run many updates of its
    row without any grid-wide synchronization. For V <= ONE_LAUNCH_MAX_VOCAB
    (8192) one launch runs all N updates; past it, where the held kernels keep
    the row's w in shared memory, each launch runs up to HELD_UPDATES_PER_LAUNCH
    (32) of them; otherwise one streaming launch per update reads and writes each
    parameter and both moments once. Only the last launch writes the gradients
    and the training loss. After the invocation
    every tensor the seed schedule has holds the seed schedule's bytes;

- when N > 0, the health check (``bob-health``): each table's count of
  non-finite elements added into ``health``, so the host reads 24 bytes, not
  the tables, to know whether training stayed finite; then, with validation, the
  validation loss of the trained table (into ``validation_loss``);

- then the prediction launches again, so the prompts are predicted from the
  trained table. How launches are grouped into submissions is the submission
  policy (``BobConfig.submission``):

  - ``per-launch`` (the default and the reference): every launch submitted
    alone with its own semaphore value; a forward-only request (predict) runs
    the first F submissions (from L, past the loads, when the inputs are in place);
  - ``chained``: one submission for the load launches (when L > 0), one for the
    forward launches, one for the training launches (when N > 0), one for the
    predictions again (when P > 0); the command stream links the launches of a
    submission, so the device runs each submission without the host.

Derived figures (L = 1 + X load launches in corpus mode, 0 in hard mode, X = 1 with
validation; F = L + 1 + X + 2P forward launches, the loads included; the training
launches T count the health check and the validation loss, H = 1 + X if N > 0 else 0):

| schedule | training launches T | launches | submissions (per-launch) |
| --- | --- | --- | --- |
| seed | 2N + H | F + T | F + T + 2P |
| fused, V <= ONE_LAUNCH_MAX_VOCAB | 1 + H if N > 0, else 0 | F + T | F + T + 2P |
| fused, larger V held | ceil(N / 32) + H | F + T | F + T + 2P |
| fused, larger V streamed | N + H | F + T | F + T + 2P |

Chained: (1 if L > 0) + 1 + (1 if T > 0) + (1 if P > 0) submissions, the launches
the same (the health check and the validation loss end the training submission).

Program bytes = retained code + launches x parameter block; QMD table bytes =
launches x the target's QMD stride (``Plan.program_bytes``, ``Plan.qmd_table_bytes``).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from bob.config import (
    DEFAULT_SUBMISSION_POLICY,
    MAX_DENSE_VOCAB,
    MAX_PAIRS,
    MAX_PROMPTS,
    MAX_UPDATES,
    MAX_VOCAB,
    MIN_VOCAB,
    MODES,
    SCHEDULES,
    SUBMISSION_POLICIES,
    TABLES,
    Hyper,
    Mode,
    Schedule,
    SubmissionPolicy,
    Tables,
)
from bob.errors import BadInput
from bob.kernels import signatures as sig
from bob.kernels.exact import f32_bits_from_fraction
from bob.plan.model import (
    Dim3,
    LaunchSpec,
    Plan,
    ProgramSpec,
    Region,
    Scalar,
    ScalarParam,
    Submission,
    Target,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import SM86, place

# log2(e) and ln(2) correctly rounded to binary32 (proved in the tests).
LOG2E_BITS = 0x3FB8AA3B
LN2_BITS = 0x3F317218

TENSOR_NAMES = (
    "parameters", "first_moment", "second_moment", "gradients", "input",
    "initial_loss", "training_loss", "logit_rows", "predictions",
)
# The fused schedule's one more tensor, placed after the seed's nine so they keep their
# addresses.
ADAM_SCALARS_TENSOR = "adam_scalars"
# Corpus mode: the V x V weights the loss reads, scattered from the input's sparse pairs
# (keys u64 then values f32: PAIR_BYTES a pair), and with validation its own input, table
# and the validation losses of the starting and the trained table; after the others.
WEIGHTS_TENSOR = "weights"
VALIDATION_INPUT = "validation_input"
VALIDATION_WEIGHTS = "validation_weights"
VALIDATION_INITIAL_LOSS = "validation_initial_loss"
VALIDATION_LOSS = "validation_loss"
PAIR_BYTES = 12
# The corpus-mode tensors beside the seed's, in arena order.
CORPUS_TENSORS = (WEIGHTS_TENSOR, VALIDATION_INPUT, VALIDATION_WEIGHTS, VALIDATION_INITIAL_LOSS,
                  VALIDATION_LOSS)
# The health check's counts: u64[3] (as u32[3][2], little-endian words), one per table of
# sig.HEALTH_COUNTS; placed after every other tensor so theirs keep their addresses.
HEALTH_TENSOR = "health"
# A row of adam_scalars: update k's AdamW scalars in the order of bob-adamw's arguments,
# then one float of padding so a row is 32 bytes.
ADAM_SCALAR_NAMES = ("decay", "beta1", "one_minus_beta1", "beta2", "one_minus_beta2",
                     "step_size", "eps_hat")
ADAM_SCALAR_STRIDE = 8  # floats per row

# The fused schedule runs all N updates in one launch up to this V: each block keeps its
# row on chip (registers up to V = 1024, then L1/L2) for every update. Above, one
# streaming launch per update moves 24 bytes per parameter through DRAM: past 8192 the
# rows of the resident blocks (4 per SM, 96 KiB each at V = 8192) outgrow the L2, so the
# stream kernels take one launch per update. The held kernels (below) keep the row's w
# in shared memory and run each row's updates in turn, so they too run many updates a
# launch: DRAM moves m and v (16 bytes per parameter-update) and w once a launch.
ONE_LAUNCH_MAX_VOCAB = 8192
# A held launch runs at most this many updates. w is read and written once a launch: 8
# bytes per parameter over 32 updates, a quarter of a byte each. A launch then stays far
# inside nv's 30 s without progress even at V = 65536 (the launch-progress word moves
# once a launch), and a long invocation still shows progress launch by launch.
HELD_UPDATES_PER_LAUNCH = 32
# The fused kernels' on-chip rows (bob_kernels.cu: RESIDENT_SLOTS and WIDE_SLOTS x 256).
RESIDENT_VOCAB = 1024
WIDE_VOCAB = 4096
TALL_VOCAB = 8192  # bob_kernels.cu: TALL_VOCAB (TALL_THREADS x TALL_SLOTS)
# Where the tall kernels overtake the streaming narrow ones, per mode (docs/BENCHMARKS.md).
TALL_FROM_VOCAB = {"hard": 4608, "corpus": 5121}
# Past the tall kernels' rows the held ones (w in shared memory, read from DRAM once a
# launch) take any V (a row of V % 4 != 0 moves as float4s from its 16-byte boundary, its
# first and last quads element by element), holding as much of the row as the target's
# shared memory takes and streaming the rest; a corpus row only while it fits whole
# (held_to_vocab): held in part, it runs slower than streamed.
HELD_FROM_VOCAB = TALL_VOCAB + 1
# Past the tall kernels' rows a thread-block cluster may hold a row for all of a launch's
# updates (sig.CLUSTER_SLICES: C CTAs, the fewest whose slices fit the target's shared
# memory), on targets with clusters; the program takes them where they were measured
# ahead of the held and stream kernels (docs/BENCHMARKS.md, "Rows resident in a
# cluster"): corpus rows the held kernels cannot hold whole, and rows of V % 4 != 0 from
# CLUSTER_ODD_FROM_VOCAB (at 32768 the held kernels are ahead; no smaller V was measured).
CLUSTER_FROM_VOCAB = TALL_VOCAB + 1
CLUSTER_ODD_FROM_VOCAB = 32769
# The stream kernels move rows as float4 quads, so a row must start 16 bytes aligned:
# V % 4 == 0 (bob_kernels.cu traps otherwise).
STREAM_QUAD = 4


def held_to_vocab(mode: Mode, target: Target) -> int:
    """The longest row the held kernels take on `target`: any hard row, a corpus row only
    while the target's shared memory holds it whole."""
    if mode == "hard":
        return MAX_DENSE_VOCAB
    # The dynamic shared memory a held block asks for, in floats: the target's opt-in
    # limit less the kernel's own static bytes, in whole KiB (sig.shared_rest). On sm_90
    # (232448 - 22608) // 1024 * 1024 = 208896 bytes, a row of 52224.
    return sig.shared_rest(target, sig.HELD_STATIC_SHARED_BYTES) // 4


def cluster_ctas(mode: Mode, vocab: int, target: Target) -> int | None:
    """The CTAs of the cluster that holds a row of `vocab` on `target`: the fewest (a power
    of two up to the target's cluster limit) whose slices fit the dynamic shared memory a
    cluster CTA asks for (sig.shared_rest of the kernel's static bytes); None where the
    target has no clusters or no cluster holds the row."""
    slices = sig.CLUSTER_SLICES[sig.FUSED_CLUSTER_HARD if mode == "hard"
                                else sig.FUSED_CLUSTER_CORPUS]
    room = sig.shared_rest(target, sig.CLUSTER_STATIC_SHARED_BYTES)
    ctas = 2
    while ctas <= target.max_cluster_ctas and slices.allows(ctas):
        if slices.slice_bytes(vocab, ctas) <= room:
            return ctas
        ctas *= 2
    return None


def typical_pairs(vocab: int) -> int:
    """K for a corpus-mode plan made without a corpus (`bob plan`, `check`, `profile`, the
    benches): 64 successors per previous token, as a text of a few million tokens has,
    every cell of a table smaller than that."""
    return min(vocab * vocab, 64 * vocab)


@dataclass(frozen=True)
class BobConfig:
    vocab: int = 256  # V: one row per previous byte, one column per next byte
    prompts: int = 1  # P: prompts predicted per invocation
    updates: int = 100  # N: AdamW updates per invocation
    mode: Mode = "hard"  # hard targets (the seed's record) or corpus weights
    schedule: Schedule = "seed"  # the seed's launches (the reference), or the fused region
    # Every launch its own submission (the reference), or chained submissions: see the
    # module docstring. The command line and the API ask for the backend's own
    # (bob.backends.registry.resolve_submission).
    submission: SubmissionPolicy = DEFAULT_SUBMISSION_POLICY
    # K, corpus mode only: the distinct (previous, next) pairs of the corpus, whose
    # weights the input carries sparse (the record's `pairs`); hard mode has none.
    pairs: int = 0
    # K_val, corpus mode only: the validation corpus's pairs; 0 runs no validation.
    validation_pairs: int = 0
    # A row shard: the plan trains rows [first, last) of the V x V table only (its tables
    # are (last - first) x V), seed schedule, no prompts, the corpus weights written dense
    # by the host (pairs 0: no scatter) and no health check (the host checks the rows as
    # they stream out to the checkpoint). None: the whole table in one piece.
    rows: tuple[int, int] | None = None
    # How the tables are held: dense V x V (the seed's program, the reference) or collapsed
    # (bob.program.collapsed: a rest class per row and `exceptions` K exception columns,
    # tables of V + K classes).
    tables: Tables = "dense"
    exceptions: int = 0

    def __post_init__(self) -> None:
        if self.rows is not None:  # a plan's attributes carry it as a JSON list
            object.__setattr__(self, "rows", tuple(self.rows))
        # A shard's corpus weights are written dense: it has no pairs to scatter.
        corpus = self.mode == "corpus" and self.rows is None
        # (name, value, low, high, whether the range depends on the mode)
        if self.tables not in TABLES:
            raise BadInput(f"tables must be one of {', '.join(TABLES)}, not {self.tables!r}")
        dense = self.tables == "dense"
        checks = (
            ("vocab", self.vocab, MIN_VOCAB, MAX_DENSE_VOCAB if dense else MAX_VOCAB, False),
            ("prompts", self.prompts, 0, MAX_PROMPTS, False),
            ("updates", self.updates, 0, MAX_UPDATES, False),
            ("pairs", self.pairs, 1 if corpus else 0, MAX_PAIRS if corpus else 0, True),
            ("validation_pairs", self.validation_pairs, 0, MAX_PAIRS if corpus else 0, True),
        )
        if self.mode not in MODES:
            raise BadInput(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        for name, value, low, high, per_mode in checks:
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                where = f" in {self.mode} mode" if per_mode else ""
                raise BadInput(f"{name} must be an integer in [{low}, {high}]{where}, "
                               f"not {value!r}")
        cells = self.vocab * self.vocab
        if self.pairs > cells or self.validation_pairs > cells:
            raise BadInput(f"a V={self.vocab} table has {cells} cells, fewer than the "
                           f"{max(self.pairs, self.validation_pairs)} pairs asked for")
        if self.schedule not in SCHEDULES:
            raise BadInput(f"schedule must be one of {', '.join(SCHEDULES)}, not "
                           f"{self.schedule!r}")
        if self.submission not in SUBMISSION_POLICIES:
            raise BadInput(f"submission must be one of {', '.join(SUBMISSION_POLICIES)}, not "
                           f"{self.submission!r}")
        if self.rows is not None:
            self._check_shard()
        if not dense:
            self._check_collapsed()

    def _check_collapsed(self) -> None:
        """Collapsed tables: one piece, and K exception columns the device indexes with u32
        words (V + K classes)."""
        if self.rows is not None:
            raise BadInput("collapsed tables train in one piece: no row shards")
        top = min(self.vocab * self.vocab, (1 << 32) - 1 - self.vocab)
        if isinstance(self.exceptions, bool) or not isinstance(self.exceptions, int) \
                or not 0 <= self.exceptions <= top:
            raise BadInput(f"exceptions must be an integer in [0, {top}] at V={self.vocab}, "
                           f"not {self.exceptions!r}")

    @property
    def collapsed(self) -> bool:
        return self.tables == "collapsed"

    @property
    def classes(self) -> int:
        """Elements of each table: V x V dense, V + K collapsed."""
        return self.vocab + self.exceptions if self.collapsed else self.vocab * self.vocab

    def _check_shard(self) -> None:
        """A row shard: rows [first, last) inside the table, and only what a shard runs."""
        rows = self.rows
        assert rows is not None
        if not (len(rows) == 2 and all(isinstance(r, int) and not isinstance(r, bool)
                                       for r in rows) and 0 <= rows[0] < rows[1] <= self.vocab):
            raise BadInput(f"rows must be [first, last) with 0 <= first < last <= V="
                           f"{self.vocab}, not {list(rows)!r}")
        if self.schedule != "seed":
            raise BadInput("a row shard runs the seed schedule only, not "
                           f"{self.schedule!r}")
        if self.prompts:
            raise BadInput(f"a row shard predicts no prompts, not {self.prompts}")
        if self.validation_pairs:
            raise BadInput("a row shard computes no validation loss")

    @property
    def shard_rows(self) -> int:
        """R: the rows the plan's tables hold (V for the whole table)."""
        return self.vocab if self.rows is None else self.rows[1] - self.rows[0]

    @property
    def loss_region(self) -> str:
        if self.collapsed:
            return sig.COLLAPSED_LOSS_HARD if self.mode == "hard" else sig.COLLAPSED_LOSS_CORPUS
        return sig.LOSS_HARD if self.mode == "hard" else sig.LOSS_CORPUS

    def fused_region(self, target: Target) -> str:
        """The narrow kernels (rows to 1024 in registers, longer rows streamed), the wide
        ones whose rows up to WIDE_VOCAB stay on chip, the tall ones (a block of 1024
        threads per row) from TALL_FROM_VOCAB up to TALL_VOCAB, past it the held ones (as
        much of the row's w in shared memory as fits, the rest streamed; corpus rows only
        while they fit whole on `target`; any V: a row of V % 4 != 0 moves element by
        element), or, for the other streamed rows with V % 4 == 0, the stream ones (float4
        loads and stores). Before all of those, on a target with clusters, the cluster ones
        where takes_cluster says."""
        hard = self.mode == "hard"
        if self.collapsed:
            return sig.COLLAPSED_FUSED_HARD if hard else sig.COLLAPSED_FUSED_CORPUS
        if self.takes_cluster(target):
            return sig.FUSED_CLUSTER_HARD if hard else sig.FUSED_CLUSTER_CORPUS
        if HELD_FROM_VOCAB <= self.vocab <= held_to_vocab(self.mode, target):
            return sig.FUSED_HELD_HARD if hard else sig.FUSED_HELD_CORPUS
        if RESIDENT_VOCAB < self.vocab <= WIDE_VOCAB:
            return sig.FUSED_WIDE_HARD if hard else sig.FUSED_WIDE_CORPUS
        if TALL_FROM_VOCAB[self.mode] <= self.vocab <= TALL_VOCAB:
            return sig.FUSED_TALL_HARD if hard else sig.FUSED_TALL_CORPUS
        if self.vocab > RESIDENT_VOCAB and self.vocab % STREAM_QUAD == 0:
            return sig.FUSED_STREAM_HARD if hard else sig.FUSED_STREAM_CORPUS
        return sig.FUSED_HARD if self.mode == "hard" else sig.FUSED_CORPUS

    def takes_cluster(self, target: Target) -> bool:
        """Whether a thread-block cluster holds each row (CLUSTER_ODD_FROM_VOCAB's rule):
        a corpus row the held kernels cannot hold whole, or a row of V % 4 != 0 from
        CLUSTER_ODD_FROM_VOCAB, wherever the target has a cluster that holds it."""
        if self.vocab < CLUSTER_FROM_VOCAB or cluster_ctas(self.mode, self.vocab,
                                                             target) is None:
            return False
        if self.mode == "corpus" and self.vocab > held_to_vocab(self.mode, target):
            return True
        return self.vocab % STREAM_QUAD != 0 and self.vocab >= CLUSTER_ODD_FROM_VOCAB

    @property
    def input_targets_bytes(self) -> int:
        """Bytes of the targets (hard: u32[V], a shard's u32[R]) or the sparse weights
        (corpus: keys u64[K], then values f32[K]) at the start of the input."""
        return 4 * self.shard_rows if self.mode == "hard" else PAIR_BYTES * self.pairs

    @property
    def input_bytes(self) -> int:
        return self.input_targets_bytes + 4 * self.prompts

    @property
    def validates(self) -> bool:
        """Whether the program computes a validation loss on the device."""
        return self.validation_pairs > 0

    # -- derived figures (the table in the module docstring) -----------------
    # Those that depend on the fused region take the target: its shared memory decides it.
    @property
    def load_launches(self) -> int:
        """The scatters of the sparse inputs into their tables (corpus mode, one piece)."""
        return 0 if self.mode == "hard" or self.rows is not None else 1 + int(self.validates)

    @property
    def first_prediction(self) -> int:
        """Index of prompt 0's gather: past the loads and the starting losses."""
        return self.load_launches + 1 + int(self.validates)

    @property
    def forward_launches(self) -> int:
        return self.first_prediction + 2 * self.prompts

    def updates_per_fused_launch(self, target: Target) -> int:
        """Updates each fused launch runs (the last may run fewer): all N while V is
        small, up to HELD_UPDATES_PER_LAUNCH where the held kernels keep the row's w in
        shared memory (or a cluster the whole row), else one. A collapsed table's rows are
        their classes: one launch runs all N."""
        if self.vocab <= ONE_LAUNCH_MAX_VOCAB or self.collapsed:
            return self.updates
        if self.fused_region(target) in sig.HELD_ROWS:
            return min(self.updates, HELD_UPDATES_PER_LAUNCH)
        return min(1, self.updates)

    @property
    def health_launches(self) -> int:
        """The health check ends every invocation that trains (a shard's rows are checked
        on the host as they stream out: the kernel counts V x V elements)."""
        return int(self.updates > 0 and self.rows is None)

    @property
    def closing_launches(self) -> int:
        """What ends the training launches: the health check, then the validation loss."""
        return self.health_launches * (1 + int(self.validates))

    def training_launches(self, target: Target) -> int:
        """The updates' launches, then the health check and the validation loss."""
        if self.updates == 0:
            return 0
        if self.schedule == "seed":
            return 2 * self.updates + self.closing_launches
        each = self.updates_per_fused_launch(target)
        return (self.updates + each - 1) // each + self.closing_launches

    def launch_count(self, target: Target) -> int:
        return self.forward_launches + self.training_launches(target)

    def submission_count(self, target: Target) -> int:
        if self.submission == "chained":
            return (self.load_submissions + 1 + int(self.training_launches(target) > 0)
                    + int(self.prompts > 0))
        return self.launch_count(target) + 2 * self.prompts

    @property
    def load_submissions(self) -> int:
        """The first submissions: the load launches, which run only after the inputs were
        written (a request from inputs already in place starts past them)."""
        if self.submission == "chained":
            return int(self.load_launches > 0)
        return self.load_launches

    @property
    def forward_submissions(self) -> int:
        """Submissions a forward-only request (predict) runs, the loads included."""
        return self.load_submissions + 1 if self.submission == "chained" \
            else self.forward_launches

    def adamw_launch(self, k: int) -> int:
        """Index of update k's AdamW launch (k from 0); the seed schedule only."""
        if self.schedule != "seed":
            raise ValueError("the fused schedule has no AdamW launches: its scalars are the "
                             f"{ADAM_SCALARS_TENSOR!r} tensor (adam_scalar_table)")
        if not 0 <= k < self.updates:
            raise IndexError(f"update {k} is outside the {self.updates} updates of a plan")
        return self.forward_launches + 2 * k


def _adam_values(hyper: Hyper, step: int) -> dict[str, float]:
    """AdamW's scalars for global update `step` (from 1) in float64, by ADAM_SCALAR_NAMES."""
    if step < 1:
        raise ValueError(f"AdamW steps count from 1, not {step}")
    correction1 = 1.0 - hyper.beta1**step
    correction2 = 1.0 - hyper.beta2**step
    lr = hyper.lr_at(step)  # hyper.lr itself without a schedule
    return {
        "decay": 1.0 - lr * hyper.weight_decay,
        "beta1": hyper.beta1,
        "one_minus_beta1": 1.0 - hyper.beta1,
        "beta2": hyper.beta2,
        "one_minus_beta2": 1.0 - hyper.beta2,
        "step_size": lr * math.sqrt(correction2) / correction1,
        "eps_hat": hyper.eps * math.sqrt(correction2),
    }


def adam_scalars(hyper: Hyper, step: int) -> dict[str, Scalar]:
    """AdamW's scalars for global update `step` (from 1), computed in float64."""
    values = _adam_values(hyper, step)
    # NumPy's float64 -> float32 cast rounds to nearest even, as exact rounding
    # of the float64 value does (tested against fractions), and is much faster.
    with np.errstate(over="ignore"):
        bits = np.array(list(values.values()), np.float64).astype(np.float32).view(np.uint32)
    return {name: Scalar("f32", int(b)) for name, b in zip(values, bits, strict=True)}


def adam_scalar_table(hyper: Hyper, first_step: int, updates: int) -> np.ndarray:
    """The ``adam_scalars`` tensor: f32[updates][8], row k for global step first_step + k.

    Row k holds the values ``adam_scalars(hyper, first_step + k)`` gives, in the order
    of ADAM_SCALAR_NAMES, then 0 (padding). With a learning-rate schedule the decay
    column depends on the step too: 1 - lr_t * weight_decay, each formed in float64 from
    `Hyper.lr_at` and rounded once, as `adam_scalars` forms it.
    """
    if updates == 0:
        return np.zeros((0, ADAM_SCALAR_STRIDE), np.float32)
    table = np.zeros((updates, ADAM_SCALAR_STRIDE), np.float32)
    # The constant columns once, then those that depend on the step.
    constants = np.array(tuple(_adam_values(hyper, first_step).values()), np.float64)
    with np.errstate(over="ignore"):  # a huge lr rounds to inf, as in adam_scalars
        table[:, :len(ADAM_SCALAR_NAMES)] = constants.astype(np.float32)
    steps = np.arange(first_step, first_step + updates, dtype=np.int64)
    lr = learning_rates(hyper, steps)
    step_size, eps_hat = _step_columns(hyper, steps, lr)
    table[:, ADAM_SCALAR_NAMES.index("step_size")] = step_size
    table[:, ADAM_SCALAR_NAMES.index("eps_hat")] = eps_hat
    if hyper.scheduled:
        with np.errstate(over="ignore"):
            table[:, ADAM_SCALAR_NAMES.index("decay")] = (
                1.0 - lr * hyper.weight_decay).astype(np.float32)
    return table


def learning_rates(hyper: Hyper, steps: np.ndarray) -> float | np.ndarray:
    """Each step's learning rate in float64: `Hyper.lr_at`, evaluated step by step in
    Python's floats (its cosine is math.cos, as nanoGPT's), or hyper.lr alone where no
    schedule changes it."""
    if not hyper.scheduled:
        return hyper.lr
    return np.fromiter(map(hyper.lr_at, steps.tolist()), np.float64, steps.size)


def _exact_step_columns(hyper: Hyper, steps: np.ndarray,
                        lr: float | np.ndarray | None = None,
                        ) -> tuple[np.ndarray, np.ndarray]:
    """step_size and eps_hat as binary32 for each step (`lr` its learning rate: one, or
    one a step; None: hyper.lr): _adam_values' float64 expressions, the powers Python's
    float ** int (C's pow), then rounded once."""
    lr = hyper.lr if lr is None else lr
    power1 = np.fromiter(map(hyper.beta1.__pow__, steps.tolist()), np.float64, steps.size)
    power2 = np.fromiter(map(hyper.beta2.__pow__, steps.tolist()), np.float64, steps.size)
    with np.errstate(over="ignore"):
        root = np.sqrt(1.0 - power2)
        return ((lr * root / (1.0 - power1)).astype(np.float32),
                (hyper.eps * root).astype(np.float32))


# The float64 powers NumPy's power gives may differ from C's pow in their last bits (a
# SIMD route); glibc's pow is within 1 ulp, NumPy's routes within a few. This bound on
# the powers' error, in ulps, is 16 times that: a generous margin.
POWER_ERROR_ULPS = 64.0


# Past the step where beta^t < 2^-60, 1 - beta^t is 1 in float64 whatever pow gives (C's
# or NumPy's), so the columns are exactly those of any power that small. NumPy computes
# powers that underflow slowly, so those steps take the power of the last step before
# 2^-70 instead.
NEGLIGIBLE_POWER_BITS = 70


def _powers(beta: float, exponents: np.ndarray) -> np.ndarray:
    """beta ** exponents as NumPy's power gives them up to the exponent where they fall
    below 2^-70, and that one's power (below 2^-69) past it."""
    if not 0.0 < beta < 1.0:
        return np.power(beta, exponents)
    last = math.ceil(NEGLIGIBLE_POWER_BITS / -math.log2(beta))  # beta^last <= 2^-70
    return np.power(beta, np.minimum(exponents, float(last)))


def _step_columns(hyper: Hyper, steps: np.ndarray, lr: float | np.ndarray | None = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """_exact_step_columns' bits, fast: NumPy's powers, and C's pow again for the steps
    whose float64 value lies too close to a binary32 rounding boundary for the two powers'
    difference to be ruled out.

    A power p off by at most E ulps (E = POWER_ERROR_ULPS) moves 1 - p by E ulps of p,
    a relative E 2^-52 p / (1 - p) of it; sqrt halves that, and the product and quotient
    add their own roundings (a few 2^-53) in either pipeline. Where the float64 result is
    farther from every rounding boundary of its binary32 than twice that bound, both
    pipelines round to the same binary32. A step's learning rate (`lr`, one a step under
    a schedule) is the same float64 in both pipelines: it only scales, and the bound is
    relative.
    """
    lr = hyper.lr if lr is None else lr
    exponents = steps.astype(np.float64)
    power1, power2 = _powers(hyper.beta1, exponents), _powers(hyper.beta2, exponents)
    # One errstate for all (entering one costs microseconds): a huge lr overflows, and a
    # beta of 0 divides 0 by 1 - 0 harmlessly.
    with np.errstate(all="ignore"):
        root = np.sqrt(1.0 - power2)
        columns64 = (lr * root / (1.0 - power1), hyper.eps * root)
        bound = (2.0 * POWER_ERROR_ULPS * 2.0**-52) * (power1 / (1.0 - power1)
                                                       + power2 / (1.0 - power2)) + 16 * 2.0**-53
        columns = tuple(column.astype(np.float32) for column in columns64)
        unsure = ~(_rounds_alike(columns64[0], columns[0], bound)
                   & _rounds_alike(columns64[1], columns[1], bound))
    if unsure.any():
        exact = _exact_step_columns(hyper, steps[unsure],
                                    lr[unsure] if isinstance(lr, np.ndarray) else lr)
        for column, again in zip(columns, exact, strict=True):
            column[unsure] = again
    return columns


def _rounds_alike(value: np.ndarray, rounded: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Where every float64 within a relative `bound` of `value` rounds to binary32
    `rounded` (value's own rounding): both ends of that interval do, and rounding is
    monotonic, so everything between them does too.

    The ends are computed in float64, each a relative 2^-53 off at most, which the
    bounds' own margin (16 2^-53) covers. A NaN anywhere compares unequal: not alike.
    """
    low = (value * (1.0 - bound)).astype(np.float32)
    high = (value * (1.0 + bound)).astype(np.float32)
    return (low == rounded) & (high == rounded)


@functools.lru_cache(maxsize=64)
def inverse_rows_bits(vocab: int) -> int:
    """1/V correctly rounded to binary32 (0x3b800000 for V = 256)."""
    return f32_bits_from_fraction(Fraction(1, vocab))


def tensor_specs(config: BobConfig) -> tuple[TensorSpec, ...]:
    v, p, r = config.vocab, config.prompts, config.shard_rows
    seed = (
        TensorSpec("parameters", "f32", (r, v)),
        TensorSpec("first_moment", "f32", (r, v)),
        TensorSpec("second_moment", "f32", (r, v)),
        TensorSpec("gradients", "f32", (r, v)),
        TensorSpec("input", "u8", (config.input_bytes,)),
        TensorSpec("initial_loss", "f32", (r,)),
        TensorSpec("training_loss", "f32", (r,)),
        TensorSpec("logit_rows", "f32", (p, v)),
        TensorSpec("predictions", "u32", (p,)),
    )
    health = TensorSpec(HEALTH_TENSOR, "u32", (len(sig.HEALTH_COUNTS), 2))
    scalars = () if config.schedule == "seed" else (
        TensorSpec(ADAM_SCALARS_TENSOR, "f32", (config.updates, ADAM_SCALAR_STRIDE)),)
    weights = () if config.mode == "hard" else (TensorSpec(WEIGHTS_TENSOR, "f32", (r, v)),)
    validation = () if not config.validates else (
        TensorSpec(VALIDATION_INPUT, "u8", (PAIR_BYTES * config.validation_pairs,)),
        TensorSpec(VALIDATION_WEIGHTS, "f32", (v, v)),
        TensorSpec(VALIDATION_INITIAL_LOSS, "f32", (v,)),
        TensorSpec(VALIDATION_LOSS, "f32", (v,)),
    )
    return (*seed, *scalars, *weights, *validation, health)


def declared_regions(config: BobConfig, target: Target,
                     compiled: dict[str, Region] | None = None) -> tuple[Region, ...]:
    """The four regions of the seed's order (the fused one in AdamW's place), the health
    check, then in corpus mode the scatter and, with validation, the loss alone."""
    training = sig.ADAMW if config.schedule == "seed" else config.fused_region(target)
    names = (sig.GATHER, config.loss_region, training, sig.ARGMAX, sig.HEALTH)
    if config.load_launches:
        names += (sig.SCATTER,)
    if config.validates:
        names += (sig.LOSS_ONLY_CORPUS,)
    compiled = compiled or {}
    return tuple(compiled.get(name) or sig.declared_region(name) for name in names)


def adamw_grid(count: int) -> int:
    # Enough blocks to fill a large GPU; each thread strides over the rest.
    return max(1, min(math.ceil(count / sig.BLOCK), 4096))


def scatter_grid(count: int) -> int:
    # A thread per pair, up to 4096 blocks; each thread strides over the rest.
    return max(1, min(math.ceil(count / sig.BLOCK), 4096))


def health_grid(count: int) -> int:
    # A thread loads four floats of each table at a time. 2048 blocks of 256 threads fill
    # a large GPU (an SM holds at most 2048 threads); each thread strides over the rest.
    return max(1, min(math.ceil(count / (4 * sig.BLOCK)), 2048))


def build_program(config: BobConfig, target: Target = SM86, hyper: Hyper = Hyper(),
                  first_step: int = 1, compiled: dict[str, Region] | None = None,
                  ) -> ProgramSpec:
    """Bob's program for `target`; update k's AdamW scalars are those of step first_step + k.

    The seed schedule carries them in its AdamW launches; the fused schedule reads
    them from the ``adam_scalars`` tensor, which the host writes
    (``adam_scalar_table(hyper, first_step, N)``). The target decides the fused region
    (its shared memory) and the held kernels' grid (its SMs). Dense tables only
    (``bob.program.plans`` builds either program).
    """
    if config.collapsed:
        raise ValueError("collapsed tables: bob.program.collapsed.build_program builds them")
    v, block = config.vocab, Dim3(sig.BLOCK)
    rows = config.shard_rows  # R: a block per row for the loss, R x V elements for AdamW
    regions = declared_regions(config, target, compiled)
    # Each launch's block is its region's: a compiled tall kernel names its own.
    region_blocks = {r.name: r.block_x for r in regions}
    vocab = Scalar.u32(v)
    log2e, ln2 = Scalar.f32_bits(LOG2E_BITS), Scalar.f32_bits(LN2_BITS)
    row_bytes = 4 * v
    prompts_offset = config.input_targets_bytes
    # What the loss reads its targets from: the input (hard), the scattered table (corpus).
    targets = TensorRef("input" if config.mode == "hard" else WEIGHTS_TENSOR)

    def loss(into: str) -> LaunchSpec:
        if config.mode == "hard":
            args = (TensorRef("parameters"), TensorRef("gradients"), targets,
                    TensorRef(into), log2e, ln2, Scalar.f32_bits(inverse_rows_bits(v)), vocab)
        else:
            args = (TensorRef("parameters"), TensorRef("gradients"), targets,
                    TensorRef(into), log2e, ln2, vocab)
        return LaunchSpec(config.loss_region, Dim3(rows), block, args, f"loss->{into}")

    def scatter(table: str, pairs: str, count: int) -> LaunchSpec:
        # keys u64[K] at the input's start, then values f32[K]
        return LaunchSpec(sig.SCATTER, Dim3(scatter_grid(count)), block, (
            TensorRef(table), TensorRef(pairs), TensorRef(pairs, 8 * count),
            Scalar.u32(count), vocab,
        ), f"scatter->{table}")

    def validation_loss(into: str) -> LaunchSpec:
        return LaunchSpec(sig.LOSS_ONLY_CORPUS, Dim3(v), block, (
            TensorRef("parameters"), TensorRef(VALIDATION_WEIGHTS), TensorRef(into),
            log2e, ln2, vocab,
        ), f"validation->{into}")

    def predict(i: int) -> tuple[LaunchSpec, LaunchSpec]:
        row = TensorRef("logit_rows", i * row_bytes)
        gather = LaunchSpec(sig.GATHER, Dim3(1), block, (
            row, TensorRef("input", prompts_offset + 4 * i), TensorRef("parameters"), vocab,
        ), f"gather[{i}]")
        argmax = LaunchSpec(sig.ARGMAX, Dim3(1), block, (
            TensorRef("predictions", 4 * i), row, vocab,
        ), f"argmax[{i}]")
        return gather, argmax

    adamw_pointers = (TensorRef("parameters"), TensorRef("gradients"),
                      TensorRef("first_moment"), TensorRef("second_moment"))
    adamw_grid_dim = Dim3(adamw_grid(rows * v))
    row_count = Scalar.u32(rows)

    def adamw(k: int, scalars: tuple[Scalar, ...]) -> LaunchSpec:
        return LaunchSpec(sig.ADAMW, adamw_grid_dim, block, (
            *adamw_pointers, *scalars,
            row_count, vocab,  # rows, columns: V * V needs 33 bits at V = 65536
        ), f"adamw[{k}]")

    def fused(first: int, updates: int) -> LaunchSpec:
        # Updates [first, first + updates); the last launch writes gradients and loss.
        finish = Scalar.u32(int(first + updates == config.updates))
        data = (log2e, ln2, Scalar.f32_bits(inverse_rows_bits(v)))
        if config.mode == "corpus":
            data = (log2e, ln2)
        scalars_row = TensorRef(ADAM_SCALARS_TENSOR, 4 * ADAM_SCALAR_STRIDE * first)
        label = f"fused[{first}]" if updates == 1 else f"fused[{first}:{first + updates}]"
        region = config.fused_region(target)
        # The held kernels run a block per SM, each taking rows blockIdx.x, + gridDim.x, ...
        # and copying its next row's w in while it updates the last; any grid gives the
        # same bits. The others run a block per row.
        # The cluster ones run as many clusters of C as the target holds at once, each taking
        # rows g, g + G, ...; any grid gives the same bits. The others run a block per row.
        ctas = cluster_ctas(config.mode, v, target) if region in sig.CLUSTER_SLICES else None
        if ctas is not None:
            rows = target.cluster_grid(ctas)
        else:
            rows = min(v, target.multiprocessors) if region in sig.SHARED_REST else v
        return LaunchSpec(region, Dim3(rows), Dim3(region_blocks[region]), (
            TensorRef("parameters"), TensorRef("first_moment"), TensorRef("second_moment"),
            TensorRef("gradients"), targets, TensorRef("training_loss"),
            scalars_row, *data, vocab, Scalar.u32(updates), finish,
        ), label, ctas or 1)

    def health() -> LaunchSpec:
        tables = tuple(TensorRef(name) for name in sig.HEALTH_COUNTS)
        return LaunchSpec(sig.HEALTH, Dim3(health_grid(v * v)), block,
                          (*tables, TensorRef(HEALTH_TENSOR), vocab), "health")

    launches: list[LaunchSpec] = []
    if config.load_launches:  # a shard's weights are written dense by the host
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
        training_loss = loss("training_loss")  # every update's is the same launch
        for k in range(config.updates):
            launches.extend((adamw(k, scalars[k]), training_loss))
    elif config.updates:
        step = config.updates_per_fused_launch(target)
        launches.extend(fused(first, min(step, config.updates - first))
                        for first in range(0, config.updates, step))
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


def program_attributes(config: BobConfig, first_step: int) -> dict[str, int | str]:
    """The configuration as a plan's attributes (numbers or text: `plan_config` reads it
    back): a shard's rows as "first:last", a collapsed table's layout and K."""
    return {"program": "bob", "vocab": config.vocab, "prompts": config.prompts,
            "updates": config.updates, "mode": config.mode,
            "schedule": config.schedule, "submission": config.submission,
            "pairs": config.pairs, "validation_pairs": config.validation_pairs,
            "first_step": first_step,
            **({} if config.rows is None else {"rows": ":".join(map(str, config.rows))}),
            **({"tables": config.tables, "exceptions": config.exceptions}
               if config.collapsed else {})}


def adamw_scalar_arguments(hyper: Hyper, first_step: int, updates: int,
                           ) -> list[tuple[Scalar, ...]]:
    """Update k's f32 arguments of bob-adamw, in its signature's order: the values
    ``adam_scalars(hyper, first_step + k)`` gives, from one ``adam_scalar_table``."""
    names = [p.name for p in sig.SIGNATURES[sig.ADAMW] if isinstance(p, ScalarParam)
             and p.dtype == "f32"]
    columns = [ADAM_SCALAR_NAMES.index(name) for name in names]
    rows = adam_scalar_table(hyper, first_step, updates).view(np.uint32)[:, columns].tolist()
    # Most columns hold one value for every update: one Scalar per distinct pattern.
    interned = {bits: Scalar("f32", bits) for bits in set(itertools.chain(*rows))}
    return [tuple(map(interned.__getitem__, row)) for row in rows]


def submission_schedule(config: BobConfig, target: Target) -> tuple[Submission, ...]:
    """The launches in submissions, by policy: the loads, the forward launches, the
    training launches, then the predictions again; semaphore values 1, 2, ..."""
    loads, forward = config.load_launches, config.forward_launches
    training, predictions = config.training_launches(target), config.first_prediction
    if config.submission == "per-launch":
        groups = [(i, 1) for i in range(forward + training)]
        groups += [(predictions + i, 1) for i in range(2 * config.prompts)]
    else:
        groups = [(0, loads)] if loads else []
        groups.append((loads, forward - loads))
        if training:
            groups.append((forward, training))
        if config.prompts:
            groups.append((predictions, 2 * config.prompts))
    return tuple(Submission(first, count, value)
                 for value, (first, count) in enumerate(groups, start=1))


def shard_boundaries(vocab: int, shards: int) -> tuple[tuple[int, int], ...]:
    """Rows [first, last) of each of `shards` row shards of a V x V table: as even as
    whole rows go, shard i from i * V // K."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= vocab:
        raise BadInput(f"--shards must be an integer in [1, V={vocab}], not {shards!r}")
    edges = [i * vocab // shards for i in range(shards + 1)]
    return tuple(zip(edges[:-1], edges[1:], strict=True))


def build_plan(config: BobConfig, target: Target = SM86, hyper: Hyper = Hyper(),
               first_step: int = 1, compiled: dict[str, Region] | None = None) -> Plan:
    """The dense program placed (``bob.program.plans.build_plan`` places either)."""
    return place(build_program(config, target, hyper, first_step, compiled), target)
