"""Where an invocation's device time goes: one training invocation, then its submissions
run again with every launch timed by the backend (``Backend.profile``), per region.
``bob profile`` prints it; the own-kernel bring-up (``dev.bringup.own_variants``) and the
GPU tests compare regions with it.

    plan, launches = profiled_invocation("nv", config, kernels="own")
    region_times(plan, launches)     # per region: launches, total and longest ns
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob import config
from bob.backends import Backend, choose_backend
from bob.backends.registry import require_kernels
from bob.config import Hyper
from bob.errors import RunFailure
from bob.plan.model import Plan
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint

TARGET_SEED = 0  # the profiled targets: `bob bench`'s (dev/bench/peers.bench_targets)


@dataclass(frozen=True)
class RegionTime:
    """The device time of one region's launches in the profiled invocation."""

    region: str
    launches: int
    total_ns: int
    max_ns: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.launches


def region_times(plan: Plan, launch_times: Sequence[tuple[int, int]]) -> list[RegionTime]:
    """Per region, in the order regions first run: launches, total and longest time."""
    found: dict[str, list[int]] = {}
    for launch, nanoseconds in launch_times:
        if not 0 <= launch < plan.launch_count:
            raise RunFailure(f"a timed launch {launch} is not in the plan's {plan.launch_count}")
        if nanoseconds < 0:
            raise RunFailure(f"launch {launch} took {nanoseconds} ns: a negative device time")
        found.setdefault(plan.launches[launch].region, []).append(nanoseconds)
    return [RegionTime(region, len(times), sum(times), max(times))
            for region, times in found.items()]



def profiled_invocation(backend_name: str, bob_config, hyper: Hyper = Hyper(),
                        kernels: str = config.DEFAULT_KERNELS,
                        ) -> tuple[Plan, list[tuple[int, int]]]:
    """One training invocation, then its submissions again, every launch timed: the plan
    and (launch index, device ns) per launch run."""
    from bob.host.own_code import require_covered
    from bob.host.session import Session

    require_kernels(kernels, (backend_name,))
    choice = choose_backend(backend_name, kernels=kernels)
    require_covered(choice, bob_config)  # Bob's own code runs the plan, before any work
    opener = choice.opener
    assert opener is not None

    def open_timed(plan) -> Backend:
        backend = opener(plan)
        if not backend.can_profile:  # refused before anything runs
            backend.close()
            raise RunFailure(f"the {choice.name} backend cannot time its launches")
        return backend

    vocab = bob_config.vocab
    targets = np.random.default_rng(TARGET_SEED).integers(0, vocab, vocab, dtype=np.uint32)
    if bob_config.mode == "hard":
        record = InputRecord.hard(targets, (), source="profile targets")
    else:  # corpus mode: the plan's K random pairs
        from bob.host.check import random_record

        record = random_record(bob_config, TARGET_SEED)
    with Session(replace(choice, opener=open_timed), hyper) as session:
        plan = session.plan_for(bob_config)
        session.invoke(bob_config, Checkpoint.zeros(vocab, hyper, bob_config.mode), record,
                       "train")
        backend = session.last_backend
        assert backend is not None
        # The invocation's scalars are still in the parameter blocks: the same launches.
        return plan, backend.profile(range(plan.submission_count))
