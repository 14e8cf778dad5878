"""The ``transports`` command group, its global options, and how failures end.

Each subcommand lives in its own module, or a subpackage by job (admin/, demo/,
bench/), and is added here. `main` runs the group with
click's standalone mode off, so that every way of ending maps to one exit code and at
most one line on stderr:

    0  success            1  failure (an error, or a check that failed)
    2  usage error        130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import click

from ._backends import backends
from ._conformance import conformance
from ._output import SuppliesUrl, error_line, scrub
from ._publish import publish
from .admin import cancel, dead, group, inspect, purge
from .bench import bench
from .check import check
from .dashboard import dashboard
from .demo import demo
from .migrate import migrate
from .worker import worker

__all__ = ["cli", "main", "run"]

try:
    _VERSION = version("durable-transports")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    _VERSION = "unknown"


class _Failed(Exception):
    """A command raised something that is not a click exception: carries it to `run`."""

    def __init__(self, cause: BaseException, debug: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.debug = debug


class _Group(SuppliesUrl):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            raise _Failed(exc, debug=bool(ctx.params.get("debug"))) from exc


@click.group(cls=_Group, invoke_without_command=True)
@click.option("--debug", is_flag=True, help="Show the full traceback when a command fails.")
@click.version_option(_VERSION, prog_name="transports")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run, watch and check durable-transports queues.

    \b
    Example:
      transports demo             # the built-in demo on a temporary SQLite file
      transports backends         # which URL schemes are installed
      transports inspect sqlite:///queue.db   # what a queue holds
      transports --debug demo sqlite:///queue.db

    \b
    Environment:
      TRANSPORTS_URL  the queue's URL, for every command not given one
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


cli.add_command(backends)
cli.add_command(bench)
cli.add_command(cancel)
cli.add_command(check)
cli.add_command(conformance)
cli.add_command(dashboard)
cli.add_command(dead)
cli.add_command(demo)
cli.add_command(group)
cli.add_command(inspect)
cli.add_command(migrate)
cli.add_command(publish)
cli.add_command(purge)
cli.add_command(worker)


def _describe(exc: BaseException) -> str:
    # Errors raised on purpose (ours, bad values, the file system) explain themselves;
    # anything else is a bug somewhere, so name its type and point at --debug.
    if isinstance(exc, (ValueError, TypeError, LookupError, OSError, ImportError)) or (
        type(exc).__module__.startswith("transports_")
    ):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"


def run(args: Sequence[str] | None = None) -> int:
    """Run the command line ``args`` (default: ``sys.argv[1:]``); return the exit code."""
    try:
        result = cli.main(
            args=list(args) if args is not None else None,
            prog_name="transports",
            standalone_mode=False,
        )
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        error_line(exc.format_message().rstrip(".") + hint)
        return 2
    except click.ClickException as exc:
        error_line(exc.format_message())
        return exc.exit_code
    except click.Abort:
        error_line("interrupted")
        return 130
    except _Failed as failed:
        if isinstance(failed.cause, BrokenPipeError):
            return _reader_left()
        if failed.debug:
            text = "".join(traceback.format_exception(failed.cause))
            sys.stderr.write(scrub(text))
        error_line(_describe(failed.cause))
        return 1
    return result if isinstance(result, int) else 0


def _reader_left() -> int:
    # The reader of stdout went away (`transports inspect URL | head -1`): what it did
    # not read is not wanted, which is no failure. Point stdout at /dev/null, so that
    # the interpreter's last flush has nowhere to fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def main() -> None:
    """The ``transports`` console script."""
    sys.exit(run())
