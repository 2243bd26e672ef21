"""`bob check` and `bob doctor`: comparing and inspecting backends."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bob.backends.registry import BACKENDS, STREAM_BACKENDS, require_kernels, resolve_submission
from bob.cli.options import config_from
from bob.config import MAX_UPDATES

from .options import (
    KERNELS_OPTION,
    MODE_OPTION,
    SCHEDULE_OPTION,
    arch_option,
    prompts_option,
    submission_option,
    vocab_option,
)

_CHOICES = BACKENDS  # two named backends: "auto" would compare a backend with itself
_IN_ORDER = " and ".join(name for name in BACKENDS if name not in STREAM_BACKENDS)


def _backend_pair(text: str) -> tuple[str, str]:
    names = tuple(part.strip() for part in text.split(","))
    if len(names) != 2 or not all(n in _CHOICES for n in names):
        raise click.BadParameter(f"expected two of {', '.join(_CHOICES)} separated by a comma, "
                                 f"not {text!r}", param_hint="--backends")
    return names  # type: ignore[return-value]


@click.command()
@click.option("--backends", default="cpu,nv-sim", show_default=True,
              help="Two backends to compare, e.g. cpu,cuda.")
@vocab_option(256)
@prompts_option(2)
@click.option("--updates-per-invocation", "-N", type=click.IntRange(1, MAX_UPDATES), default=10,
              show_default=True,
              help="Updates per invocation (as bob train -N): every tensor is compared after "
                   "each invocation.")
@click.option("--steps", type=click.IntRange(0), default=25, show_default=True,
              help="AdamW updates in all, run as invocations of -N (the last one shorter).")
@MODE_OPTION
@arch_option("Target of nv-sim.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Seed of the random targets (or corpus) and prompts both backends run on.")
@SCHEDULE_OPTION
@submission_option(f"chained when either backend is {' or '.join(sorted(STREAM_BACKENDS))} (one "
                   f"plan serves both; {_IN_ORDER} run any policy's launches in order), else "
                   "per-launch")
@KERNELS_OPTION
@click.option("--json", "as_json", is_flag=True)
def check(backends, vocab, prompts, updates_per_invocation, steps, mode, arch, seed, schedule,
          submission, kernels, as_json) -> None:
    """Run the same invocations on two backends; report the first byte that differs
    (--kernels own: the nv or nv-sim of the pair runs Bob's own kernels)."""
    from bob.host.check import differential_check
    from bob.host.own_code import require_own_plan
    from bob.plan.placement import TARGETS

    pair = _backend_pair(backends)
    require_kernels(kernels, pair)  # before any work
    config = config_from(vocab, prompts, updates_per_invocation, mode, schedule,
                         resolve_submission(submission, *pair))
    require_own_plan(kernels, config, TARGETS[arch])  # the plan, before any work
    report = differential_check(pair, config, steps, seed=seed, arch=arch, kernels=kernels)
    if as_json:
        click.echo(json.dumps({
            "backends": list(pair), "submission": config.submission, "kernels": kernels,
            "identical": report.identical,
            "invocations": report.invocations, "bytes_compared": report.bytes_compared,
            "difference": None if report.identical else str(report.difference)}))
    elif report.identical:
        click.echo(f"{pair[0]} and {pair[1]} agree: every byte of every tensor after each of "
                   f"{report.invocations} invocations ({report.bytes_compared:,} bytes; "
                   f"{config.submission} submissions)")
    else:
        click.echo(f"{pair[0]} and {pair[1]} DIFFER: {report.difference}")
    if not report.identical:
        click.get_current_context().exit(1)


@click.command()
@click.option("--json", "as_json", is_flag=True,
              help='Print {"backends": [...], "gpus": [...], "gpus_note": ...} as JSON.')
def doctor(as_json) -> None:
    """Which backends can run here, and why not; the GPUs the CUDA driver sees."""
    from bob.host.doctor import diagnose, list_gpus

    rows = diagnose()
    gpus, note = list_gpus()
    if as_json:
        click.echo(json.dumps({"backends": rows, "gpus": gpus, "gpus_note": note}, indent=1))
        return
    console = Console(width=None if sys.stdout.isatty() else 140)
    table = Table(title="bob doctor")
    for column in ("backend", "usable", "details"):
        table.add_column(column)
    for row in rows:
        # escape: details such as "pip install 'bob-bigram[cuda]'" are text, not rich markup
        table.add_row(row["backend"], "yes" if row["usable"] else "no", escape(row["details"]))
    console.print(table)
    if not gpus:  # markup off: the note is printed as it is, nothing to escape
        console.print(note, markup=False, highlight=False)
        return
    console.print(f"{note} (bob train --gpus numbers them so):", markup=False,
                  highlight=False)
    listed = Table()
    for column in ("gpu", "name", "arch", "memory", "SMs"):
        listed.add_column(column, justify="right" if column in ("gpu", "memory", "SMs")
                          else "left")
    for gpu in gpus:
        listed.add_row(str(gpu["gpu"]), escape(gpu["name"]), gpu["arch"],
                       f"{gpu['memory_bytes'] / 2**30:.1f} GiB", str(gpu["multiprocessors"]))
    console.print(listed)


COMMANDS = (check, doctor)
