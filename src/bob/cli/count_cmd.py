"""`bob count`: a corpus of any size counted once into a counts file."""

from __future__ import annotations

import json
import logging
import math
import sys

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from bob.errors import BadInput
from bob.files import require_apart
from bob.host import api
from bob.records.sources import TOKEN_DTYPES

from .options import REPEAT_TOKENS, tokenizer_option, vocab_option

DEFAULT_OUT = "counts.safetensors"


@click.command()
@click.argument("inputs", nargs=-1)
@click.option("--tokens", "tokens", multiple=True, metavar="FILE",
              help=f"A token file (raw little-endian, or .npy) instead of text ({REPEAT_TOKENS}); "
                   "directories, globs and URLs work as for text.")
@vocab_option(help="V: the token vocabulary (with --tokens: this or --tokenizer; text: 256).")
@tokenizer_option("The tokenizer of the --tokens files: their V (a --vocab that differs is "
                  "refused).")
@click.option("--token-dtype", type=click.Choice(sorted(TOKEN_DTYPES)), default=None,
              help="Type of a raw token. Default: uint16 up to V=65536 (nanoGPT's train.bin), "
                   "uint32 above.")
@click.option("--out", "-o", default=DEFAULT_OUT, show_default=True,
              type=click.Path(dir_okay=False), help="The counts file to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing counts file.")
@click.option("--workers", "-j", type=int, help="Threads on this machine (default: all cores).")
@click.option("--dask", "dask", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]",
              help="Count on Dask: alone, a LocalCluster here; with an ADDRESS, that scheduler.")
@click.option("--dask-workers", type=click.IntRange(1), default=2, show_default=True,
              help="Workers of the LocalCluster that --dask starts.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON summary on stdout (the table goes to stderr).")
def count(inputs, tokens, vocab, tokenizer_path, token_dtype, out, overwrite, workers, dask,
          dask_workers, as_json) -> None:
    """Count the adjacent pairs of INPUTS (files, directories, globs, URLs, - for stdin).

    \b
    bob count corpus/ -o corpus.counts
    bob count --tokens train.bin --vocab 50257 -o owt.counts
    bob count --tokens train.bin --vocab 128256 -o llama.counts   # uint32 tokens
    bob count --tokens train.bin --tokenizer meta.pkl -o chars.counts
    bob train --counts corpus.counts
    """
    if inputs and tokens:
        words = " ".join(inputs)
        raise click.UsageError(
            f"{words}: text INPUTS beside --tokens files; give each token file its own "
            f"--tokens ({' '.join(f'--tokens {name}' for name in (*tokens, *inputs))}), or "
            "count text INPUTS alone")
    if not inputs and not tokens:
        raise click.UsageError("give the files to count (INPUTS or --tokens FILE)")
    if tokenizer_path is not None:
        if not tokens:
            raise BadInput("--tokenizer gives the V of --tokens files; text is counted as "
                           "bytes (V=256)")
        vocab = api.resolve_vocab(vocab, api.load_tokenizer(tokenizer_path))
        require_apart(out, "counts file", [(tokenizer_path, "tokenizer file")])
    if dask is not None:
        # Dask logs every failed attempt with its traceback; the command says it in one line.
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
    spec = api.CorpusSpec(texts=tuple(inputs), tokens=tuple(tokens), vocab=vocab,
                          token_dtype=token_dtype)
    progress = Progress(TextColumn("[bold]counting"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True,
                        disable=not sys.stderr.isatty())
    with progress:
        task = progress.add_task("count", total=None)

        def advance(done: int) -> None:
            progress.advance(task, done)

        report = api.count(spec, out, overwrite, workers, dask, dask_workers, advance)
    table = Table(title="bob count")
    table.add_column("")
    table.add_column("value", justify="right")
    for name, value in (
        ("files", f"{report.files:,}"),
        ("bytes", f"{report.bytes:,}"),
        ("V", f"{report.vocab} ({'sparse' if report.sparse else 'dense'})"),
        *((("read as", report.tokens_read_as),) if report.tokens_read_as else ()),
        ("transitions", f"{report.transitions:,}"),
        ("optimum (nats)", f"{report.optimum:.6f}"),
        ("counted on", report.where),
        ("time", f"{report.seconds:.2f} s, {byte_rate(report.bytes_per_second)}"),
        ("counts file", report.out),
    ):
        table.add_row(name, value)
    # With --json, stdout is the JSON alone (a program reads it); the table goes to stderr.
    shown = sys.stderr if as_json else sys.stdout
    Console(file=shown, width=None if shown.isatty() else 100).print(table)
    if as_json:
        click.echo(json.dumps(report.to_json()))


def byte_rate(bytes_per_second: float) -> str:
    """Three significant digits in the unit that fits: 812 B/s, 41.3 kB/s, 1.25 GB/s."""
    if not math.isfinite(bytes_per_second):
        return "too fast to time"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.3g} {unit}"
    return f"{bytes_per_second:.0f} B/s"


COMMANDS = (count,)
