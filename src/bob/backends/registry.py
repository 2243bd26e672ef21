"""The one registry of Bob's backends: a spec each, and every list of them derived here.

    spec("nv").runs_command_stream          # True: chained plans by default
    choose_backend("auto")                  # cuda where usable, else nv, else cpu
    resolve_submission("auto", "nv-sim")    # "chained"
    resolve_schedule("auto", "cuda").schedule   # "fused": the seed's bytes, faster

A `BackendSpec` says how its backend is chosen for this machine (`choose`: what to build
the plan for and how to open it, or `BackendUnavailable` saying why not) and the facts
the other layers ask about it: the command line's choices, what `auto` tries, the rows
of `bob doctor`, the backends `bob profile` times, and which backends get chained plans.
Nothing here imports a backend's module until that backend is chosen, and whether a
backend can run here is decided once, in its chooser: `choose_backend` opens one,
`availability` reports on it. A choice says whose machine code its regions carry
(`BackendChoice.kernels`): nv where NVRTC is not installed carries Bob's own alone.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from bob.config import (
    ARENA_KINDS,
    DEFAULT_KERNELS,
    DEFAULT_SUBMISSION_POLICY,
    DEFAULT_TARGET,
    KERNELS,
    SCHEDULE_CHOICES,
    SCHEDULES,
    SUBMISSION_CHOICES,
    SUBMISSION_POLICIES,
    Schedule,
    SubmissionPolicy,
    require_choice,
)
from bob.errors import BackendUnavailable, BadInput, BobError

if TYPE_CHECKING:
    from bob.plan.certificate import CertifiedPlan
    from bob.plan.model import Region, Target

    from .base import Backend


@dataclass(frozen=True)
class BackendChoice:
    """A backend picked for this machine: what to build the plan for, and how to open it."""

    name: str
    target: Target
    regions: Mapping[str, Region] | None = field(default=None, compare=False)
    opener: Callable[[CertifiedPlan], Backend] | None = field(default=None, compare=False)
    reason: str = ""  # what it runs on; for `auto`, why it was chosen
    # Whose machine code the regions carry: "nvrtc" (NVRTC's, or none for the backends that
    # run no machine code), or "own": Bob's where it has it (--kernels own, or nv where
    # NVRTC is not installed). A plan is then held to own code's coverage before any work.
    kernels: str = DEFAULT_KERNELS
    # The regions are Bob's own and nothing else (nv where NVRTC is not installed or
    # fails): a plan needing a region Bob has no code for cannot run.
    own_only: bool = False

    def open(self, plan: CertifiedPlan) -> Backend:
        assert self.opener is not None
        return self.opener(plan)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and what on (or why not)."""

    backend: str
    usable: bool
    details: str

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "usable": self.usable, "details": self.details}


Chooser = Callable[[str, str], BackendChoice]  # (architecture, arena kind) -> the choice


@dataclass(frozen=True)
class BackendSpec:
    """One backend: its name, how it is chosen and opened, and what it is."""

    name: str
    choose: Chooser = field(compare=False, repr=False)
    description: str  # one line: what it runs on
    on_gpu: bool = False  # runs on an NVIDIA GPU (doctor shows the kernel module beside it)
    runs_command_stream: bool = False  # runs Bob's QMDs, pushbuffer and GPFIFO entries
    uses_cuda_driver: bool = False  # opens the CUDA driver (the executable warms it up)
    profile_method: str = ""  # how it times each launch (`Backend.profile`); "": it cannot
    auto_rank: int | None = None  # `auto` tries the ranked backends, lowest first
    # Why it launches no thread-block clusters, in one line ("": it launches them where its
    # target has them); `bob doctor` and `bob plan` say it.
    clusters_withheld: str = ""
    # Why `--schedule auto` runs the seed schedule on it, in a few words ("": auto runs the
    # fused schedule, the same bytes, faster); resolve_schedule says it.
    seed_by_auto: str = ""

    @property
    def can_profile(self) -> bool:
        return bool(self.profile_method)


