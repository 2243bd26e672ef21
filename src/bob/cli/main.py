"""The `bob` command line: exit 0 on success, 1 on a failure at run time,
2 on bad usage or bad input, 128 + N when signal N (SIGINT, SIGTERM) stops it.

No command ends in a Python traceback: an unexpected internal error prints one
line naming the file that holds the full report, and exits 1. Memory running out is no
internal error: it is said in one line, with the allocation that failed and the
address-space limit where they are known, and exits 1.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

import click

from bob.config import DISTRIBUTION
from bob.errors import BobError, Interrupted, one_line
from bob.host import stops

from . import bench_cmd, count_cmd, plan_cmd, profile_cmd, run_cmd, tools_cmd
from .shortage import memory_shortage

REPORT_DIR_VARIABLE = "BOB_REPORT_DIR"  # where internal-error reports go (default: temp dir)
TRACEBACK_VARIABLE = "BOB_TRACEBACK"  # set (to 1): an internal error raises as Python would


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=DISTRIBUTION, prog_name="bob")
def cli() -> None:
    """Bob: a byte-level bigram model whose device program is certified data."""


for module in (plan_cmd, run_cmd, tools_cmd, bench_cmd, count_cmd, profile_cmd):
    for command in module.COMMANDS:
        cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    with stops.handling():
        try:
            status = _run(argv)
            stops.raise_pending()  # a stop deferred to the very end still ends in its status
        except Interrupted as stop:  # arrived while an error was being reported
            return _report_interrupt(stop)
        return status


def _run(argv: list[str] | None) -> int:
    try:
        status = cli.main(args=argv, prog_name="bob", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.UsageError as error:
        click.echo(_usage_line(error), err=True)
        return 2
    except click.ClickException as error:
        click.echo(f"bob: {_one_line(error.format_message())}", err=True)
        return 2
    except click.exceptions.Abort as abort:
        # click turns a KeyboardInterrupt (so Interrupted) into Abort: report the signal
        cause = abort.__cause__ or abort.__context__
        if isinstance(cause, KeyboardInterrupt):
            return _report_interrupt(cause if isinstance(cause, Interrupted)
                                     else Interrupted(signal.SIGINT))
        click.echo("bob: aborted", err=True)
        return 1
    except BobError as error:
        click.echo(f"bob: {one_line(str(error))}", err=True)
        return error.exit_status
    except Interrupted as stop:
        return _report_interrupt(stop)
    except KeyboardInterrupt:
        return _report_interrupt(Interrupted(signal.SIGINT))
    except BrokenPipeError:
        return _reader_went_away()
    except Exception as error:  # noqa: BLE001 - the one place every unexpected error ends
        if os.environ.get(TRACEBACK_VARIABLE):
            raise  # for whoever debugs Bob: the traceback right here
        shortage = memory_shortage(error)
        if shortage is not None:
            click.echo(f"bob: {shortage}", err=True)
            return 1
        return _report_internal_error(error, argv)
    return status if isinstance(status, int) else 0


def _usage_line(error: click.UsageError) -> str:
    """click's usage error as one line: the command, the message, where help is."""
    command = error.ctx.command_path if error.ctx is not None else "bob"
    return f"{command}: {_one_line(error.format_message())} (see {command} --help)"


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _report_interrupt(stop: Interrupted) -> int:
    click.echo(f"bob: {stop}", err=True)
    return stop.exit_status


def _reader_went_away() -> int:
    # `bob ... | head`: the reader closed the pipe. Nothing to say to it; point stdout at
    # /dev/null so the interpreter's final flush does not fail again.
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 1


def _report_internal_error(error: Exception, argv: list[str] | None) -> int:
    """One line for the user; the traceback in a report file for whoever fixes it."""
    summary = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    path = write_error_report(error, argv)
    where = f"full report in {path}" if path else "no report could be written"
    click.echo(f"bob: internal error ({summary}); {where}", err=True)
    return 1


def write_error_report(error: BaseException, argv: list[str] | None) -> Path | None:
    directory = Path(os.environ.get(REPORT_DIR_VARIABLE) or
                     Path(tempfile.gettempdir()) / "bob-reports")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = directory / f"bob-error-{stamp}-{os.getpid()}.txt"
    words = sys.argv[1:] if argv is None else argv
    text = (f"bob {' '.join(words)}\n\n"
            + "".join(traceback.format_exception(type(error), error, error.__traceback__)))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError:
        return None
    return path


if __name__ == "__main__":  # pragma: no cover (`python -m bob` is the executable)
    sys.exit(main())
