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
from bob.files import (
    check_output_directory,
    check_output_file,
    require_apart,
    write_directory,
)
from bob.host import api

from .options import (
    ARENA_OPTION,
    BACKEND_OPTION,
    FILE_OPTIONS,
    KERNELS_OPTION,
    REPEAT_TEXT,
    REPEAT_TOKENS,
    REPEAT_VAL_TEXT,
    REPEAT_VAL_TOKENS,
    SUBMISSION_OPTION,
    TABLES_OPTION,
    TRAIN_SCHEDULE_OPTION,
    ByteSize,
    GpuList,
    arch_option,
    hyper_options,
    refuse_extra_arguments,
    schedule_options,
    tokenizer_option,
    vocab_option,
)
from .progress import Heartbeat, ProgressLog

_ARCH = arch_option("Target of the nv-sim backend.")
_CHECKPOINT = click.option("--checkpoint", "-c", default=api.DEFAULT_CHECKPOINT,
                           show_default=True, type=click.Path(dir_okay=False),
                           help="The safetensors checkpoint.")


_TOKEN_DTYPE = click.option("--token-dtype", type=click.Choice(["uint16", "uint32"]),
                            default=None,
                            help="Type of a raw token in --tokens/--val-tokens files. Default: "
                                 "uint16 up to V=65536 (nanoGPT's train.bin), uint32 above.")


def _data_options(tokens_v: str, vocab_help: str):
    """--tokens, --vocab, --counts, --tokenizer: corpus data beside --text (`bob count`
    makes counts); `tokens_v` says where the V of --tokens files comes from."""
    def decorate(function):
        for option in reversed((
            click.option("--tokens", "tokens", multiple=True, metavar="FILE",
                         help=f"A token file (raw uint16/uint32 or .npy; {REPEAT_TOKENS}); "
                              f"{tokens_v}."),
            vocab_option(help=vocab_help),
            _TOKEN_DTYPE,
            click.option("--counts", "counts_file", type=click.Path(dir_okay=False),
                         help="A counts file from `bob count`: no recount."),
            tokenizer_option("The tokenizer of the --tokens files: their V (a --vocab that "
                             "differs is refused)."),
        )):
            function = option(function)
        return function
    return decorate


def _shard_options(function):
    """--shards, --workers, --gpus, --device-memory, --dask: the table as row shards
    (`bob.host.sharded`), in turn on one device or side by side on Dask workers."""
    for option in reversed((
        click.option("--shards", type=int, default=None, metavar="K",
                     help="Train the table as K row shards, each a plan of its own; in turn "
                          "on one device unless --workers, --gpus or --dask run them side by "
                          "side. The checkpoint is then sharded (an index and K files)."),
        click.option("--device-memory", type=ByteSize(), default=None, metavar="SIZE",
                     help="The most device memory a shard's arena may take (512M, 8G): the "
                          "fewest shards that fit, in turn."),
        click.option("--workers", type=int, default=None, metavar="N",
                     help="Shards side by side on a Dask cluster of N worker processes here "
                          "(one shard each unless --shards)."),
        click.option("--gpus", type=GpuList(), default=None,
                     help="Shards side by side, a Dask worker per GPU listed (0,1,2,3), "
                          "each seeing its GPU alone."),
        click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
                     help="Shards on the workers of the Dask scheduler at ADDRESS."),
    )):
        function = option(function)
    return function


def _spec(tokens, vocab, token_dtype, counts_file, texts=()) -> api.CorpusSpec | None:
    spec = api.CorpusSpec(texts=tuple(texts), tokens=tuple(tokens), counts=counts_file,
                          vocab=vocab, token_dtype=token_dtype)
    return spec if spec.given else None


def _tokenizer(path: str | None) -> api.Tokenizer | None:
    return None if path is None else api.load_tokenizer(path)


def _ids(text: str) -> list[int]:
    try:
        return [int(word) for word in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not token ids separated by spaces",
                                 param_hint="--ids") from None


def _err_console() -> Console:
    return Console(stderr=True)


def _byte_text(value: int) -> str:
    return repr(bytes([value]))[2:-1] if value < 256 else f"<{value}>"


@click.command(context_settings=FILE_OPTIONS)
@click.option("--text", "texts", multiple=True, metavar="FILE",
              type=click.Path(dir_okay=False, allow_dash=True),
              help=f"Train on this text file ({REPEAT_TEXT}; - reads stdin). Default: the "
                   "built-in corpus.")
