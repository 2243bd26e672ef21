"""Options shared by several commands; every choice is read from bob.config, the backends'
from the backend registry."""

from __future__ import annotations

import math

import click

from bob import config
from bob.backends import registry
from bob.config import Hyper
from bob.errors import BadInput
from bob.program.bob import BobConfig, typical_pairs


def repeat_hint(option: str, first: str, second: str) -> str:
    """One notation for several files everywhere: an option takes one file, and is
    repeated (the help of each option shows its own name)."""
    return f"repeat for several: {option} {first} {option} {second}"


REPEAT_TEXT = repeat_hint("--text", "a.txt", "b.txt")
REPEAT_TOKENS = repeat_hint("--tokens", "a.bin", "b.bin")
REPEAT_VAL_TEXT = repeat_hint("--val-text", "a.txt", "b.txt")
REPEAT_VAL_TOKENS = repeat_hint("--val-tokens", "a.bin", "b.bin")
# A command whose options take files keeps stray words, so that refuse_extra_arguments
# can say how to give several files rather than click's "unexpected extra argument".
FILE_OPTIONS = {"allow_extra_args": True}


def refuse_extra_arguments(context: click.Context) -> None:
    """A usage error (exit 2) for a word no option or argument took: most often a second
    file after an option that takes one."""
    if context.args:
        words = " ".join(context.args)
        raise click.UsageError(f"unexpected argument {words!r}: an option takes one file, "
                               "repeat it for several (--text a.txt --text b.txt, "
                               "--tokens a.bin --tokens b.bin)")


SCHEDULE_OPTION = click.option(
    "--schedule", type=click.Choice(config.SCHEDULES), default=config.SCHEDULES[0],
    show_default=True,
    help="The seed's launches (the reference), or the fused kernel: the same bytes, faster.")
# `bob train`'s: auto as registry.resolve_schedule resolves it, said in the run's table.
TRAIN_SCHEDULE_OPTION = click.option(
    "--schedule", type=click.Choice(config.SCHEDULE_CHOICES), default=config.AUTO_SCHEDULE,
    show_default=True,
    help="seed: the seed's launches (the reference); fused: the fused kernel, the same bytes, "
         "faster; auto: fused, but seed on cpu (quicker to compile there), for row "
         "shards and for --kernels own where Bob has no own fused kernel for the run. The "
         "table and --json say which ran and why.")


PLAN_TABLES_OPTION = click.option(
    "--tables", type=click.Choice(config.TABLES), default="dense", show_default=True,
    help="The program over dense V x V tables (the seed's), or over collapsed ones (a rest "
         "class per row and the typical corpus's cells, 64 a row).")
TABLES_OPTION = click.option(
    "--tables", type=click.Choice(config.TABLES_CHOICES), default="auto", show_default=True,
    help="How the tables are held: dense V x V, or collapsed (a rest class per row and the "
         "cells the data names: the same bytes, O(V + K)); auto chooses from the data.")


_STREAM_BACKENDS = " and ".join(sorted(registry.STREAM_BACKENDS))
KERNELS_OPTION = click.option(
    "--kernels", type=click.Choice(config.KERNELS), default=config.DEFAULT_KERNELS,
    show_default=True,
    help="Whose machine code the plan's regions run: NVRTC's, or Bob's own (encoded by "
         f"Bob; {' and '.join(registry.OWN_KERNEL_BACKENDS)}, the plans it covers; cuda stays "
         "on NVRTC).")


def submission_option(auto: str = f"chained on {_STREAM_BACKENDS} (the backends that run "
                                  "Bob's command stream), per-launch elsewhere",
                      ) -> click.Option:
    """--submission: a policy by name, or auto (registry.resolve_submission), whose meaning
    for this command is `auto`."""
    return click.option(
        "--submission", type=click.Choice(config.SUBMISSION_CHOICES),
        default=config.AUTO_SUBMISSION, show_default=True,
        help="per-launch: every launch its own submission (the reference); chained: each "
             f"submission's launches linked in the command stream (the same bytes); auto: {auto}.")


SUBMISSION_OPTION = submission_option()
MODE_OPTION = click.option(
    "--mode", type=click.Choice(config.MODES), default=config.MODES[0], show_default=True,
    help="Hard targets (the seed's record) or corpus weights.")
BACKEND_OPTION = click.option(
    "--backend", type=click.Choice(registry.BACKEND_NAMES), default=registry.AUTO,
    show_default=True, help="Where the plan runs.")
ARENA_OPTION = click.option(
    "--arena", type=click.Choice(config.ARENA_KINDS), default=config.ARENA_KINDS[0],
    show_default=True, help="cuda: arena in device memory or mapped host memory.")


def arch_option(help: str) -> click.Option:
    """--arch: one of the targets a plan is placed for."""
    return click.option("--arch", type=click.Choice(config.TARGET_NAMES),
                        default=config.DEFAULT_TARGET, show_default=True, help=help)


def check_vocab(context: click.Context, parameter: click.Parameter,
                value: int | tuple[int, ...] | None) -> int | tuple[int, ...] | None:
    """--vocab within [MIN_VOCAB, MAX_VOCAB]: BadInput, so the refusal is one line (exit 2),
    not click's usage text."""
    for vocab in value if isinstance(value, tuple) else (value,):
        if vocab is not None and not config.MIN_VOCAB <= vocab <= config.MAX_VOCAB:
            why = (f": V={config.MAX_VOCAB} is the largest table Bob trains"
                   if vocab > config.MAX_VOCAB else "")
            raise BadInput(f"--vocab {vocab} is outside [{config.MIN_VOCAB}, "
                           f"{config.MAX_VOCAB}]{why}")
    return value


