"""The tables of ``bob bench``: for each device and V, Bob and its peers side by side."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from bob.backends import BackendChoice, choose_backend, resolve_submission
from bob.config import (
    AUTO_SUBMISSION,
    DEFAULT_KERNELS,
    DEFAULT_SUBMISSION_POLICY,
    KERNELS,
    MODES,
    Hyper,
    Mode,
    require_choice,
)
from bob.errors import BackendUnavailable, BadInput
from bob.host.training import CPU_MAX_VOCAB
from dev.bench.compute_floor import compute_floor_rows
from dev.bench.measurement import (
    bob_configs,
    copy_bandwidth,
    corpus_command_rows,
    error_text,
    failed,
    floor_rows,
    measure_bob,
    measure_peer,
)
from dev.bench.peers import JaxLoop, NumpyPeer, Peer, TorchEager, TorchGraph
from dev.bench.tables import BANDWIDTH_MIN_VOCAB, BenchReport, BenchTable, Device, Row
from dev.bench.workload import Workload, bench_workload, token_corpus


def default_vocabs(device: Device) -> tuple[int, ...]:
    """The byte vocabulary everywhere; a token-sized, memory-bound table on the GPU."""
    return (256, 8192) if device == "cuda" else (256,)


# Past this V a corpus table takes tens of milliseconds an update on the GPU, and PyTorch
# longer: a timing of N = 20 lasts over a second.
LARGE_CORPUS_VOCAB = 16384


def default_updates(device: Device, vocab: int, mode: Mode = "hard") -> int:
    """Updates per timing: enough that one timing lasts tens of milliseconds."""
    if device == "cuda":
        if mode == "corpus" and vocab > LARGE_CORPUS_VOCAB:
            return 20
        return 1000 if vocab <= 1024 else 100  # ~3 us vs ~1 ms per update
    return 100 if vocab <= 1024 else 5  # ~0.4 ms vs ~0.5 s per update


def cpu_name() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def gpu_name() -> str:
    from bob.backends.cuda import describe_device

    info = describe_device()
    return f"{info.name} ({info.arch}), driver {info.driver_version}"


Progress = Callable[[str], None]


# The per-launch nv row compares launch overheads, which show at small V; at V = 8192 it
# would time 200 launches of 770 us each again, doubling the nv rows' time for nothing.
PER_LAUNCH_ROW_MAX_VOCAB = 1024


def nv_rows(vocab: int, updates: int, repeats: int, hyper: Hyper,
            progress: Progress, submission: str = AUTO_SUBMISSION,
            workload: Workload | None = None, kernels: str = DEFAULT_KERNELS) -> list[Row]:
    """The cuda rows' configurations on the `nv` backend (no CUDA runtime), with nv's
    policy (auto: chained), and the seed schedule per-launch beside them for comparison
    (up to PER_LAUNCH_ROW_MAX_VOCAB).

    Every V the cuda table runs: the nv backend reads tables back through the copy engine,
    not BAR1. A configuration that fails is a failed row; the bench goes on.
    """
    try:
        choice = choose_backend("nv")
    except Exception as error:  # noqa: BLE001 - nv is optional: say why it is absent
        return [Row("bob nv invocation", "peer", updates,
                    error=f"skipped: {error_text(error)}")]
    policy = resolve_submission(submission, choice.name)
    workload = workload or bench_workload("hard", vocab)
    record = workload.record
    configs = list(bob_configs(vocab, updates, policy, record.mode, record.pairs))
    if policy != DEFAULT_SUBMISSION_POLICY and vocab <= PER_LAUNCH_ROW_MAX_VOCAB:
        seed = configs[0][1]
        configs.append((f" {DEFAULT_SUBMISSION_POLICY}",
                        replace(seed, submission=DEFAULT_SUBMISSION_POLICY)))
    runs = [(choice, label, config) for label, config in configs]
    if kernels != DEFAULT_KERNELS:  # Bob's own kernels beside NVRTC's: the configs they run
        from bob.host.own_code import covers

        try:
            own = choose_backend("nv", kernels=kernels)
        except Exception as error:  # noqa: BLE001 - say why, and bench NVRTC's rows
            return [*nv_rows(vocab, updates, repeats, hyper, progress, submission, workload),
                    failed(f"bob nv {kernels} invocation", "bob", updates, error)]
        runs += [(own, f" {kernels}{label}", config)
                 for label, config in configs if covers(own, config)]
    rows: list[Row] = []
    for bob_choice, label, config in runs:
        progress(f"cuda V={vocab}: bob nv{label} ({updates} updates per invocation, "
                 f"{config.submission} submissions)")
        try:
            rows.extend(measure_bob(bob_choice, config, hyper, repeats, label, record=record))
        except Exception as error:  # noqa: BLE001 - a failing variant must not end the bench
            rows.append(failed(f"bob nv{label} invocation", "bob", updates, error))
    return rows


def bench_device(device: Device, vocab: int, updates: int, repeats: int, hyper: Hyper,
                 choice: BackendChoice, device_name: str, progress: Progress,
                 copy: float | None = None,
                 submission: str = AUTO_SUBMISSION,
                 workload: Workload | None = None,
                 kernels: str = DEFAULT_KERNELS, compute_floor: bool = False) -> BenchTable:
    """One table: Bob's rows on `choice` (and nv beside cuda), in corpus mode the whole
    commands, then the peers and the memory floor (with `compute_floor` the compute floor
    too), all on `workload` (default: the hard bench targets).

    Run in an order that leaves each its device memory: every Bob session is closed before
    the processes start, and the peers in this process come last (JAX's allocator keeps
    what it took)."""
    workload = workload or bench_workload("hard", vocab)
    record = workload.record
    policy = resolve_submission(submission, choice.name)
    rows: list[Row] = []
    for label, config in bob_configs(vocab, updates, policy, record.mode, record.pairs):
        progress(f"{device} V={vocab}: bob{label} ({updates} updates per invocation)")
        try:
            rows.extend(measure_bob(choice, config, hyper, repeats, label, record=record))
        except Exception as error:  # noqa: BLE001 - a failing variant must not end the bench
            rows.append(failed(f"bob {device}{label} invocation", "bob", updates, error))

    if device == "cuda":
        rows.extend(nv_rows(vocab, updates, repeats, hyper, progress, submission, workload,
                            kernels))

    if record.mode == "corpus":
        rows.extend(command_rows(device, vocab, updates, repeats, hyper, choice, policy,
                                 workload, progress))

    peers: list[tuple[str, Callable[[], Peer]]]
    if device == "cuda":
        peers = [
            ("pytorch eager", lambda: TorchEager(record, updates, hyper, "cuda")),
            ("pytorch cuda graph", lambda: TorchGraph(record, updates, hyper)),
            ("jax jit(fori_loop)", lambda: JaxLoop(record, updates, hyper)),
        ]
    else:
        peers = [
            ("numpy loop", lambda: NumpyPeer(record, updates, hyper)),
            ("pytorch cpu eager", lambda: TorchEager(record, updates, hyper, "cpu")),
        ]
    for name, make in peers:
        progress(f"{device} V={vocab}: {name}")
        rows.append(measure_peer(make, name, updates, repeats))
    if device == "cuda" and vocab >= BANDWIDTH_MIN_VOCAB:
        rows.extend(floor_rows(vocab, updates, copy))
        if compute_floor:
            progress(f"{device} V={vocab}: the compute floor (ncu)")
            rows.extend(compute_floor_rows(vocab, record.mode, updates))
    return BenchTable(device, device_name, vocab, updates, repeats, tuple(rows), record.mode,
                      record.pairs, workload.data)


def command_rows(device: Device, vocab: int, updates: int, repeats: int, hyper: Hyper,
                 choice: BackendChoice, policy: str, workload: Workload,
                 progress: Progress) -> list[Row]:
    """The whole commands on the given token files, or on a token corpus made for V in a
    temporary directory."""
    with tempfile.TemporaryDirectory(prefix="bob-bench-tokens-") as directory:
        corpus = workload.tokens or token_corpus(Path(directory), vocab)
        return corpus_command_rows(
            choice, corpus, vocab, updates, repeats, hyper, policy, device,
            lambda text: progress(f"{device} V={vocab}: {text}"))


def require_bench_kernels(kernels: str, backends: Sequence[str]) -> None:
    """BadInput unless the bench can run `kernels`: Bob's own kernels run in the nv rows,
    which the bench adds beside cuda's table only."""
    require_choice("kernels", kernels, KERNELS)
    if kernels != DEFAULT_KERNELS and tuple(backends) != ("cuda",):
        raise BadInput(f"--kernels {kernels} adds rows of Bob's own kernels beside the nv "
                       "rows, which run beside cuda's table only: give --backend cuda")


