"""`bob train`, `predict`, `generate`, `eval`, `plot`: the model at work."""

from __future__ import annotations

import json
import math
import os
import sys

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from bob.config import MAX_UPDATES, Hyper
from bob.errors import BadInput
from bob.host import api

from .options import (
    ARENA_OPTION,
    BACKEND_OPTION,
    SCHEDULE_OPTION,
    SUBMISSION_OPTION,
    arch_option,
    hyper_options,
)

_ARCH = arch_option("Target of the nv-sim backend.")
_CHECKPOINT = click.option("--checkpoint", "-c", default=api.DEFAULT_CHECKPOINT,
                           show_default=True, type=click.Path(dir_okay=False),
                           help="The safetensors checkpoint.")


def _err_console() -> Console:
    return Console(stderr=True)


def _byte_text(value: int) -> str:
    return repr(bytes([value]))[2:-1] if value < 256 else f"<{value}>"


@click.command()
@click.option("--text", "texts", multiple=True, type=click.Path(dir_okay=False),
              help="Train on this text file (repeat for several). Default: the built-in "
                   "corpus.")
@click.option("--input", "input_record", type=click.Path(dir_okay=False),
              help="Train on an input record (hard targets or corpus weights) instead.")
@click.option("--steps", type=click.IntRange(0), default=1000, show_default=True,
              help="AdamW updates to make.")
@_CHECKPOINT
@click.option("--resume", is_flag=True, help="Continue the checkpoint's run.")
@click.option("--overwrite", is_flag=True, help="Start again over an existing checkpoint.")
@BACKEND_OPTION
@_ARCH
@ARENA_OPTION
@click.option("--updates-per-invocation", "-N", type=click.IntRange(1, MAX_UPDATES),
              default=api.DEFAULT_UPDATES_PER_INVOCATION, show_default=True,
              help="Updates in one plan; a checkpoint is written after each invocation.")
@hyper_options
@click.option("--result", "result_path", type=click.Path(dir_okay=False),
              help="Write the last invocation's result record here.")
