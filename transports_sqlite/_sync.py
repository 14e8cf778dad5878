"""`SqliteTransport`: the operations of `_ops` run over the standard library's sqlite3.

One connection, shared by threads under a lock that spans each whole transaction.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Generic, TypeVar

from transports_core import (
    DeadLetter,
    Event,
    GroupInfo,
    HeldGroup,
    Lease,
    QueueStats,
    TransportError,
)
from transports_core.backend import EventCodec

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

from . import _ops
from . import _sql as sql
from ._errors import Retries, is_transient, sqlite_errors
from ._url import SqliteOptions, database_target, wal_bytes

E = TypeVar("E")
T = TypeVar("T")


def _execute(conn: sqlite3.Connection, stmt: _ops.Stmt) -> _ops.Result:
    if stmt.many is not None:
        cursor = conn.executemany(stmt.sql, stmt.many)
    else:
        cursor = conn.execute(stmt.sql, stmt.params)
    # No result columns: nothing to fetch (the statement has run to completion).
    rows = cursor.fetchall() if cursor.description else []
    return _ops.Result(rows, cursor.rowcount)


def _drive(conn: sqlite3.Connection, steps: _ops.Steps[T]) -> T:
    try:
        stmt = next(steps)
        while True:
            stmt = steps.send(_execute(conn, stmt))
    except StopIteration as stop:
        value: T = stop.value
        return value


def _perform(conn: sqlite3.Connection, op: _ops.Operation[T], now: float) -> T:
    if isinstance(op, _ops.Op):  # not the ABC `Single`, whose isinstance is slow
        return _drive(conn, op.steps(now))
    cursor = conn.execute(*op.statement(now))
    rows = cursor.fetchall() if cursor.description else []
    value = op.result(rows, cursor.rowcount, now)
    steps = None if value is not None else op.more(now)
    return value if steps is None else _drive(conn, steps)


class SqliteTransport(Generic[E]):
    """A durable transport in one SQLite file (or in memory), over sqlite3."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        self._options = options
        self._codec: EventCodec[E] = EventCodec(event_type)
        self._claims = _ops.Claims(options.max_attempts, options.on_dead)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._relax = _ops.lease_durability(options.synchronous, options.memory)
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
            # Look before asking for the write lock, so that a read-only queue opens.
            if self._transaction(conn, _ops.needs_setup(options.path)):
                self._transaction(conn, _ops.new_file())
                self._transaction(conn, _ops.setup(options.path))
            self._transaction(conn, _ops.session(options.synchronous, options.memory))
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _transaction(self, conn: sqlite3.Connection, op: _ops.Operation[T]) -> T:
        """Run ``op`` in one transaction, again from the start while it fails on contention
        (see `retry_delay`): nothing of a failed attempt was committed."""
        started = time.monotonic()
        try:
            return self._attempt(conn, op)  # the common case, kept free of bookkeeping
        except sqlite3.DatabaseError as exc:
            failed = exc
        retries = Retries(started, self._options.busy_timeout)
        with sqlite_errors(self._options.path):
            while (delay := retries.after(failed)) is not None:
                time.sleep(delay)
                try:
                    return self._attempt(conn, op)
                except sqlite3.OperationalError as exc:
                    failed = exc
            raise failed

    def _attempt(self, conn: sqlite3.Connection, op: _ops.Operation[T]) -> T:
        relax = None if op.durable else self._relax
        if relax is None:
            return self._commit(conn, op)
        conn.execute(relax.before)
        try:
            return self._commit(conn, op)
        finally:
            conn.execute(relax.after)

    def _commit(self, conn: sqlite3.Connection, op: _ops.Operation[T]) -> T:
        begin = op.begin
        if begin is None:  # AUTOCOMMIT: each statement is its own transaction
            return _perform(conn, op, self._options.clock())
        conn.execute(begin)
        try:
            value = _perform(conn, op, self._options.clock())
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return value

    def _run(self, op: _ops.Operation[T]) -> T:
        with self._lock:
            if self._conn is None:
                raise TransportError(f"{self!r} is closed")
            return self._transaction(self._conn, op)

    def _idle(self) -> None:
        """A claim found nothing: a good moment to shrink a large WAL. Never waits: if
        someone is reading or writing, the next idle claim tries again."""
        if not _ops.checkpoint_due(wal_bytes(self._options)):
            return
        with self._lock, sqlite_errors(self._options.path):
            conn = self._conn
            if conn is None:
                return
            conn.execute(sql.busy_timeout(0))
            try:
                conn.execute(sql.CHECKPOINT_TRUNCATE).fetchall()
            except sqlite3.OperationalError as exc:
                if not is_transient(exc):
                    raise
            finally:
                conn.execute(sql.busy_timeout(self._options.busy_timeout))

    def publish(self, group_id: str, event: E, priority: int = 0) -> int:
        return self._run(_ops.Publish(self._codec, group_id, event, priority))

    def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        return self._run(_ops.publish_many(self._codec, items))

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease[E] | None:
        claimed = self._run(self._claims(worker_id, visibility, min_priority))
        if claimed is None:
            self._idle()
            return None
        return claimed.lease(self._codec)

    def ack(self, lease: Lease[object]) -> None:
        self._run(_ops.Ack(lease))

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._run(_ops.Nack(lease, delay))

    def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return self._run(_ops.Extend(lease, visibility))

    def stats(self) -> QueueStats:
        return self._run(_ops.stats())

    def groups(self, limit: int = 10) -> list[GroupInfo]:
        return self._run(_ops.groups(limit))

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        return self._run(_ops.dead_letters(limit))

    def held_groups(self) -> list[HeldGroup]:
        return self._run(_ops.held_groups())

    def requeue(self, seq: int) -> bool:
        return self._run(_ops.requeue(seq))

    def discard(self, seq: int) -> bool:
        return self._run(_ops.discard(seq))

    def purge_group(self, group_id: str) -> int:
        return self._run(_ops.purge_group(group_id))

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