@click.option("--input", "input_record", type=click.Path(dir_okay=False),
              help="Train on an input record (hard targets or corpus weights) instead.")
@click.option("--steps", type=click.IntRange(0), default=1000, show_default=True,
              help="AdamW updates to make.")
@_CHECKPOINT
@click.option("--resume", is_flag=True, help="Continue the checkpoint's run.")
@click.option("--new-data", is_flag=True,
              help="With --resume: continue on other data than the checkpoint's (recorded in "
                   "its segments).")
@click.option("--overwrite", is_flag=True, help="Start again over an existing checkpoint.")
@BACKEND_OPTION
@_ARCH
@ARENA_OPTION
@click.option("--updates-per-invocation", "-N", type=click.IntRange(1, MAX_UPDATES),
              default=api.DEFAULT_UPDATES_PER_INVOCATION, show_default=True,
              help="Updates per invocation: one plan runs N updates on the device before "
                   "the host reads it back; checkpoints are saved at an invocation's end.")
@click.option("--eval-every", type=click.IntRange(1), default=None, metavar="U",
              help="A progress line (train and validation loss, rate, ETA) every U updates "
                   "(default: every invocation); invocations end there.")
@click.option("--keep-best", is_flag=True,
              help="Also save the checkpoint of the lowest validation loss seen at an eval "
                   "point, beside the checkpoint (bob.best.safetensors).")
@hyper_options
@schedule_options
@click.option("--result", "result_path", type=click.Path(dir_okay=False),
              help="Write the last invocation's result record here.")
@TRAIN_SCHEDULE_OPTION
@SUBMISSION_OPTION
@KERNELS_OPTION
@TABLES_OPTION
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON summary on stdout (the table goes to stderr).")
@_data_options("needs --vocab or --tokenizer",
               "V of the --tokens files (default: the --tokenizer's).")
@click.option("--val-text", "--val", "val_texts", multiple=True, metavar="FILE",
              help=f"Validation text ({REPEAT_VAL_TEXT}): its exact loss at every eval point.")
@click.option("--val-tokens", multiple=True, metavar="FILE",
              help=f"Validation token file ({REPEAT_VAL_TOKENS}).")
@click.option("--val-counts", type=click.Path(dir_okay=False),
              help="Validation counts file from `bob count`.")
@click.option("--val-fraction", type=float, default=None, metavar="F",
              help="Hold the last F of the training data out as validation (0.1: nanoGPT's "
                   "90/10 split) and train on the rest; texts, token files and the built-in "
                   "corpus (not a counts file).")
@click.option("--save-every", "save_every_seconds", type=click.FloatRange(min=0, min_open=True),
              default=None, metavar="SECONDS",
              help="Save the checkpoint at the first invocation's end this long after the last "
                   "save (default: every invocation up to a 256 MiB checkpoint, else every "
                   "600 s; always at the end).")
@click.option("--save-every-updates", type=click.IntRange(1), default=None, metavar="K",
              help="Save the checkpoint at the first invocation's end K updates after the "
                   "last save.")
