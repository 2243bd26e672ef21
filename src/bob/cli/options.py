"""Options shared by several commands."""

from __future__ import annotations

import click

from bob.program.bob import MAX_PROMPTS, MAX_UPDATES, MAX_VOCAB, BobConfig

SCHEDULE_OPTION = click.option(
    "--schedule", type=click.Choice(["seed", "fused"]), default="seed", show_default=True,
    help="The seed's launches (the reference), or the fused kernel: the same bytes, faster.")


def plan_options(function):
    """--vocab, --prompts, --updates, --mode, --schedule: the shape of Bob's program."""
    options = (
        click.option("--vocab", "-V", type=click.IntRange(2, MAX_VOCAB), default=256,
                     show_default=True, help="V: rows and columns of the table."),
        click.option("--prompts", "-P", type=click.IntRange(0, MAX_PROMPTS), default=1,
                     show_default=True, help="P: prompts predicted per invocation."),
        click.option("--updates", "-N", type=click.IntRange(0, MAX_UPDATES), default=100,
                     show_default=True, help="N: AdamW updates per invocation."),
        click.option("--mode", type=click.Choice(["hard", "corpus"]), default="hard",
                     show_default=True, help="Hard targets (the seed's record) or corpus weights."),
        SCHEDULE_OPTION,
    )
    for option in reversed(options):
        function = option(function)
    return function


def config_from(vocab: int, prompts: int, updates: int, mode: str,
                schedule: str = "seed") -> BobConfig:
    return BobConfig(vocab=vocab, prompts=prompts, updates=updates,  # type: ignore[arg-type]
                     mode=mode, schedule=schedule)  # type: ignore[arg-type]
