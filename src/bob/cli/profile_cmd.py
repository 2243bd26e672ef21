"""`bob profile`: where an invocation's device time goes, launch by launch, per region.

    bob profile --backend nv --vocab 256 --updates 100
    bob profile --backend cuda --schedule fused --json

One training invocation (``Session.invoke``: load, scalars, run, read back and
checked), then its submissions run again with every launch timed by the backend
(``Backend.profile``, on the backends whose registry spec says how they time):

- ``nv``: every submission between two host semaphore releases that wait for
  idle and carry the GPU's nanosecond clock (a 16-byte structure each), in
  Bob's own command stream; no CUPTI. This times one launch per submission,
  so the plan is built with the per-launch submission policy.
- ``cuda``: every launch alone on one stream between two ``cuEventRecord``
  (not the graph, whose launches cannot be bracketed).

Either way each launch starts on an idle device: the table shows what a launch
costs on its own, not what it costs overlapped in the graph or a chained stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from bob import config
from bob.backends import Backend, choose_backend, spec
from bob.backends.registry import PROFILED_BACKENDS, require_kernels
from bob.config import Hyper
from bob.errors import BadInput, RunFailure
from bob.plan.model import Plan
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint

from .options import KERNELS_OPTION, MODE_OPTION, SCHEDULE_OPTION, config_from, vocab_option

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


def _microseconds(nanoseconds: float) -> str:
    return f"{nanoseconds / 1000:,.2f}"


def render(rows: list[RegionTime], title: str, caption: str) -> Table:
    table = Table(title=title, caption=caption)
    for name in ("region", "launches", "total us", "mean us", "max us"):
        table.add_column(name, justify="left" if name == "region" else "right")
    for row in rows:
        table.add_row(row.region, str(row.launches), _microseconds(row.total_ns),
                      _microseconds(row.mean_ns), _microseconds(row.max_ns))
    total = sum(row.total_ns for row in rows)
    launches = sum(row.launches for row in rows)
    table.add_row("all", str(launches), _microseconds(total),
                  _microseconds(total / launches) if launches else "-",
                  _microseconds(max((row.max_ns for row in rows), default=0)), style="bold")
    return table


def report(backend_name: str, plan: Plan, launch_times: Sequence[tuple[int, int]]) -> dict:
    rows = region_times(plan, launch_times)
    return {
        "backend": backend_name,
        "method": spec(backend_name).profile_method or "the backend's own launch timer",
        "plan_launches": plan.launch_count,
        "timed_launches": len(launch_times),
        "regions": [{"region": row.region, "launches": row.launches,
                     "total_us": row.total_ns / 1000, "mean_us": row.mean_ns / 1000,
                     "max_us": row.max_ns / 1000} for row in rows],
    }


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


@click.command()
@click.option("--backend", "backend_name", type=click.Choice(PROFILED_BACKENDS),
              default="cuda", show_default=True, help="Where the invocation runs.")
@vocab_option(256)
@click.option("--updates", "-N", type=click.IntRange(1, config.MAX_UPDATES), default=100,
              show_default=True, help="N: AdamW updates in the invocation.")
@MODE_OPTION
@SCHEDULE_OPTION
@click.option("--submission", type=click.Choice(config.SUBMISSION_POLICIES),
              default="per-launch", show_default=True,
              help="The plan's submission policy; nv times launches one per submission only.")
@KERNELS_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def profile(backend_name, vocab, updates, mode, schedule, submission, kernels, as_json) -> None:
    """Run one training invocation, then its launches again timed: each region's device time.

    \b
    bob profile --backend nv -V 256 -N 100
    bob profile --backend cuda --schedule fused --json
    bob profile --backend nv --kernels own
    """
    require_kernels(kernels, (backend_name,))  # before any work
    if backend_name == "nv" and submission != "per-launch":
        raise BadInput("profiling on nv times one launch per submission: use --submission "
                       "per-launch (chained submissions cannot be bracketed launch by launch)")
    from bob.host.own_code import require_own_plan
    from bob.plan.placement import TARGETS

    bob_config = config_from(vocab, 0, updates, mode, schedule, submission)
    require_own_plan(kernels, bob_config, TARGETS[config.DEFAULT_TARGET])  # before any work
    plan, times = profiled_invocation(backend_name, bob_config, kernels=kernels)
    result = {**report(backend_name, plan, times), "kernels": kernels}
    if as_json:
        click.echo(json.dumps(result))
        return
    title = (f"bob profile: {backend_name}, V={vocab}, {updates} updates, {mode}, {schedule} "
             f"schedule, {kernels} kernels, {result['timed_launches']} of the plan's "
             f"{plan.launch_count} launches")
    Console().print(render(region_times(plan, times), title, f"device time: {result['method']}"))


COMMANDS = [profile]
