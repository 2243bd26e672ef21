"""`bob bench`: Bob beside PyTorch, JAX and NumPy, per AdamW update, in one process."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from bob.bench.tables import DEVICES
from bob.config import MAX_UPDATES
from bob.files import atomic_write

from .options import check_vocab, submission_option

if TYPE_CHECKING:
    from bob.bench.tables import BenchTable

BENCH_BACKENDS = ("auto", *DEVICES)  # auto: cuda where usable, else cpu


def _number(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def render_table(table: BenchTable) -> Table:
    """One rich table: a device at one V."""
    from bob.bench.tables import BYTES_PER_PARAMETER

    title = (f"{table.device}: {table.device_name} - V={table.vocab}, {table.updates} updates "
             f"per timing, median of {table.repeats}")
    caption = ("ratio = row time / Bob's time (>1: Bob is faster); bob run = the device program "
               "alone, bob invocation = with checkpoint in/out")
    if table.shows_bandwidth:
        caption += (f"; GB/s counts {BYTES_PER_PARAMETER} bytes per parameter per update "
                    "(read + write of W, m, v)")
    out = Table(title=title, caption=caption)
    out.add_column("contender")
    out.add_column("us/update", justify="right")
    out.add_column("spread", justify="right")
    if table.shows_bandwidth:
        out.add_column("GB/s", justify="right")
    out.add_column("vs bob run", justify="right")
    out.add_column("vs bob invocation", justify="right")
    out.add_column(f"loss after {table.updates}", justify="right")
    out.add_column("note")
    for row in table.rows:
        spread = row.spread
        cells = [
            row.contender if row.kind != "host" else f"  {row.contender}",
            _number(row.us_per_update, 2 if (row.us_per_update or 0) < 100 else 1),
            "" if spread is None else f"{spread:.0%}",
        ]
        if table.shows_bandwidth:
            bandwidth = table.bandwidth(row)
            cells.append(_number(None if bandwidth is None else bandwidth / 1e9, 0))
        cells += [
            _ratio(table.ratio(row, "run")),
            _ratio(table.ratio(row, "invocation")),
            "" if row.loss is None else f"{row.loss:.6f}",
            row.error or row.note,
        ]
        style = "dim" if row.kind in ("host", "floor") or row.error else None
        out.add_row(*cells, style=style)
    return out


@click.command()
@click.option("--vocab", "-V", "vocabs", type=int, callback=check_vocab, multiple=True,
              help="Table size V (repeat for several). Default: 256 and 8192 on the GPU, "
                   "256 on the CPU.")
@click.option("--updates", "-N", type=click.IntRange(1, MAX_UPDATES), default=None,
              help="Updates per timing (per invocation for Bob). Default: on the GPU 1000 "
                   "for V <= 1024 and 100 above; on the CPU 100 and 5.")
@click.option("--repeats", "-r", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Timings per contender (after one warm-up); the median is reported.")
@click.option("--backend", "backends", type=click.Choice(BENCH_BACKENDS), multiple=True,
              help="Which tables: cuda, cpu, or auto (cuda where usable, else cpu); "
                   "repeat for several. Default: auto.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the JSON report to this file.")
@submission_option("per-launch for Bob's cuda and cpu rows; chained for the nv rows, with "
                   "a per-launch nv seed row beside them")
def bench(vocabs, updates, repeats, backends, as_json, save, submission) -> None:
    """Microseconds per AdamW update: Bob beside its peers, side by side.

    Every contender trains the hard-target objective from a zero table with
    lr 0.1, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on the same random
    targets. No timing is asserted anywhere: the numbers are for reading.
    """
    from bob.bench.suite import run_bench

    errors = Console(stderr=True)

    def progress(text: str) -> None:
        errors.print(f"[dim]bench: {text}[/dim]", highlight=False)

    words = ["bob", "bench"]
    words += [word for name in backends for word in ("--backend", name)]
    words += [word for vocab in vocabs for word in ("--vocab", str(vocab))]
    if updates is not None:
        words += ["--updates", str(updates)]
    words += ["--repeats", str(repeats), "--submission", submission]
    command = shlex.join(words)
    report = run_bench(backends, vocabs, updates, repeats, progress=progress, command=command,
                       submission=submission)
    document = json.dumps(report.to_json(), indent=1)
    if save is not None:
        atomic_write(save, (document + "\n").encode("utf-8"))
    if as_json:
        click.echo(document)
    else:
        console = Console(width=None if sys.stdout.isatty() else 180)
        for table in report.tables:
            console.print(render_table(table))
    if report.bob_failed:
        click.echo("bob bench: a Bob row failed (see its note)", err=True)
        click.get_current_context().exit(1)


COMMANDS = (bench,)