def _choose_cpu(arch: str, arena: str) -> BackendChoice:
    import numpy as np

    from bob.plan.placement import SM86

    from .cpu import CpuBackend

    return BackendChoice("cpu", SM86, None, CpuBackend,
                         f"NumPy {np.__version__} on {platform.machine()}, "
                         f"Python {platform.python_version()}")


def _choose_cuda(arch: str, arena: str) -> BackendChoice:
    try:
        from bob.kernels.cuda.regions import compiled_regions
        from bob.plan.placement import TARGETS

        from .cuda import CudaBackend, cuda_available, describe_device
    except ImportError as error:
        raise BackendUnavailable(
            "the cuda backend needs cuda-bindings and NVRTC (pip install "
            f"'bob-bigram[cuda]'): {error}"
        ) from None
    usable, device = cuda_available()  # NVRTC loads, the driver answers, a device exists
    if not usable:
        raise BackendUnavailable(f"the cuda backend cannot run here: {device}")
    info = describe_device()
    gpu_arch = info.arch
    target = TARGETS.get(gpu_arch)
    if target is None:
        raise BackendUnavailable(
            f"the GPU is {gpu_arch}; Bob's plans are built for {', '.join(sorted(TARGETS))}")
    # The held grid, and the clusters (their kernel nodes carry the cluster dimension).
    target = target.for_device(multiprocessors=info.multiprocessors)
    try:
        regions = compiled_regions(gpu_arch)
    except BobError as error:
        raise BackendUnavailable(f"Bob's kernels do not compile for {gpu_arch}: {error}") from None
    return BackendChoice("cuda", target, regions,
                         lambda plan: CudaBackend(plan, regions, arena=arena),
                         f"{device}; {len(regions)} kernels compiled for {gpu_arch}")


def _choose_nv_sim(arch: str, arena: str) -> BackendChoice:
    from bob.plan.placement import TARGETS

    from .nv.sim import NvSimBackend

    return BackendChoice("nv-sim", TARGETS[arch], None, NvSimBackend,
                         "encodes QMDs/pushbuffer/GPFIFO and simulates them on the CPU")


def _choose_nv(arch: str, arena: str) -> BackendChoice:
    try:
        from bob.plan.placement import TARGETS

        from .nv.rm.backend import SUBMITTED_TARGET, NvBackend, nv_available
    except ImportError as error:
        raise BackendUnavailable(f"the nv backend is not built here: {error}") from None
    usable, device = nv_available()
    if not usable:
        raise BackendUnavailable(f"the nv backend cannot run here: {device}")
    target = TARGETS[SUBMITTED_TARGET]
    if _BY_NAME["nv"].clusters_withheld:
        target = target.without_clusters()
    try:
        from bob.kernels.cuda.regions import compiled_regions

        regions = compiled_regions(SUBMITTED_TARGET)
    except (ImportError, BobError) as error:
        # No NVRTC here: nv runs Bob's own machine code alone, and a plan needing a region
        # it has none for is refused before any work (bob.host.own_code).
        from bob.kernels.own_regions import (
            CUDA_EXTRA,
            OWN_REGIONS,
            own_regions,
            seed_schedule_gaps,
        )

        gaps = seed_schedule_gaps()
        refused = (f": a plan needing {', '.join(gaps)} is refused ({CUDA_EXTRA})"
                   if gaps else "")
        return BackendChoice("nv", target, own_regions(target),
                             lambda plan: NvBackend(plan, arena=arena),
                             f"{device}; Bob's own machine code ({', '.join(OWN_REGIONS)}); "
                             f"{_without_nvrtc(error)}{refused}", kernels="own",
                             own_only=True)
    from bob.kernels.own_regions import OWN_REGIONS

    return BackendChoice("nv", target, regions, lambda plan: NvBackend(plan, arena=arena),
                         f"{device}; NVRTC's kernels (--kernels own: Bob's own "
                         f"{', '.join(OWN_REGIONS)})")