@_shard_options
def train(texts, input_record, steps, checkpoint, resume, new_data, overwrite, backend, arch,
          arena, updates_per_invocation, lr, beta1, beta2, eps, weight_decay, warmup_steps,
          lr_decay_steps, min_lr, result_path,
          schedule, as_json, tokens, vocab, token_dtype, counts_file, tokenizer_path, val_texts,
          val_tokens, val_counts, val_fraction, submission, save_every_seconds,
          save_every_updates, eval_every, keep_best, shards, device_memory, workers, gpus,
          dask_address, kernels, tables) -> None:
    """Train the bigram table with AdamW: invocations of -N updates, a line every
    --eval-every updates, the checkpoint saved as --save-every/--save-every-updates say and
    at the end; the first Ctrl-C (or SIGTERM) finishes the invocation in flight and saves
    it, a second stops at once."""
    refuse_extra_arguments(click.get_current_context())
    stated = _stated_hyper(click.get_current_context(),
                           dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                weight_decay=weight_decay, warmup_steps=warmup_steps,
                                lr_decay_steps=lr_decay_steps, min_lr=min_lr))
    # Checked together now (a schedule against its lr); a resumed run's against the
    # checkpoint's own when it starts.
    Hyper(**{**dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay),
             **({} if resume else stated)})
    if texts and input_record is not None:  # the API says it in its words; here in flags
        raise BadInput("give either --text files or an --input record, not both")
    if tokenizer_path is not None and not (tokens or counts_file or val_tokens):
        raise BadInput("--tokenizer gives the V of --tokens files; text trains on bytes "
                       "(V=256)")
    vocab = api.resolve_vocab(vocab, _tokenizer(tokenizer_path))
    request = api.TrainRequest(
        texts=tuple(texts) or None, steps=steps, checkpoint=checkpoint, resume=resume,
        backend=backend, hyper_changes=stated, new_data=new_data,
        updates_per_invocation=updates_per_invocation, input_record=input_record,
        overwrite=overwrite, arch=arch, arena=arena, result_path=result_path,
        schedule=schedule, data_spec=_spec(tokens, vocab, token_dtype, counts_file),
        val_spec=_spec(val_tokens, None, token_dtype, val_counts, val_texts),
        val_fraction=val_fraction,
        submission=submission, save_every_seconds=save_every_seconds,
        save_every_updates=save_every_updates, eval_every=eval_every, keep_best=keep_best,
        shards=shards, device_memory=device_memory, workers=workers, gpus=gpus,
        dask_address=dask_address, kernels=kernels, tables=tables)
    if tokenizer_path is not None:  # read here, not by the request: checked here
        for path, what in request.outputs():
            require_apart(path, what, [(tokenizer_path, "tokenizer file")])
    errors = _err_console()
    progress = Progress(TextColumn("[bold]training"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} updates"),
                        TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(),
                        console=errors, transient=True, disable=not errors.is_terminal)
    # At a terminal the bar moves; elsewhere a line at least every HEARTBEAT_SECONDS.
    with progress, Heartbeat(errors, enabled=not errors.is_terminal) as heartbeat:
        task = progress.add_task("train", total=steps, loss="-")
        log = ProgressLog(heartbeat, request)  # above the bar at a terminal

        def advance(invocation, done) -> None:
            progress.update(task, completed=done, loss=f"{invocation.loss:.4f}")
            log.line(invocation, done)

        report = api.run_training(request, advance, log.announce)
    _table_console(errors if as_json else None).print(_train_table(report))
    if as_json:
        click.echo(json.dumps(report.to_json()))


def _stated_hyper(context: click.Context, values: dict[str, float]) -> dict[str, float]:
    """The hyperparameters the user gave, even those equal to a default."""
    from click.core import ParameterSource

    return {name: value for name, value in values.items()
            if context.get_parameter_source(name) is not ParameterSource.DEFAULT}


def _table_console(console: Console | None) -> Console:
    """stdout (or `console`), 100 columns wide when it is not a terminal."""
    console = console or Console()
    if not console.is_terminal:
        console.width = 100
    return console


def _hyper_text(hyper: Hyper) -> str:
    return (f"lr {hyper.lr:g}{_schedule_text(hyper)}, betas {hyper.beta1:g}/{hyper.beta2:g}, "
            f"eps {hyper.eps:g}, weight decay {hyper.weight_decay:g}")


def _schedule_text(hyper: Hyper) -> str:
    """ (warmup 100, cosine to 0.01 at update 1000): the schedule, where one is set."""
    parts = [f"warmup {hyper.warmup_steps}"] if hyper.warmup_steps else []
    if hyper.lr_decay_steps is not None:
        parts.append(f"cosine to {hyper.min_lr:g} at update {hyper.lr_decay_steps}")
    return f" ({', '.join(parts)})" if parts else ""


