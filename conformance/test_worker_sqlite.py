"""The runtime suite (`transports_worker.testing.WorkerSuite`) on the SQLite backend: a
file, through both twins, with an exclusive lock on the file as the passing outage."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from transports_core import AsyncTransport, Event, Transport, open_async_transport, open_transport
from transports_worker.testing import (
    AsyncTransportFactory,
    QuickHandles,
    TransportFactory,
    WorkerSuite,
)

# A handle that gives up on a locked file after a few tens of milliseconds.
QUICK = "?busy_timeout=20"


class SqliteOutage(QuickHandles):
    """Another connection holds the write lock: the worker's writes fail quickly."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"sqlite:///{path}{QUICK}")
        self.path = path

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()


class TestWorkerSqlite(WorkerSuite):
    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "queue.db"

    @pytest.fixture
    def make_transport(self, path: Path) -> TransportFactory:
        def make(**options: Any) -> Transport[Any]:
            return open_transport(f"sqlite:///{path}", **options)

        return make

    @pytest.fixture
    def make_async_transport(self, path: Path) -> AsyncTransportFactory:
        def make(**options: Any) -> AsyncTransport[Any]:
            return open_async_transport(f"sqlite:///{path}", **options)

        return make

    @pytest.fixture
    def outage(self, path: Path, store: Transport[Event]) -> SqliteOutage:
        # ``store`` first: the file exists, with its tables, before anyone locks it.
        return SqliteOutage(path)