@SCHEDULE_OPTION
@SUBMISSION_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary as the last line.")
def train(texts, input_record, steps, checkpoint, resume, overwrite, backend, arch, arena,
          updates_per_invocation, lr, beta1, beta2, eps, weight_decay, result_path, schedule,
          submission, as_json) -> None:
    """Train the bigram table with AdamW, a checkpoint after every invocation."""
    # The API's refusals in its own words; here in the command's.
    if texts and input_record is not None:
        raise BadInput("give either --text files or an --input record, not both")
    if not resume and not overwrite and os.path.exists(checkpoint):
        raise BadInput(f"{checkpoint}: exists; pass --resume to continue it or --overwrite "
                       "to start again")
    hyper = Hyper(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    progress = Progress(TextColumn("[bold]training"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} updates"),
                        TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(),
                        console=_err_console(), transient=True,
                        disable=not sys.stderr.isatty())
    with progress:
        task = progress.add_task("train", total=steps, loss="-")

        def advance(invocation, done) -> None:
            progress.update(task, completed=done, loss=f"{invocation.loss:.6f}")

        report = api.train(
            texts=list(texts) or None, steps=steps, checkpoint=checkpoint, resume=resume,
            backend=backend, hyper=None if resume and _defaults(hyper) else hyper,
            updates_per_invocation=updates_per_invocation, input_record=input_record,
            overwrite=overwrite, arch=arch, arena=arena, result_path=result_path,
            schedule=schedule, progress=advance, submission=submission)
    table = Table(title=f"bob train ({report.backend} backend, {report.mode} mode)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("data", report.data)
    table.add_row("updates (this run / total)", f"{report.steps} / {report.global_step}")
    table.add_row("initial loss (nats)", f"{report.initial_loss:.6f}")
    table.add_row("loss (nats)", f"{report.loss:.6f}")
    if report.optimum is not None:
        table.add_row("optimum (nats)", f"{report.optimum:.6f}")
        table.add_row("above optimum", f"{100 * report.gap:.3f}%")
    table.add_row("checkpoint", report.checkpoint)
    Console(width=None if sys.stdout.isatty() else 100).print(table)
    if as_json:
        click.echo(json.dumps(report.to_json()))


def _defaults(hyper: Hyper) -> bool:
    return hyper == Hyper()


@click.command()
@_CHECKPOINT
@click.argument("prompts", nargs=-1, required=True)
@BACKEND_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as JSON.")
def predict(checkpoint, prompts, backend, as_json) -> None:
    """Predict the byte after each PROMPT (greedy argmax of its last byte's row)."""
    results = api.predict(checkpoint, [p.encode() for p in prompts], backend)
    if as_json:
        click.echo(json.dumps([{"prompt": p.decode(errors="replace"), "next": nxt,
                                "next_text": bytes([nxt]).decode("latin-1")}
                               for p, nxt, _ in results]))
        return
    for prompt, nxt, logits in results:
        click.echo(f"{prompt.decode(errors='replace')!r} -> {_byte_text(nxt)!r} "
                   f"(logit {float(logits[nxt]):.4f})")


@click.command()
@_CHECKPOINT
@click.option("--prompt", "-p", required=True, help="Text to continue.")
@click.option("--length", "-n", type=click.IntRange(0, 10_000_000), default=200,
              show_default=True, help="Bytes to generate.")
@click.option("--temperature", "-t", type=click.FloatRange(0), default=0.0, show_default=True,
              help="0 is greedy; above 0 samples.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Sampling seed: the same seed gives the same text on every backend.")
@BACKEND_OPTION
def generate(checkpoint, prompt, length, temperature, seed, backend) -> None:
    """Continue a prompt, greedily or by sampling."""
    text = api.generate(checkpoint, prompt.encode(), length, temperature, seed, backend)
    sys.stdout.write(prompt + text.decode("utf-8", errors="replace") + "\n")


@click.command(name="eval")
@_CHECKPOINT
@click.option("--text", "texts", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Text file to evaluate on (repeat for several).")
@BACKEND_OPTION
@click.option("--json", "as_json", is_flag=True)
def eval_(checkpoint, texts, backend, as_json) -> None:
    """Loss of the model on text: nats per transition, bits per byte, and the optimum."""
    report = api.evaluate(checkpoint, list(texts), backend)
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    table = Table(title=f"bob eval on {report.text}")
    table.add_column("")
    table.add_column("nats / transition", justify="right")
    table.add_column("bits / byte", justify="right")
    table.add_row("model", f"{report.nats:.6f}", f"{report.bits_per_byte:.6f}")
    table.add_row("optimum (bigram)", f"{report.optimum:.6f}",
                  f"{report.optimum / math.log(2):.6f}")
    table.add_row("transitions", f"{report.transitions:,}", "")
    Console(width=None if sys.stdout.isatty() else 100).print(table)


@click.command()
@_CHECKPOINT
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the PNG files.")
def plot(checkpoint, out_dir) -> None:
    """Draw the loss curve and the learned transition heat map as PNG."""
    from bob.files import make_directory
    from bob.host.plot import loss_curve, transition_heat_map
    from bob.records.checkpoint import Checkpoint
    from bob.records.png import write_png

    state = Checkpoint.load(checkpoint)
    make_directory(out_dir)
    written = []
    if state.history:
        steps, losses = zip(*state.history, strict=True)
        path = os.path.join(out_dir, "loss.png")
        write_png(path, loss_curve(list(steps), list(losses), state.optimum))
        written.append(path)
    path = os.path.join(out_dir, "transitions.png")
    write_png(path, transition_heat_map(state.parameters, 2 if state.vocab <= 512 else 1))
    written.append(path)
    for path in written:
        click.echo(path)
    if not state.history:
        click.echo("(no loss history in this checkpoint: no loss curve)", err=True)


COMMANDS = (train, predict, generate, eval_, plot)
