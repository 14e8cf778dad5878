"""`SqliteTransport`: the operations of `_ops` run over the standard library's sqlite3.

One connection, shared by threads under a lock that spans each whole transaction.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Generic, TypeVar

from transports_core import Event, Lease, TransportError
from transports_core._codec import EventCodec

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

from . import _ops
from . import _sql as sql
from ._errors import sqlite_errors
from ._url import SqliteOptions, database_target

E = TypeVar("E")
T = TypeVar("T")


def _execute(conn: sqlite3.Connection, stmt: _ops.Stmt) -> _ops.Result:
    if stmt.many is not None:
        cursor = conn.executemany(stmt.sql, stmt.many)
    else:
        cursor = conn.execute(stmt.sql, stmt.params)
    return _ops.Result(cursor.fetchall(), cursor.rowcount)


def _drive(conn: sqlite3.Connection, steps: _ops.Steps[T]) -> T:
    try:
        stmt = next(steps)
        while True:
            stmt = steps.send(_execute(conn, stmt))
    except StopIteration as stop:
        value: T = stop.value
        return value


class SqliteTransport(Generic[E]):
    """A durable transport in one SQLite file (or in memory), over sqlite3."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        self._options = options
        self._codec: EventCodec[E] = EventCodec(event_type)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        target = database_target(options)
        with sqlite_errors(options.path):
            # isolation_level=None: sqlite3 must not open transactions behind our back; we
            # issue BEGIN IMMEDIATE ourselves so that the write lock is taken up front.
            conn = sqlite3.connect(
                target,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=options.busy_timeout / 1000,
            )
        try:
            self._transaction(conn, _ops.setup(options.path))
            with sqlite_errors(options.path):
                ((mode,),) = _execute(conn, _ops.Stmt(sql.READ_JOURNAL_MODE)).rows
                for pragma in sql.session_pragmas(options.synchronous, options.memory, mode):
                    conn.execute(pragma)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _transaction(self, conn: sqlite3.Connection, op: _ops.Op[T]) -> T:
        with sqlite_errors(self._options.path):
            # IMMEDIATE takes the write lock now, so claims in every process serialize and
            # the select-then-lease inside them cannot race.
            conn.execute("BEGIN IMMEDIATE")
            try:
                value = _drive(conn, op(self._options.clock()))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return value

    def _run(self, op: _ops.Op[T]) -> T:
        with self._lock:
            if self._conn is None:
                raise TransportError(f"{self!r} is closed")
            return self._transaction(self._conn, op)

    def publish(self, group_id: str, event: E, priority: int = 0) -> int:
        return self._run(_ops.publish(self._codec, group_id, event, priority))

    def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        return self._run(_ops.publish_many(self._codec, items))

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease[E] | None:
        claimed = self._run(_ops.claim(worker_id, visibility, min_priority))
        return None if claimed is None else claimed.lease(self._codec)

    def ack(self, lease: Lease[object]) -> None:
        self._run(_ops.ack(lease))

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._run(_ops.nack(lease, delay))

    def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return self._run(_ops.extend(lease, visibility))

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} sqlite:///{self._options.path}>"
