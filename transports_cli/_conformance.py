"""``transports conformance URL``: the conformance suite against the store at URL, one
line per property (the front of ``python -m transports_core.conformance``)."""

from __future__ import annotations

import importlib.util

import click

from transports_core import known_schemes

from ._output import url_argument

__all__ = ["conformance"]


@click.command(
    short_help="Check a backend against the conformance suite, one line per property.",
    context_settings={"ignore_unknown_options": True},
)
@url_argument()
@click.option("-v", "--verbose", is_flag=True, help="Show pytest's own output as well.")
@click.option(
    "--quick",
    is_flag=True,
    help="Every property, with fewer rounds and examples (about a minute on SQLite).",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PYTEST_ARGS]")
def conformance(url: str, verbose: bool, quick: bool, pytest_args: tuple[str, ...]) -> None:
    """Run the conformance suite against the store at URL, which must be empty (the
    suite leaves it empty, dead letters included), print PASS, FAIL or SKIP for each
    property the backend declares, and how long it took. Nothing is written into the
    current directory.

    Exits 1 if any property fails or the store is left not empty, 2 if it was not
    empty to begin with. Arguments after -- go to pytest.

    \b
    Example:
      transports conformance sqlite:///check.db
      transports conformance --quick sqlite:///check.db
      transports conformance sqlite:///check.db -- -k fencing
    """
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in known_schemes():
        known = ", ".join(known_schemes())
        raise click.BadParameter(
            f"no backend for this URL; known schemes: {known}", param_hint="URL"
        )
    missing = [name for name in ("pytest", "hypothesis") if importlib.util.find_spec(name) is None]
    if missing:
        raise click.ClickException(
            f"the conformance suite needs {' and '.join(missing)}: "
            "pip install 'durable-transports[conformance]'"
        )
    from transports_core.conformance.__main__ import main

    flags = [*(["--verbose"] if verbose else []), *(["--quick"] if quick else [])]
    code = main([url, *flags, "--", *pytest_args])
    raise click.exceptions.Exit(code)
