from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._handles import handles
from transports_core import Event
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
    with handles(f"sqlite:///{db_path}", SqliteTransport, event_type=Event, clock=clock) as open_:
        yield open_


@pytest.fixture
def transport(open_db: OpenDb) -> SqliteTransport[Any]:
    return open_db()