def _without_nvrtc(error: Exception) -> str:
    """Why NVRTC's kernels are not there, in a few words: not installed, or how it failed."""
    from bob.errors import reason_of

    missing = isinstance(error, ImportError) or getattr(error, "status", "") == "ImportError" \
        or getattr(error, "call", "") == "nvrtcVersion"  # the library itself did not load
    return "NVRTC is not installed" if missing else f"NVRTC failed: {reason_of(error)}"


SPECS: tuple[BackendSpec, ...] = (
    BackendSpec("cpu", _choose_cpu, "the oracle: the reference kernels over one byte buffer",
                auto_rank=2,
                # Once compiled, a small run takes as long with either schedule (it is mostly
                # start-up; the fused kernel's updates are the faster), but the first run
                # compiles the fused kernel into Numba's cache for far longer than the seed
                # schedule's two, and a stop waits for a compile (docs/BENCHMARKS.md, "The
                # schedules on the CPU").
                seed_by_auto="on cpu, quicker to compile"),
    BackendSpec("cuda", _choose_cuda, "the CUDA driver API, an invocation as one CUDA graph",
                on_gpu=True, uses_cuda_driver=True, auto_rank=0,
                profile_method="cuEventRecord before and after every launch, each launched "
                               "alone on one stream (not the graph)"),
    BackendSpec("nv-sim", _choose_nv_sim,
                "Bob's command stream, simulated on the CPU from its bytes alone",
                runs_command_stream=True),
    BackendSpec("nv", _choose_nv,
                "Bob's command stream on a Hopper GPU through the kernel driver",
                # After cuda: where the CUDA wheels are not installed it runs Bob's own code.
                on_gpu=True, runs_command_stream=True, auto_rank=1,
                profile_method="timestamped semaphore releases (wait for idle) before and "
                               "after every launch, one launch per submission"),
)
AUTO = "auto"  # the first ranked backend usable here
_BY_NAME: dict[str, BackendSpec] = {each.name: each for each in SPECS}
BACKENDS: tuple[str, ...] = tuple(_BY_NAME)
BACKEND_NAMES: tuple[str, ...] = (*BACKENDS, AUTO)  # the command line's choices
AUTO_ORDER: tuple[str, ...] = tuple(
    each.name for each in sorted((each for each in SPECS if each.auto_rank is not None),
                                 key=lambda each: each.auto_rank or 0))
PROFILED_BACKENDS: tuple[str, ...] = tuple(each.name for each in SPECS if each.can_profile)
STREAM_BACKENDS: tuple[str, ...] = tuple(each.name for each in SPECS
                                         if each.runs_command_stream)
# The backends that can run Bob's own machine code (--kernels own): those whose plans carry
# the regions' code into their command stream. cuda loads NVRTC's cubin and stays on it.
OWN_KERNEL_BACKENDS: tuple[str, ...] = STREAM_BACKENDS
# The names that may open the CUDA driver: auto among them when a backend it tries does.
CUDA_DRIVER_NAMES: frozenset[str] = frozenset(
    [each.name for each in SPECS if each.uses_cuda_driver]
    + ([AUTO] if any(_BY_NAME[name].uses_cuda_driver for name in AUTO_ORDER) else []))


