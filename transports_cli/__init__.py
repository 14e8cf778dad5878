"""The ``transports`` command line: ``transports --help`` lists the commands.

`main` is the console script; `cli` is the click group, for embedding or for
``click.testing.CliRunner``.
"""

from __future__ import annotations

from ._app import cli, main

__all__ = ["cli", "main"]