def vocab_option(default: int | None = None, help: str = "V: rows and columns of the table.",
                 ) -> click.Option:
    return click.option("--vocab", "-V", "vocab", type=int, callback=check_vocab,
                        default=default, show_default=default is not None, help=help)


TOKENIZER_KINDS = ("a Hugging Face tokenizers JSON file ([tokens] extra), nanoGPT's meta.pkl, "
                   "or a tiktoken encoding name where tiktoken and its data are here")


def tokenizer_option(help: str) -> click.Option:
    """--tokenizer FILE: a token model's tokenizer (`bob.records.tokenizer`)."""
    return click.option("--tokenizer", "tokenizer_path", metavar="FILE",
                        help=f"{help} FILE: {TOKENIZER_KINDS}.")


def prompts_option(default: int) -> click.Option:
    return click.option("--prompts", "-P", type=click.IntRange(0, config.MAX_PROMPTS),
                        default=default, show_default=True,
                        help="P: prompts predicted per invocation.")


def plan_options(function):
    """--vocab, --prompts, --updates, --mode, --schedule: the shape of Bob's program."""
    options = (
        vocab_option(256),
        prompts_option(1),
        click.option("--updates", "-N", type=click.IntRange(0, config.MAX_UPDATES), default=100,
                     show_default=True, help="N: AdamW updates per invocation."),
        MODE_OPTION,
        SCHEDULE_OPTION,
    )
    for option in reversed(options):
        function = option(function)
    return function


def _check_hyperparameter(context: click.Context, parameter: click.Parameter,
                          value: float) -> float:
    # Hyper's own rule, one option at a time, so the message names the flag.
    try:
        Hyper(**{parameter.name: value})
    except BadInput as error:
        raise click.BadParameter(str(error)) from None
    return value


# What each of AdamW's hyperparameters does, for its option's help.
HYPER_HELP = {
    "lr": "AdamW's learning rate (the peak of a schedule: --warmup-steps, --lr-decay-steps).",
    "beta1": "AdamW's decay of the first moment (the running mean of the gradient).",
    "beta2": "AdamW's decay of the second moment (the running mean of its square).",
    "eps": "Added to the root of the second moment before it divides the step.",
    "weight_decay": "Decoupled weight decay: every update first scales the table by "
                    "1 - lr * weight_decay.",
}


def hyper_options(function):
    """--lr, --beta1, --beta2, --eps, --weight-decay, each checked by Hyper's rule."""
    defaults = Hyper()
    options = [
        click.option(f"--{name.replace('_', '-')}", name, type=float,
                     default=getattr(defaults, name), show_default=True,
                     callback=_check_hyperparameter, help=HYPER_HELP[name])
        for name in config.HYPER_FIELDS
    ]
    for option in reversed(options):
        function = option(function)
    return function


def schedule_options(function):
    """--warmup-steps, --lr-decay-steps, --min-lr: nanoGPT's learning-rate schedule
    (`bob.config.Hyper.lr_at`), checked with the rest of the hyperparameters by Hyper."""
    options = (
        click.option("--warmup-steps", type=int, default=0, show_default=True, metavar="W",
                     help="Raise the learning rate linearly over the first W updates of the "
                          "run's whole count, as nanoGPT's warmup_iters: --lr * (t + 1) / "
                          "(W + 1) for update t + 1."),
        click.option("--lr-decay-steps", type=int, default=None, metavar="D",
                     help="Then lower it along a cosine to --min-lr at update D (nanoGPT's "
                          "lr_decay_iters; about --steps), and keep it there."),
        click.option("--min-lr", type=float, default=None, metavar="LR",
                     help="Where the cosine decay ends (default: --lr / 10, nanoGPT's "
                          "ratio)."),
    )
    for option in reversed(options):
        function = option(function)
    return function


def config_from(vocab: int, prompts: int, updates: int, mode: str, schedule: str = "seed",
                submission: str = config.DEFAULT_SUBMISSION_POLICY,
                tables: str = "dense") -> BobConfig:
    """A configuration from the options; corpus mode with a typical K (no corpus given),
    whose cells a collapsed table takes as its exceptions (hard mode: the V targets)."""
    pairs = typical_pairs(vocab) if mode == "corpus" else 0
    collapsed = {"tables": tables, "exceptions": pairs or vocab} if tables == "collapsed" \
        else {}
    return BobConfig(vocab=vocab, prompts=prompts, updates=updates,  # type: ignore[arg-type]
                     mode=mode, schedule=schedule,  # type: ignore[arg-type]
                     submission=submission,  # type: ignore[arg-type]
                     pairs=pairs, **collapsed)  # type: ignore[arg-type]


_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class ByteSize(click.ParamType):
    """A number of bytes: 1073741824, 512M, 8G, 1.5GiB (K, M, G, T: powers of 1024)."""

    name = "SIZE"

    def convert(self, value, parameter, context) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().removesuffix("b").removesuffix("i")
        number, unit = (text[:-1], text[-1]) if text[-1:] in _SIZE_UNITS else (text, "")
        try:
            size = float(number) * _SIZE_UNITS[unit]
        except ValueError:
            size = math.nan
        if not (math.isfinite(size) and size >= 1 and size == int(size)):
            self.fail(f"{value!r} is not a size in bytes (a whole number, or one with K, M, "
                      "G or T: 512M, 8G)", parameter, context)
        return int(size)


class GpuList(click.ParamType):
    """GPU numbers separated by commas: 0,1,2,3."""

    name = "0,1,..."

    def convert(self, value, parameter, context) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        words = [word.strip() for word in str(value).split(",")]
        if not all(word.isdigit() for word in words):
            self.fail(f"{value!r} is not GPU numbers separated by commas (0,1,2,3)",
                      parameter, context)
        return tuple(int(word) for word in words)