def spec(name: str) -> BackendSpec:
    """The spec of backend `name` (a backend, not "auto")."""
    found = _BY_NAME.get(name)
    if found is None:
        raise BadInput(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return found


def _choose_auto(arch: str, arena: str) -> BackendChoice:
    """The first backend of AUTO_ORDER usable here; its reason says why the ones before
    it were passed over."""
    passed: list[str] = []
    for name in AUTO_ORDER:
        try:
            choice = _BY_NAME[name].choose(arch, arena)
        except BackendUnavailable as why:
            passed.append(str(why))
            continue
        gaps = _own_gaps(choice)
        if gaps:  # it would refuse runs the next one runs
            passed.append(f"the {name} backend runs Bob's own machine code alone here (no "
                          f"NVRTC), which has none for {', '.join(gaps)}")
            continue
        if not passed:
            first = "a GPU is usable" if _BY_NAME[name].on_gpu else f"{name} is auto's first"
            return replace(choice, reason=first)
        # Past the first, a GPU backend says what it runs on (nv: whose machine code).
        ran = [f"{name}: {choice.reason}"] if _BY_NAME[name].on_gpu else []
        return replace(choice, reason="; ".join([*passed, *ran]))
    raise BackendUnavailable("no backend can run here: " + "; ".join(passed))


def _own_gaps(choice: BackendChoice) -> tuple[str, ...]:
    """For a choice of Bob's own code alone (nv without NVRTC): the seed schedule's regions
    own code lacks, which would refuse runs that another backend runs; auto passes it by."""
    if not choice.own_only:
        return ()
    from bob.kernels.own_regions import seed_schedule_gaps

    return seed_schedule_gaps()


def require_kernels(kernels: str, backends: tuple[str, ...]) -> None:
    """BadInput, one line, unless `kernels` can run on `backends`.

    Bob's own kernels (``own``) run where the plan's code goes into Bob's command stream
    (OWN_KERNEL_BACKENDS); beside one of those, cpu (which runs the NumPy reference, no
    machine code) may be the oracle of a check. Which plans they run (the regions Bob has
    own code for, at the plan's V) is checked where the plan is known, before any work
    (bob.host.own_code).
    """
    require_choice("kernels", kernels, KERNELS)
    if kernels == DEFAULT_KERNELS:
        return
    where = " and ".join(OWN_KERNEL_BACKENDS)
    if "cuda" in backends:
        raise BadInput(f"--kernels own runs on {where} (Bob's command stream); the cuda "
                       "backend loads NVRTC's cubin and stays on NVRTC's kernels")
    if AUTO in backends:
        raise BadInput(f"--kernels own runs on {where}: name one with --backend (auto picks "
                       f"{', '.join(AUTO_ORDER[:-1])} or {AUTO_ORDER[-1]})")
    if not any(name in OWN_KERNEL_BACKENDS for name in backends):
        raise BadInput(f"--kernels own runs on {where}; the cpu backend runs the NumPy "
                       "reference, no machine code")


def choose_backend(name: str, arch: str = DEFAULT_TARGET, arena: str = ARENA_KINDS[0],
                   kernels: str = DEFAULT_KERNELS) -> BackendChoice:
    """Resolve a backend name (``auto`` included) for this machine; with ``kernels="own"``
    (nv and nv-sim) the regions Bob has own code for carry it (nv without NVRTC carries
    Bob's alone, whatever `kernels` says)."""
    from bob.plan.placement import TARGETS

    from .base import require_arena_kind

    if name not in BACKEND_NAMES:
        raise BadInput(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if arch not in TARGETS:
        raise BadInput(f"unknown architecture {arch!r}; choose one of {', '.join(TARGETS)}")
    require_arena_kind(arena)
    require_kernels(kernels, (name,))
    if name == AUTO:
        return _choose_auto(arch, arena)
    choice = _BY_NAME[name].choose(arch, arena)
    if kernels == DEFAULT_KERNELS or choice.own_only:  # own_only: Bob's already, and said
        return choice
    from bob.kernels.own_regions import OWN_REGIONS, with_own_kernels

    return replace(choice, regions=with_own_kernels(choice.regions, choice.target),
                   reason=f"{choice.reason}; Bob's own machine code for "
                          f"{', '.join(OWN_REGIONS)}", kernels=kernels)


def availability(name: str) -> Availability:
    """Whether backend `name` can run here: what it would run on, or why not."""
    try:
        choice = choose_backend(name)
    except BackendUnavailable as why:
        return Availability(name, False, str(why))
    if name == AUTO:
        return Availability(name, True, f"picks {choice.name}")
    return Availability(name, True, choice.reason)


def resolve_submission(requested: str, *backends: str) -> SubmissionPolicy:
    """The submission policy a plan is built with, for a run on `backends` (resolved
    names, none when no backend runs it, as for `bob plan`).

    A policy asked for by name is that policy. "auto" is chained when one of the
    backends runs Bob's command stream, else per-launch: the others run a plan's launches
    in order whatever their grouping, so a pair such as cpu and nv shares the chained
    plan with the same bytes.
    """
    if requested in SUBMISSION_POLICIES:
        return requested  # type: ignore[return-value]
    require_choice("submission", requested, SUBMISSION_CHOICES)
    unknown = [name for name in backends if name not in _BY_NAME]
    if unknown:  # "auto" (the backend) must be resolved first: it names no stream
        raise ValueError(f"resolve the backend {unknown[0]!r} before its submission policy")
    if any(_BY_NAME[name].runs_command_stream for name in backends):
        return "chained"
    return DEFAULT_SUBMISSION_POLICY


@dataclass(frozen=True)
class ScheduleChoice:
    """The schedule a run's plans are built with, and why, in a few words."""

    schedule: Schedule
    reason: str  # "asked for", or auto's rule: "auto: ..."

    @property
    def text(self) -> str:
        """As the run's table and `bob plan` say it: fused (auto: ...)."""
        return f"{self.schedule} ({self.reason})"

    def to_json(self) -> dict[str, str]:
        return {"schedule": self.schedule, "schedule_reason": self.reason}


# Why auto chose, as the run's table, its JSON and `bob plan` say it.
ASKED_FOR = "asked for"
AUTO_FUSED = "auto: the seed schedule's bytes, faster"
AUTO_SEED_FOR_SHARDS = "auto: row shards run the seed schedule"
AUTO_SEED_FOR_OWN_KERNELS = "auto: Bob's own code has no fused kernel for the run"


def resolve_schedule(requested: str, backend: str, kernels: str = DEFAULT_KERNELS,
                     row_shards: bool = False, own_fused: bool = False) -> ScheduleChoice:
    """The schedule a training run on `backend` (a resolved name) builds its plans with,
    and why.

    A schedule asked for by name is that schedule (whether the run takes it is checked
    where the run is: require_kernels, the row shards' refusals). "auto" is the fused
    schedule wherever Bob has fused kernels for the run and they are the faster: every
    backend has them for every V and mode of a one-piece plan, and they leave the seed
    schedule's bytes in every tensor (tests/test_fused.py, and on the GPUs
    tests/test_fused_gpu.py). It is the seed schedule where there are no fused kernels (a
    row shard's plan is the seed's program over its rows; with Bob's own machine code,
    ``kernels="own"``, unless `own_fused` says own code covers the run's fused plan:
    bob.host.own_code.schedule_for), and on a backend whose spec says why not
    (`seed_by_auto`: the cpu backend).
    """
    if requested in SCHEDULES:
        return ScheduleChoice(requested, ASKED_FOR)  # type: ignore[arg-type]
    require_choice("schedule", requested, SCHEDULE_CHOICES)
    if row_shards:
        return ScheduleChoice("seed", AUTO_SEED_FOR_SHARDS)
    require_choice("kernels", kernels, KERNELS)
    if kernels != DEFAULT_KERNELS and not own_fused:
        return ScheduleChoice("seed", AUTO_SEED_FOR_OWN_KERNELS)
    if backend not in _BY_NAME:  # "auto" (the backend) must be resolved first
        raise ValueError(f"resolve the backend {backend!r} before its schedule")
    why = _BY_NAME[backend].seed_by_auto
    if why:
        return ScheduleChoice("seed", f"auto: {why}")
    return ScheduleChoice("fused", AUTO_FUSED)


__all__ = ["AUTO", "AUTO_ORDER", "BACKENDS", "BACKEND_NAMES", "CUDA_DRIVER_NAMES",
           "OWN_KERNEL_BACKENDS", "PROFILED_BACKENDS", "SPECS", "STREAM_BACKENDS",
           "Availability", "BackendChoice", "BackendSpec", "ScheduleChoice", "availability",
           "choose_backend", "require_kernels", "resolve_schedule", "resolve_submission",
           "spec"]
