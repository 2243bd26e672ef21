"""The `bob` command line: exit 0 on success, 1 on a failure at run time,
2 on bad usage or bad input; a message of one line, never a traceback."""

from __future__ import annotations

import os
import sys

import click

from bob.errors import BobError

from . import bench_cmd, count_cmd, plan_cmd, run_cmd, tools_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bob")
def cli() -> None:
    """Bob: a byte-level bigram model whose device program is certified data."""


for module in (plan_cmd, run_cmd, tools_cmd, bench_cmd, count_cmd):
    for command in module.COMMANDS:
        cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    try:
        status = cli.main(args=argv, prog_name="bob", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except BobError as error:
        click.echo(f"bob: {error}", err=True)
        return error.exit_status
    except KeyboardInterrupt:
        click.echo("bob: interrupted", err=True)
        return 130
    except Exception as error:  # noqa: BLE001 - a bug still ends in one line, not a traceback
        if os.environ.get("BOB_TRACEBACK"):
            raise
        first = str(error).strip().splitlines()
        click.echo(f"bob: internal error: {type(error).__name__}: {first[0] if first else ''} "
                   "(a bug in Bob: BOB_TRACEBACK=1 shows where)", err=True)
        return 1
    return status if isinstance(status, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