def _train_table(report: api.TrainReport) -> Table:
    table = Table(title=f"bob train ({report.backend} backend, {report.mode} mode)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("data", report.data)
    table.add_row("updates (this run / total)", f"{report.steps} / {report.global_step}")
    table.add_row("initial loss (nats)", f"{report.initial_loss:.6f}")
    table.add_row("loss (nats)", f"{report.loss:.6f}")
    if report.shard_rows:
        table.add_row("row shards", f"{len(report.shard_rows)}, {report.shards_ran}")
    table.add_row("tables", f"{report.tables}: {report.tables_reason}"
                  if report.tables_reason else report.tables)
    if report.segments:
        table.add_row("hyperparameters", _hyper_text(report.segments[-1].hyper))
    if report.optimum is not None:
        table.add_row("optimum (nats)", f"{report.optimum:.6f}")
        if report.gap is not None:
            table.add_row("above optimum", f"{100 * report.gap:.3f}%")
        else:  # the optimum is 0 (a text with one successor per byte): no relative gap
            table.add_row("above optimum (nats)", f"{report.loss - report.optimum:.6f}")
    if report.val_loss is not None:
        table.add_row("validation loss (nats)", f"{report.val_loss:.6f}")
    if report.best is not None:
        kept = "" if report.best.written else ", an earlier run's"
        table.add_row("best checkpoint", f"{report.best.path} (update {report.best.step}, "
                                         f"validation {report.best.val_loss:.6f}{kept})")
    table.add_row("schedule", report.schedule.text)
    rate = f", {report.updates_per_second:,.1f} updates/s" if report.steps else ""
    table.add_row("wall time", f"{report.wall_seconds:.2f} s{rate}")
    if report.checkpoint in report.written:
        table.add_row("checkpoint", report.checkpoint)
    best = None if report.best is None else report.best.path
    for path in report.written:
        if path not in (report.checkpoint, best):
            table.add_row("result record", path)
    if not report.written:
        table.add_row("written", "nothing (--steps 0)")
    return table


@click.command()
@_CHECKPOINT
@click.argument("prompts", nargs=-1)
@BACKEND_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as JSON.")
@click.option("--ids", "id_prompts", multiple=True,
              help='A prompt of token ids, e.g. "464 3290 318" (token checkpoints; repeatable).')
@tokenizer_option("Token checkpoints: encode the text PROMPTS and decode the predictions.")
def predict(checkpoint, prompts, backend, as_json, id_prompts, tokenizer_path) -> None:
    """Predict the byte (or token) after each PROMPT: the greedy argmax of its last
    symbol's row."""
    if id_prompts:
        if prompts:
            raise click.UsageError("give text PROMPTS or --ids, not both")
        _predict_ids(checkpoint, [_ids(p) for p in id_prompts], backend, as_json,
                     _tokenizer(tokenizer_path))
        return
    if not prompts:
        raise click.UsageError("give at least one PROMPT (or --ids)")
    if tokenizer_path is not None:
        tokenizer = api.load_tokenizer(tokenizer_path)
        _predict_ids(checkpoint, [tokenizer.encode(p) for p in prompts], backend, as_json,
                     tokenizer)
        return
    results = api.predict(checkpoint, [os.fsencode(p) for p in prompts], backend)
    if as_json:
        click.echo(json.dumps([{"prompt": p.decode(errors="replace"), "next": nxt,
                                "next_text": bytes([nxt]).decode("latin-1")}
                               for p, nxt, _ in results]))
        return
    for prompt, nxt, logits in results:
        click.echo(f"{prompt.decode(errors='replace')!r} -> {_byte_text(nxt)!r} "
                   f"(logit {float(logits[nxt]):.4f})")


def _predict_ids(checkpoint, prompts, backend, as_json, tokenizer=None) -> None:
    if tokenizer is not None:
        api.require_tokenizer(checkpoint, tokenizer)
    results = api.predict_ids(checkpoint, prompts, backend)
    if tokenizer is not None:
        if as_json:
            click.echo(json.dumps([{"prompt": tokenizer.decode(p), "ids": p, "next": nxt,
                                    "next_text": tokenizer.decode([nxt])}
                                   for p, nxt, _ in results]))
            return
        for prompt, nxt, logit in results:
            click.echo(f"{tokenizer.decode(prompt)!r} -> {tokenizer.decode([nxt])!r} "
                       f"(id {nxt}, logit {logit:.4f})")
        return
    if as_json:
        click.echo(json.dumps([{"prompt": p, "next": nxt} for p, nxt, _ in results]))
        return
    for prompt, nxt, logit in results:
        click.echo(f"{' '.join(map(str, prompt))} -> {nxt} (logit {logit:.4f})")


# Between samples, as nanoGPT's sample.py prints them.
SAMPLE_SEPARATOR = "-" * 15
DEFAULT_LENGTH = 200  # symbols a sample draws, as nanoGPT's sample.py's max_new_tokens
LINE_LENGTH = 1000  # with --lines, the most a sample draws per line asked for


@click.command()
@_CHECKPOINT
@click.option("--prompt", "-p", help="Text to continue (a token model's with --tokenizer).")
@click.option("--ids", "id_prompt", help='Token ids to continue, e.g. "464 3290 318".')
@click.option("--length", "-n", type=click.IntRange(0, 10_000_000), default=None,
              help="Symbols to generate: bytes, or token ids for a token model (default 200; "
                   f"with --lines the most a sample draws, default {LINE_LENGTH} a line).")
@click.option("--lines", type=click.IntRange(1, 100_000), default=None, metavar="K",
              help="Print K whole lines a sample: stop at the K-th line's end (a newline; a "
                   "token model's --stop symbol, or its --tokenizer's newline token).")
@click.option("--stop", type=click.IntRange(0), default=None, metavar="ID",
              help="With --lines: the symbol that ends a line (a byte value, or a token id).")
@click.option("--temperature", "-t", type=click.FloatRange(0), default=0.8, show_default=True,
              help="0 is greedy; above 0 samples (0.8 as nanoGPT's sample.py).")
@click.option("--top-k", "-k", type=click.IntRange(1), default=200, show_default=True,
              help="Sample only among the K most likely next symbols (200 as nanoGPT's "
                   "sample.py; K >= V: all of them).")
@click.option("--seen-only/--no-seen-only", default=None,
              help="Draw only symbols the training data has as a next symbol, as the "
                   "checkpoint records them. Default: on for byte models trained on text (a "
                   "model of ASCII text writes valid UTF-8), off for token models. A "
                   "checkpoint written before Bob recorded them cannot tell: by default it "
                   "draws from every symbol, and --seen-only is refused.")
@click.option("--num-samples", type=click.IntRange(1, 100_000), default=1, show_default=True,
              help="Samples to draw, each continuing the prompt, separated by a line of "
                   "dashes (sample k draws the seed's numbers after those of the k before it).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Sampling seed: the same seed gives the same text on every backend.")
@tokenizer_option("Token checkpoints: decode the generated ids to text and encode --prompt.")
@click.option("--raw", is_flag=True,
              help="Write the prompt and the generated bytes unchanged (no UTF-8 decoding, "
                   "no newline; with --ids the ids, no newline; with --tokenizer the text).")
@BACKEND_OPTION
@click.option("--json", "as_json", is_flag=True,
              help="Print the prompt and the continuation as JSON (text and byte values).")
def generate(checkpoint, prompt, id_prompt, length, lines, stop, temperature, top_k, seen_only,
             num_samples, seed, tokenizer_path, raw, backend, as_json) -> None:
    """Continue a prompt (text, or --ids for token checkpoints) by sampling, as nanoGPT's
    sample.py does (temperature 0.8, top-k 200), or greedily with -t 0. Without a prompt,
    as makemore samples: a byte model from the start of a line, a token model from the
    symbol its data starts with; --lines K prints K whole lines (K names of a names list)."""
    if prompt is not None and id_prompt is not None:
        raise click.UsageError("give --prompt text or --ids, not both")
    if raw and as_json:
        raise click.UsageError("--raw and --json are two ways to print: choose one")
    if raw and num_samples > 1:
        raise click.UsageError("--raw writes one sample unchanged: leave out --num-samples")
    if stop is not None and lines is None:
        raise click.UsageError("--stop ends the lines of --lines: give --lines K too")
    if length is None:
        length = DEFAULT_LENGTH if lines is None else LINE_LENGTH * lines
    tokenizer = _tokenizer(tokenizer_path)
    if tokenizer is not None:
        api.require_tokenizer(checkpoint, tokenizer)
    given: bytes | list[int]
    prompted = prompt is not None or id_prompt is not None
    if not prompted:
        given = api.generation_start(checkpoint, tokenizer).shown
    elif tokenizer is not None:
        given = tokenizer.encode(prompt) if prompt is not None else _ids(id_prompt)
    else:
        given = os.fsencode(prompt) if prompt is not None else _ids(id_prompt)
    # No prompt: the generation's start (a prompt given empty is refused as before).
    samples = api.generate_samples(checkpoint, given if prompted else None, length,
                                   temperature, seed, backend, top_k, seen_only, num_samples,
                                   lines, stop, tokenizer)
    if lines is not None:
        _say_short_samples(samples, lines, length, checkpoint, stop, tokenizer)
    form = "json" if as_json else "raw" if raw else "text"
    shown = [_sample_shown(given, more, tokenizer, form) for more in samples]
    if lines is not None and form == "text":  # whole lines: the separator starts a line
        shown = [text.removesuffix("\n") for text in shown]
    if as_json:
        click.echo(json.dumps(shown[0] if len(shown) == 1 else {"samples": shown}))
        return
    if raw:
        data = shown[0]
        if isinstance(data, str):
            data = data.encode("utf-8")
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    sys.stdout.write(f"\n{SAMPLE_SEPARATOR}\n".join(shown) + "\n")


def _say_short_samples(samples: list[list[int]], lines: int, length: int, checkpoint: str,
                       stop: int | None, tokenizer: api.Tokenizer | None) -> None:
    """A line on stderr for each sample that reached -n before its last line ended."""
    from bob.host.inference import stop_symbol

    ending = stop_symbol(checkpoint, stop, tokenizer)
    for number, sample in enumerate(samples, start=1):
        ended = sample.count(ending)
        if ended < lines:
            click.echo(f"(sample {number}: {ended} of {lines} lines ended within -n {length} "
                       "symbols)", err=True)


def _sample_shown(given: bytes | list[int], more: list[int], tokenizer: api.Tokenizer | None,
                  form: str):
    """One sample as `form` ("text", "raw" or "json") prints it: a line, bytes, an object."""
    if tokenizer is not None:
        text = tokenizer.decode([*given, *more])
        if form == "json":
            return {"prompt": tokenizer.decode(given), "ids": [*given, *more], "text": text}
        return text
    if isinstance(given, bytes):
        continuation = bytes(more)
        if form == "raw":
            return given + continuation
        if form == "json":
            return {"prompt": given.decode("utf-8", errors="replace"),
                    "text": continuation.decode("utf-8", errors="replace"),
                    "bytes": list(continuation)}
        return (given + continuation).decode("utf-8", errors="replace")
    ids = [*given, *more]
    return {"ids": ids} if form == "json" else " ".join(map(str, ids))


@click.command(name="eval", context_settings=FILE_OPTIONS)
@_CHECKPOINT
@click.option("--text", "texts", multiple=True, metavar="FILE",
              type=click.Path(dir_okay=False, allow_dash=True),
              help=f"Text file to evaluate on ({REPEAT_TEXT}; - reads stdin; a token "
                   "model's with --tokenizer, encoded).")
@BACKEND_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_data_options("their V is the checkpoint's", "V of the --tokens files: the checkpoint's "
               "(given, it must agree).")
def eval_(checkpoint, texts, backend, as_json, tokens, vocab, token_dtype, counts_file,
          tokenizer_path) -> None:
    """Loss of the model on data: nats per transition, bits per byte (per token for a token
    model), and the entropy of that data (the lowest loss any bigram table reaches on it)."""
    refuse_extra_arguments(click.get_current_context())
    tokenizer = _tokenizer(tokenizer_path)
    spec = _spec(tokens, api.resolve_vocab(vocab, tokenizer) if tokens else vocab,
                 token_dtype, counts_file)
    if not texts and spec is None:
        raise click.UsageError("give --text files, --tokens files or --counts")
    report = api.evaluate(checkpoint, list(texts), backend, spec, tokenizer)
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    table = Table(title=f"bob eval on {report.text}")
    table.add_column("")
    table.add_column("nats / transition", justify="right")
    table.add_column(f"bits / {report.unit}", justify="right")
    table.add_row("model", f"{report.nats:.6f}", f"{report.bits:.6f}")
    table.add_row("entropy of this text (lower bound)", f"{report.optimum:.6f}",
                  f"{report.optimum / math.log(2):.6f}")
    table.add_row("transitions", f"{report.transitions:,}", "")
    _table_console(None).print(table)


@click.command()
@_CHECKPOINT
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the PNG files.")
@click.option("--counts", "counts_file", type=click.Path(dir_okay=False),
              help="The training counts file: its optimum on the loss curve.")
@click.option("--json", "as_json", is_flag=True, help="List the files written as JSON.")
@tokenizer_option("Token checkpoints: label the heat map with each token's text.")
@click.option("--overwrite", is_flag=True, help="Replace loss.png and transitions.png where "
                                                "they exist.")
def plot(checkpoint, out_dir, counts_file, as_json, tokenizer_path, overwrite) -> None:
    """Draw the loss curve and the learned transition heat map as PNG (matplotlib): the
    map over the symbols the data uses, above V=512 the 64 most frequent (by --counts, else
    by the model's estimate)."""
    from bob.host import plot as pictures
    from bob.records.countsfile import CountsFile
    from bob.records.shards import open_checkpoint

    stored = open_checkpoint(checkpoint)  # the header: rows are read as the map needs
    state = stored.state
    tokenizer = _tokenizer(tokenizer_path)
    if tokenizer is not None:
        api.require_tokenizer(checkpoint, tokenizer)
    counted = None if counts_file is None else CountsFile.load(counts_file)
    if counted is not None:
        _require_training_counts(state, counted, counts_file)
    optimum = state.optimum if counted is None else counted.optimum
    drawn = ("loss.png", "transitions.png") if state.history else ("transitions.png",)
    targets = {name: os.path.join(out_dir, name) for name in drawn}
    read = api.checkpoint_files(stored) + ([] if counts_file is None
                                           else [(counts_file, "counts file")])
    for path in targets.values():  # an input under an output's name: said first
        require_apart(path, "PNG", read)
    _check_plot_directory(out_dir, targets.values(), overwrite)
    figures = {"transitions.png": pictures.transitions_figure(
        lambda indices: stored.rows("parameters", indices), state.vocab,
        None if counted is None else pictures.symbol_counts(counted.counts),
        None if tokenizer is None else (lambda symbol: tokenizer.decode([symbol])))}
    if state.history:
        figures["loss.png"] = pictures.loss_figure(
            state.history, optimum, validation=validation_curve(state),
            changes=[s.first_step for s in state.segments[1:]])
    images = {name: pictures.png_bytes(figures[name])
              for name in ("loss.png", "transitions.png") if name in figures}
    write_directory(out_dir, images, "plots")
    written = [targets[name] for name in images]
    if as_json:
        click.echo(json.dumps({"written": written}))
    else:
        for path in written:
            click.echo(path)
    if not state.history:
        click.echo("(no loss history in this checkpoint: no loss curve)", err=True)


def _require_training_counts(state, counted, counts_file: str) -> None:
    """BadInput unless the counts are of data the checkpoint trained on: their V, and
    their digest one the checkpoint records (its data's or a segment's), so the optimum
    drawn is its data's. A checkpoint that records no digest cannot tell: any counts of
    its V are drawn."""
    from bob.records.digest import digest_matches

    if counted.vocab != state.vocab:
        raise BadInput(f"{counts_file}: counts of V={counted.vocab}, the checkpoint has "
                       f"V={state.vocab}")
    trained_on = list(dict.fromkeys(digest for digest in (
        state.data_digest, *(segment.data_digest for segment in state.segments)) if digest))
    if trained_on and not any(digest_matches(digest, counted.counts) for digest in trained_on):
        raise BadInput(f"{counts_file}: counts of data {_short_digest(counted.digest)}, the "
                       f"checkpoint trained on data {_short_digest(trained_on[0])}; give "
                       "the counts of its training data")


def _short_digest(digest: str) -> str:
    """A digest as messages name it: its first hex digits (past a version prefix)."""
    return digest.rsplit(":", 1)[-1][:12]


def validation_curve(state) -> list[tuple[int, float]]:
    """(update, validation loss) points for loss.png.

    The hook for validation losses: the checkpoint's history holds training
    losses only until it records validation losses too; return those here.
    """
    return list(state.val_history)


def _check_plot_directory(out_dir: str, targets, overwrite: bool = False) -> None:
    """Before drawing: the directory can be made or used, and each target can be written,
    replacing an existing one only with --overwrite, as every other output."""
    check_output_directory(out_dir, "plots")
    if os.path.isdir(out_dir):
        for path in targets:
            check_output_file(path, "PNG")
            if not overwrite and os.path.lexists(path):
                raise BadInput(f"{path}: exists; pass --overwrite to replace it")


@click.command(name="export")
@_CHECKPOINT
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="The parameters file to write (safetensors).")
@click.option("--overwrite", is_flag=True, help="Replace the file if it exists.")
def export(checkpoint, out, overwrite) -> None:
    """Write the parameters alone (a third of the checkpoint) as safetensors: one F32 [V, V]
    tensor, `parameters`, streamed from the checkpoint."""
    size = api.export(checkpoint, out, overwrite)
    click.echo(f"{out}: parameters of {checkpoint} ({size:,} bytes)")


COMMANDS = (train, predict, generate, eval_, plot, export)
