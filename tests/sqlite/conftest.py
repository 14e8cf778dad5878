from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteTransport

OpenDb = Callable[..., SqliteTransport[Any]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


@pytest.fixture
def open_db(db_path: Path, clock: ManualClock) -> Iterator[OpenDb]:
    """Opens (another) transport on ``db_path`` through the public URL entry point, driven
    by the fake ``clock`` unless told otherwise; every one is closed at teardown."""
    opened: list[SqliteTransport[Any]] = []

    def open_(*, event_type: object = Event, **options: object) -> SqliteTransport[Any]:
        options.setdefault("clock", clock)
        transport = open_transport(f"sqlite:///{db_path}", event_type=event_type, **options)
        assert isinstance(transport, SqliteTransport)
        opened.append(transport)
        return transport

    yield open_
    for transport in opened:
        transport.close()


@pytest.fixture
def transport(open_db: OpenDb) -> SqliteTransport[Any]:
    return open_db()
