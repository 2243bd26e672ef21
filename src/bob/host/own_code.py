"""Which plans run on Bob's own machine code: a plan held to what own code covers before any
work, and `--schedule auto` resolved to a schedule it covers.

A backend choice whose `kernels` is "own" (``--kernels own`` on nv or nv-sim, or nv where
NVRTC is not installed: `own_only`) runs Bob's own code for the plan's regions that
``bob.kernels.own`` covers at the plan's V. The schedule's kernels must all be Bob's; the
regions every plan holds beside them are NVRTC's where Bob has none, unless NVRTC is not
installed (``bob.kernels.own_regions.coverage_refusal`` says the rule and the refusal).

    require_covered(choice, config)          # BadInput, one line, naming the regions
    schedule_for("auto", choice, config)     # fused where own code covers it, else seed
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from bob.backends.registry import BackendChoice, ScheduleChoice, resolve_schedule
from bob.config import AUTO_SCHEDULE, DEFAULT_KERNELS
from bob.errors import BadInput
from bob.plan.model import Target
from bob.program.bob import BobConfig
from bob.program.plans import build_plan


def coverage_refusal(names: Iterable[str], vocab: int, nvrtc: bool = True) -> str | None:
    """bob.kernels.own_regions.coverage_refusal, imported only where own code is asked for
    (it brings Bob's kernel builders)."""
    from bob.kernels.own_regions import coverage_refusal as refusal_of

    return refusal_of(names, vocab, nvrtc)


def collapsed_refusal() -> str | None:
    """bob.kernels.own_regions.collapsed_refusal, imported only when asked."""
    from bob.kernels.own_regions import collapsed_refusal as refusal_of

    return refusal_of()


def plan_regions(config: BobConfig, target: Target) -> tuple[str, ...]:
    """The regions `config`'s plan launches on `target` (the ones it places)."""
    return tuple(placed.name for placed in build_plan(config, target).placed_regions)


def refusal(config: BobConfig, target: Target, nvrtc: bool = True) -> str | None:
    """Why Bob's own code cannot run `config`'s plan on `target` (one line), or None."""
    return coverage_refusal(plan_regions(config, target), config.vocab, nvrtc)


def require_own_plan(kernels: str, config: BobConfig, target: Target) -> None:
    """BadInput, before any backend is chosen, where ``--kernels own`` cannot run `config`'s
    plan on `target` even with NVRTC beside it (nothing to hold for ``nvrtc``)."""
    if kernels != DEFAULT_KERNELS:
        found = refusal(config, target)
        if found:
            raise BadInput(found)


def require_regions_covered(choice: BackendChoice, names: Iterable[str], vocab: int) -> None:
    """BadInput unless `choice` runs a plan of the regions `names` at vocabulary `vocab`
    (nothing to hold where its regions are NVRTC's)."""
    if choice.kernels == DEFAULT_KERNELS:
        return
    found = coverage_refusal(names, vocab, nvrtc=not choice.own_only)
    if found:
        raise BadInput(found)


def covers(choice: BackendChoice, config: BobConfig) -> bool:
    """Whether `choice` runs `config`'s plan (always where its regions are NVRTC's)."""
    return choice.kernels == DEFAULT_KERNELS or refusal(
        config, choice.target, nvrtc=not choice.own_only) is None


def require_covered(choice: BackendChoice, config: BobConfig) -> None:
    """BadInput, before any work, unless `choice` runs `config`'s plan."""
    if choice.kernels != DEFAULT_KERNELS:
        require_regions_covered(choice, plan_regions(config, choice.target), config.vocab)


def schedule_for(requested: str, choice: BackendChoice, config: BobConfig) -> ScheduleChoice:
    """The schedule a one-piece run of `config` (its schedule aside) builds on `choice`:
    resolve_schedule's, where "auto" with Bob's own code is the fused schedule only where
    own code covers the fused plan."""
    own_fused = (requested == AUTO_SCHEDULE and choice.kernels != DEFAULT_KERNELS
                 and refusal(replace(config, schedule="fused"), choice.target,
                             nvrtc=not choice.own_only) is None)
    return resolve_schedule(requested, choice.name, choice.kernels, own_fused=own_fused)
