"""`bob bench`: Bob beside PyTorch, JAX and NumPy, per AdamW update, in one process; in
corpus mode the whole `bob train` beside PyTorch's eager loop end to end, as processes.

The suite is tooling of the source repository (``dev/bench``), which the wheel does not
ship: from a checkout, where ``dev/`` lies beside ``src/`` (the Makefile's editable
install, or ``PYTHONPATH=src``), this command runs it; elsewhere it says how to get it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import bob
from bob.config import MAX_UPDATES, MODES
from bob.errors import BadInput
from bob.files import check_output_file

from .options import KERNELS_OPTION, check_vocab, submission_option

BENCH_BACKENDS = ("auto", "cpu", "cuda")  # auto: cuda where usable, else cpu
NO_CHECKOUT = ("the bench suite lives in Bob's source repository, not in this installation: "
               "clone the repository and run `make bench` there")


def checkout_root() -> Path | None:
    """The source checkout this Bob runs from (``src/bob`` beside ``dev/bench``), or None."""
    package = Path(bob.__file__).resolve().parent
    root = package.parent.parent
    if package.parent.name == "src" and (root / "dev" / "bench" / "__init__.py").is_file():
        return root
    return None


@click.command()
@click.option("--vocab", "-V", "vocabs", type=int, callback=check_vocab, multiple=True,
              help="Table size V (repeat for several). Default: 256 and 8192 on the GPU, "
                   "256 on the CPU.")
@click.option("--updates", "-N", type=click.IntRange(1, MAX_UPDATES), default=None,
              help="Updates per invocation, as bob train -N: Bob's rows time invocations of "
                   "N updates, the other contenders loops of N updates. Default: on the GPU "
                   "1000 for V <= 1024 and 100 above (corpus mode: 20 past V = 16384); on the "
                   "CPU 100 and 5.")
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
@click.option("--mode", type=click.Choice(MODES), default="hard", show_default=True,
              help="The objective: hard targets, or a corpus (sparse weights; adds the whole "
                   "`bob train` beside PyTorch's eager loop end to end).")
@click.option("--tokens", type=click.Path(dir_okay=False, exists=True),
              help="Corpus mode: train on this token file's pairs (uint16, or .npy), counted "
                   "with Bob's counter. Default: a random corpus of 64 pairs per row, and for "
                   "the whole commands a token corpus made for V.")
@click.option("--val-tokens", type=click.Path(dir_okay=False, exists=True),
              help="The whole commands' validation tokens (default: the --tokens file).")
@KERNELS_OPTION
@click.option("--compute-floor", is_flag=True,
              help="On the GPU, also the compute floor beside the memory floor: the fused "
                   "kernels' executed instructions (counted by Nsight Compute, `ncu` on "
                   "PATH) over the SMs' issue rate.")
def bench(vocabs, updates, repeats, backends, as_json, save, submission, mode, tokens,
          val_tokens, kernels, compute_floor) -> None:
    """Microseconds per AdamW update: Bob beside its peers, side by side.

    Every contender trains the same objective from a zero table with lr 0.1,
    betas 0.9/0.999, eps 1e-8, weight decay 0.01: the hard targets' (random
    targets), or with --mode corpus the corpus loss on the same weights. No
    timing is asserted anywhere: the numbers are for reading. Runs from a source
    checkout (`make bench`). With --kernels own (and --backend cuda) the nv rows
    gain the seed schedule's rows on Bob's own machine code.
    """
    root = checkout_root()
    if root is None:
        raise BadInput(NO_CHECKOUT)
    if save is not None:
        check_output_file(save, "bench report")  # before the minutes the suite takes
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the checkout's dev/ imports as the package `dev`
    from dev.bench import cli as suite
    from dev.bench.suite import require_bench_kernels

    require_bench_kernels(kernels, backends)  # --kernels own: rows beside nv's, on cuda
    status = suite.bench(vocabs, updates, repeats, backends, as_json, save, submission, mode,
                         tokens, val_tokens, kernels, compute_floor)
    if status:
        click.get_current_context().exit(status)


COMMANDS = (bench,)
