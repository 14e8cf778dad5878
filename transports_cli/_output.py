"""The output conventions every command follows, in one place.

* Data goes to stdout; errors go to stderr as one line (`error_line`), with no traceback
  unless ``--debug`` was given.
* Colour only when the stream is a terminal and ``NO_COLOR`` is unset (`colour`).
* A URL's password never reaches the screen: URL arguments use `url_argument`, which
  remembers the password so that `scrub` can blank it out of any message.
* Commands that print data take ``--json`` and then print one JSON document.
* A command's URL may be left out when ``TRANSPORTS_URL`` is set (`supply_url`).

Imports no backend and nothing from the command modules.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar
from urllib.parse import unquote, urlsplit

import click

from transports_core import redact_url

__all__ = [
    "colour",
    "emit_json",
    "error_line",
    "one_line",
    "print_table",
    "scrub",
    "supply_url",
    "url_argument",
]

URL_VARIABLE = "TRANSPORTS_URL"

FC = TypeVar("FC", bound=Callable[..., Any])

# Passwords and full URLs seen on this command line, to blank out of anything printed.
_urls: set[str] = set()
_passwords: set[str] = set()


def colour(stream: IO[str]) -> bool:
    """Whether to colour ``stream``: a terminal, and ``NO_COLOR`` unset or empty."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def scrub(text: str) -> str:
    """``text`` with every URL and password given on the command line redacted."""
    for url in sorted(_urls, key=len, reverse=True):
        text = text.replace(url, redact_url(url))
    for password in _passwords:
        text = text.replace(f":{password}@", ":***@")
        # A short password is too likely to occur by chance to blank everywhere.
        if len(password) >= 4:
            text = text.replace(password, "***")
    return text


def one_line(text: str) -> str:
    """``text`` folded onto one line (error messages from drivers may span several)."""
    return " ".join(text.split())


def error_line(message: str) -> None:
    """Print ``Error: message`` to stderr as a single scrubbed line."""
    label = click.style("Error:", fg="red", bold=True) if colour(sys.stderr) else "Error:"
    click.echo(f"{label} {one_line(scrub(message))}", file=sys.stderr, color=colour(sys.stderr))


def emit_json(document: object) -> None:
    """Print ``document`` as indented JSON on stdout."""
    click.echo(scrub(json.dumps(document, indent=2)))


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str | None = None
) -> None:
    """Print aligned columns with a header row (bold on a terminal); with no rows, the
    line ``empty`` instead, where one is given."""
    if not rows and empty is not None:
        click.echo(empty)
        return
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) for cell, width in zip(cells, widths, strict=True)
        ).rstrip()

    on = colour(sys.stdout)
    click.echo(click.style(line(headers), bold=True) if on else line(headers), color=on)
    for row in rows:
        click.echo(scrub(line(row)))


def count_option(
    name: str, low: int, high: int | None, help: str, default: int | None = None
) -> Callable[[FC], FC]:
    """An option taking a whole number from ``low`` to ``high``; its default, if it has
    one, is shown in the help (a default that depends on other options says so itself)."""
    return click.option(
        name,
        type=click.IntRange(low, high),
        default=default,
        show_default=default is not None,
        help=help,
    )


def url_argument(*, required: bool = True) -> Callable[[FC], FC]:
    """The ``URL`` argument of a command. Checked by the backend when opened, not here;
    it only records the password, so that nothing printed afterwards can reveal it."""
    metavar = "URL" if required else "[URL]"
    return click.argument("url", required=required, metavar=metavar, callback=_remember_url)


class SuppliesUrl(click.Group):
    """A command group whose subcommands take their URL from ``TRANSPORTS_URL`` when the
    command line gives none (see `supply_url`)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and name is not None:
            rest = supply_url(command, name, rest)
        return name, command, rest


def supply_url(command: click.Command, name: str, args: list[str]) -> list[str]:
    """``args`` of ``command`` with ``TRANSPORTS_URL`` put in the URL's place when the
    command line has none there (the positional argument in that place does not contain
    ``://``, or there is none). Without the variable, a command whose URL is required
    fails with a usage error saying both ways to give one; an optional URL stays out."""
    arguments = [p.name for p in command.params if isinstance(p, click.Argument)]
    if "url" not in arguments:
        return args
    wanted = arguments.index("url")
    with_value = {
        opt
        for p in command.params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for opt in p.opts
    }
    seen = 0
    place = len(args)
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            place = index
            break
        if arg == "--help":
            return args  # help needs no URL
        if arg.startswith("-") and arg != "-":
            index += 2 if arg in with_value else 1
            continue
        if seen == wanted:
            place = index
            break
        seen += 1
        index += 1
    else:
        place = len(args)
    given = args[place] if place < len(args) and args[place] != "--" else None
    if given is not None and "://" in given:
        return args
    from_environment = os.environ.get(URL_VARIABLE)
    if from_environment:
        return [*args[:place], from_environment, *args[place:]]
    url = next(p for p in command.params if p.name == "url")
    if not url.required:
        return args
    what = f"{given!r} is not a URL" if given is not None else "no URL was given"
    raise click.UsageError(
        f"{what}, and {URL_VARIABLE} is not set: give the queue's URL "
        f"(such as sqlite:///queue.db) on the command line or in {URL_VARIABLE} "
        f"(see 'transports {name} --help')"
    )


def _remember_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        password = urlsplit(value).password
    except ValueError:  # unparseable: redact_url shows none of it
        _urls.add(value)
        return value
    if password:
        _urls.add(value)
        _passwords.update({password, unquote(password)})
    return value