def _bench_choice(name: str) -> BackendChoice:
    """Bob's backend for a table: `name`'s, where `auto` is cuda where usable, else cpu (the
    tables are cuda's and the cpu's: nv runs in the cuda table's rows)."""
    if name != "auto":
        return choose_backend(name)
    try:
        return choose_backend("cuda")
    except BackendUnavailable:
        return choose_backend("cpu")


def resolve_devices(backends: Sequence[str],
                    ) -> tuple[list[Device], dict[Device, BackendChoice]]:
    """The devices to bench and Bob's backend choice for each; `auto` as choose_backend."""
    choices: dict[Device, BackendChoice] = {}
    devices: list[Device] = []
    for name in backends or ("auto",):
        choice = _bench_choice(name)  # raises BackendUnavailable for an unusable cuda
        device: Device = "cuda" if choice.name == "cuda" else "cpu"
        if device not in choices:
            choices[device] = choice
            devices.append(device)
    return devices, choices


def environment() -> dict[str, str]:
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for module in ("torch", "jax"):
        if module in sys.modules:
            found[module] = str(getattr(sys.modules[module], "__version__", "?"))
    for variable in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"):
        if variable in os.environ:
            found[variable] = os.environ[variable]
    return found


def run_bench(backends: Sequence[str] = (), vocabs: Sequence[int] = (),
              updates: int | None = None, repeats: int = 5, hyper: Hyper = Hyper(),
              progress: Progress | None = None, command: str = "",
              submission: str = AUTO_SUBMISSION, mode: Mode = "hard",
              tokens: str | None = None, val_tokens: str | None = None,
              kernels: str = DEFAULT_KERNELS, compute_floor: bool = False) -> BenchReport:
    """Every table: for each device, for each V, Bob and its peers side by side, training
    `mode`'s objective (corpus: on the pairs of `tokens`, counted, where given; the whole
    commands validate on `val_tokens`, or on `tokens` itself)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats}")
    if mode not in MODES:
        raise BadInput(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "hard" and (tokens or val_tokens):
        raise BadInput("token files are corpus data: give --mode corpus with --tokens")
    if val_tokens and not tokens:
        raise BadInput("--val-tokens validates the --tokens corpus: give --tokens too")
    resolve_submission(submission)  # an unknown policy is refused before any work
    require_bench_kernels(kernels, backends)
    say = progress or (lambda text: None)
    devices, choices = resolve_devices(backends)
    too_large = [v for v in vocabs if v > CPU_MAX_VOCAB]
    if "cpu" in devices and too_large:  # Bob's CPU rows and the NumPy peer hold whole tables
        raise BadInput(f"V={too_large[0]} is above the largest table the CPU backend trains "
                       f"(V={CPU_MAX_VOCAB}); bench it on a GPU (--backend cuda)")
    tables = []
    for device in devices:
        name = gpu_name() if device == "cuda" else cpu_name()
        copy = copy_bandwidth() if device == "cuda" else None
        for vocab in vocabs or default_vocabs(device):
            n = updates or default_updates(device, vocab, mode)
            say(f"{device} V={vocab}: the {mode} workload")
            workload = bench_workload(mode, vocab, tokens, val_tokens)
            tables.append(bench_device(device, vocab, n, repeats, hyper, choices[device],
                                       name, say, copy, submission, workload, kernels,
                                       compute_floor))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return BenchReport(tuple(tables), hyper, date, command, environment())
