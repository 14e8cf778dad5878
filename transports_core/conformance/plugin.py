"""The pytest plugin of the conformance suite, loaded by the ``pytest11`` entry point in
every pytest run wherever durable-transports is installed. So it only registers the
suite's marker and the ``--transport-url`` option: no fixtures, no hooks beyond these
two, and no import of any backend or of the suite itself."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("durable-transports").addoption(
        "--transport-url",
        default=None,
        metavar="URL",
        help="transport URL that the conformance suite's URL-driven tests run against "
        "(used by python -m transports_core.conformance)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "conformance_property(name): the named property of the transport contract that a "
        "conformance scenario checks",
    )
