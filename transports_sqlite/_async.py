"""`AsyncSqliteTransport`: the operations of `_ops` run over aiosqlite.

aiosqlite runs one connection's statements in order on its own thread, but it does not
keep two coroutines' transactions apart: a statement from task B issued while task A is
between BEGIN and COMMIT would join (or break) A's transaction. An `asyncio.Lock` spans
each whole transaction. The connection is opened lazily, on first use, like
``aiosqlite.connect()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Generic, TypeVar

import aiosqlite

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


async def _execute(conn: aiosqlite.Connection, stmt: _ops.Stmt) -> _ops.Result:
    # Each call below is a round trip to aiosqlite's thread: rows come back with the
    # statement when it is known to produce them.
    if stmt.many is not None:
        cursor = await conn.executemany(stmt.sql, stmt.many)
    elif sql.returns_rows(stmt.sql):
        rows = list(await conn.execute_fetchall(stmt.sql, stmt.params))
        return _ops.Result(rows, len(rows))
    else:
        cursor = await conn.execute(stmt.sql, stmt.params)
    # No result columns: nothing to fetch, and no second trip.
    rows = list(await cursor.fetchall()) if cursor.description else []
    return _ops.Result(rows, cursor.rowcount)


async def _drive(conn: aiosqlite.Connection, steps: _ops.Steps[T]) -> T:
    try:
        stmt = next(steps)
        while True:
            stmt = steps.send(await _execute(conn, stmt))
    except StopIteration as stop:
        value: T = stop.value
        return value


async def _perform(conn: aiosqlite.Connection, op: _ops.Operation[T], now: float) -> T:
    if isinstance(op, _ops.Op):  # not the ABC `Single`, whose isinstance is slow
        return await _drive(conn, op.steps(now))
    rows, rowcount = await _execute(conn, _ops.Stmt(*op.statement(now)))
    value = op.result(rows, rowcount, now)
    steps = None if value is not None else op.more(now)
    return value if steps is None else await _drive(conn, steps)


async def _rollback(conn: aiosqlite.Connection) -> None:
    # Queued behind whatever the thread is still running for us, so it always lands on our
    # own transaction; "no transaction is active" just means BEGIN failed or COMMIT won.
    with contextlib.suppress(sqlite3.OperationalError):
        await conn.execute("ROLLBACK")


class AsyncSqliteTransport(Generic[E]):
    """A durable transport in one SQLite file (or in memory), over aiosqlite."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        self._options = options
        self._codec: EventCodec[E] = EventCodec(event_type)
        self._claims = _ops.Claims(options.max_attempts, options.on_dead)
        self._lock = asyncio.Lock()
        self._conn: aiosqlite.Connection | None = None
        self._closed = False
        self._rollbacks: set[asyncio.Task[None]] = set()

    async def _connect(self) -> aiosqlite.Connection:
        options = self._options
        target = database_target(options)
        with sqlite_errors(options.path):
            conn = await aiosqlite.connect(
                target, uri=True, isolation_level=None, timeout=options.busy_timeout / 1000
            )
        try:
            # Look before asking for the write lock, so that a read-only queue opens.
            if await self._transaction(conn, _ops.needs_setup(options.path)):
                await self._transaction(conn, _ops.new_file())
                await self._transaction(conn, _ops.setup(options.path))
            session = _ops.session(options.synchronous, options.memory)
            await self._transaction(conn, session)
        except BaseException:
            await asyncio.shield(conn.close())
            raise
        return conn

    async def _transaction(self, conn: aiosqlite.Connection, op: _ops.Operation[T]) -> T:
        """Run ``op`` in one transaction, retried on contention: see the sync twin."""
        started = time.monotonic()
        try:
            return await self._attempt(conn, op)
        except sqlite3.DatabaseError as exc:
            failed = exc
        retries = Retries(started, self._options.busy_timeout)
        with sqlite_errors(self._options.path):
            while (delay := retries.after(failed)) is not None:
                await asyncio.sleep(delay)
                try:
                    return await self._attempt(conn, op)
                except sqlite3.OperationalError as exc:
                    failed = exc
            raise failed

    async def _attempt(self, conn: aiosqlite.Connection, op: _ops.Operation[T]) -> T:
        # Every commit is flushed as the level says, lease moves included: here the sync
        # twin's bracket (`_ops.lease_durability`) would cost two more trips to the
        # driver's thread, more than the flush it saves.
        begin = op.begin
        if begin is None:  # AUTOCOMMIT: each statement is its own transaction
            return await _perform(conn, op, self._options.clock())
        await conn.execute(begin)
        try:
            value = await _perform(conn, op, self._options.clock())
            await conn.execute("COMMIT")
        except Exception:
            # A failed attempt is rolled back before it is retried or raised. A cancellation
            # is not waited for here: `_run` hands its rollback to a task.
            await _rollback(conn)
            raise
        return value

    async def _abandon(self, conn: aiosqlite.Connection) -> None:
        try:
            await _rollback(conn)
        finally:
            self._lock.release()

    async def _run(self, op: _ops.Operation[T]) -> T:
        await self._lock.acquire()
        try:
            if self._closed:
                raise TransportError(f"{self!r} is closed")
            if self._conn is None:
                self._conn = await self._connect()
            conn = self._conn
            value = await self._transaction(conn, op)
        except Exception:
            self._lock.release()
            raise
        except BaseException:
            # Cancelled, say while SQLite waits for the write lock: return at once, and roll
            # back in a task that keeps the lock until it is done, so that no other task's
            # statement can slip into the abandoned transaction.
            if self._conn is None:
                self._lock.release()
                raise
            task = asyncio.get_running_loop().create_task(self._abandon(self._conn))
            self._rollbacks.add(task)
            task.add_done_callback(self._rollbacks.discard)
            raise
        self._lock.release()
        return value

    async def _idle(self) -> None:
        """A claim found nothing: shrink a large WAL, without waiting (see the sync twin)."""
        if not _ops.checkpoint_due(wal_bytes(self._options)):
            return
        async with self._lock:
            conn = self._conn
            if conn is None:
                return
            with sqlite_errors(self._options.path):
                await conn.execute(sql.busy_timeout(0))
                try:
                    await (await conn.execute(sql.CHECKPOINT_TRUNCATE)).fetchall()
                except sqlite3.OperationalError as exc:
                    if not is_transient(exc):
                        raise
                finally:
                    await asyncio.shield(conn.execute(sql.busy_timeout(self._options.busy_timeout)))

    async def publish(self, group_id: str, event: E, priority: int = 0) -> int:
        return await self._run(_ops.Publish(self._codec, group_id, event, priority))

    async def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        return await self._run(_ops.publish_many(self._codec, items))

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Lease[E] | None:
        claimed = await self._run(self._claims(worker_id, visibility, min_priority))
        if claimed is None:
            await self._idle()
            return None
        return claimed.lease(self._codec)

    async def ack(self, lease: Lease[object]) -> None:
        await self._run(_ops.Ack(lease))

    async def nack(self, lease: Lease[object], delay: float = 0) -> None:
        await self._run(_ops.Nack(lease, delay))

    async def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return await self._run(_ops.Extend(lease, visibility))

    async def stats(self) -> QueueStats:
        return await self._run(_ops.stats())

    async def groups(self, limit: int = 10) -> list[GroupInfo]:
        return await self._run(_ops.groups(limit))

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        return await self._run(_ops.dead_letters(limit))

    async def held_groups(self) -> list[HeldGroup]:
        return await self._run(_ops.held_groups())

    async def requeue(self, seq: int) -> bool:
        return await self._run(_ops.requeue(seq))

    async def discard(self, seq: int) -> bool:
        return await self._run(_ops.discard(seq))

    async def purge_group(self, group_id: str) -> int:
        return await self._run(_ops.purge_group(group_id))

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} sqlite:///{self._options.path}>"
