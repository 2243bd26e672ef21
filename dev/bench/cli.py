"""What ``bob bench`` runs behind its face (``bob.cli.bench_cmd``, which holds the options):
the suite, its report saved as JSON, and the tables printed or the report as JSON."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bob.config import DEFAULT_KERNELS
from bob.files import atomic_write
from dev.bench.suite import run_bench
from dev.bench.tables import BYTES_PER_PARAMETER, BenchTable


def _number(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _memory(value: int | None) -> str:
    return "" if value is None else f"{value / 1e9:.2f} GB"


def render_table(table: BenchTable) -> Table:
    """One rich table: a device at one V."""
    workload = f"{table.mode} mode" + (f", {table.data}" if table.data else "")
    title = (f"{table.device}: {table.device_name} - V={table.vocab} {workload}, "
             f"{table.updates} updates per timing, median of {table.repeats}")
    caption = ("ratio = row time / Bob's time (>1: Bob is faster); bob run = the device program "
               "alone, bob invocation = with checkpoint in/out")
    if table.shows_commands:
        caption += ("; vs bob command = a whole process's time (start to exit) over the whole "
                    "`bob train`'s")
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
    if table.shows_commands:
        out.add_column("vs bob command", justify="right")
    if table.shows_memory:
        out.add_column("peak RSS", justify="right")
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
        cells += [_ratio(table.ratio(row, "run")), _ratio(table.ratio(row, "invocation"))]
        if table.shows_commands:
            cells.append(_ratio(table.ratio(row, "command")))
        if table.shows_memory:
            cells.append(_memory(row.peak_rss_bytes))
        cells += ["" if row.loss is None else f"{row.loss:.6f}", row.error or row.note]
        style = "dim" if row.kind in ("host", "floor") or row.error else None
        out.add_row(*cells, style=style)
    return out


def bench(vocabs: Sequence[int], updates: int | None, repeats: int, backends: Sequence[str],
          as_json: bool, save: Path | None, submission: str, mode: str = "hard",
          tokens: str | None = None, val_tokens: str | None = None,
          kernels: str = DEFAULT_KERNELS, compute_floor: bool = False) -> int:
    """Run the suite as the command's options ask; the exit status (1: a Bob row failed)."""
    errors = Console(stderr=True)

    def progress(text: str) -> None:
        errors.print(f"[dim]bench: {text}[/dim]", highlight=False)

    words = ["bob", "bench"]
    words += [word for name in backends for word in ("--backend", name)]
    words += [word for vocab in vocabs for word in ("--vocab", str(vocab))]
    if updates is not None:
        words += ["--updates", str(updates)]
    words += ["--repeats", str(repeats), "--submission", submission, "--mode", mode]
    words += [word for flag, path in (("--tokens", tokens), ("--val-tokens", val_tokens))
              if path is not None for word in (flag, path)]
    if kernels != DEFAULT_KERNELS:
        words += ["--kernels", kernels]
    if compute_floor:
        words.append("--compute-floor")
    command = shlex.join(words)
    report = run_bench(backends, vocabs, updates, repeats, progress=progress, command=command,
                       submission=submission, mode=mode,  # type: ignore[arg-type]
                       tokens=tokens, val_tokens=val_tokens, kernels=kernels,
                       compute_floor=compute_floor)
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
        return 1
    return 0
