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

import click
from rich.console import Console
from rich.table import Table

from bob import config
from bob.backends import spec
from bob.backends.registry import PROFILED_BACKENDS, require_kernels
from bob.errors import BadInput
from bob.host.profiling import (  # noqa: F401 - TARGET_SEED: what `bob profile` trains on
    TARGET_SEED,
    RegionTime,
    profiled_invocation,
    region_times,
)
from bob.plan.model import Plan

from .options import KERNELS_OPTION, MODE_OPTION, SCHEDULE_OPTION, config_from, vocab_option


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
