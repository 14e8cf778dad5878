"""`AsyncSqliteTransport`: the operations of `_ops` run over aiosqlite.

aiosqlite runs one connection's statements in order on its own thread, but it does not
keep two coroutines' transactions apart: a statement from task B issued while task A is
between BEGIN and COMMIT would join (or break) A's transaction. An `asyncio.Lock` spans
each whole transaction. The connection is opened lazily, on first use, like
``aiosqlite.connect()``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterable
from types import TracebackType
from typing import Generic, TypeVar

import aiosqlite

from transports_core import Event, Lease, TransportError
from transports_core._codec import EventCodec

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

import contextlib

from . import _ops
from . import _sql as sql
from ._errors import sqlite_errors
from ._url import SqliteOptions, database_target

E = TypeVar("E")
T = TypeVar("T")


async def _execute(conn: aiosqlite.Connection, stmt: _ops.Stmt) -> _ops.Result:
    if stmt.many is not None:
        cursor = await conn.executemany(stmt.sql, stmt.many)
    else:
        cursor = await conn.execute(stmt.sql, stmt.params)
    return _ops.Result(list(await cursor.fetchall()), cursor.rowcount)


async def _drive(conn: aiosqlite.Connection, steps: _ops.Steps[T]) -> T:
    try:
        stmt = next(steps)
        while True:
            stmt = steps.send(await _execute(conn, stmt))
    except StopIteration as stop:
        value: T = stop.value
        return value


async def _rollback(conn: aiosqlite.Connection) -> None:
    # Queued behind whatever the thread is still running for us, so it always lands on our
    # own transaction; "no transaction is active" just means BEGIN or COMMIT beat it to it.
    with contextlib.suppress(sqlite3.OperationalError):
        await conn.execute("ROLLBACK")


class AsyncSqliteTransport(Generic[E]):
    """A durable transport in one SQLite file (or in memory), over aiosqlite."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        self._options = options
        self._codec: EventCodec[E] = EventCodec(event_type)
        self._lock = asyncio.Lock()
        self._conn: aiosqlite.Connection | None = None
        self._closed = False

    async def _connect(self) -> aiosqlite.Connection:
        options = self._options
        target = database_target(options)
        with sqlite_errors(options.path):
            conn = await aiosqlite.connect(
                target, uri=True, isolation_level=None, timeout=options.busy_timeout / 1000
            )
        try:
            await self._transaction(conn, _ops.setup(options.path))
            with sqlite_errors(options.path):
                ((mode,),) = (await _execute(conn, _ops.Stmt(sql.READ_JOURNAL_MODE))).rows
                for pragma in sql.session_pragmas(options.synchronous, options.memory, mode):
                    await conn.execute(pragma)
        except BaseException:
            await asyncio.shield(conn.close())
            raise
        return conn

    async def _transaction(self, conn: aiosqlite.Connection, op: _ops.Op[T]) -> T:
        with sqlite_errors(self._options.path):
            try:
                # IMMEDIATE takes the write lock now: see the sync twin.
                await conn.execute("BEGIN IMMEDIATE")
                value = await _drive(conn, op(self._options.clock()))
                await conn.execute("COMMIT")
            except BaseException:
                # Shielded: a second cancellation must not leave the transaction open.
                await asyncio.shield(_rollback(conn))
                raise
            return value

    async def _run(self, op: _ops.Op[T]) -> T:
        async with self._lock:
            if self._closed:
                raise TransportError(f"{self!r} is closed")
            if self._conn is None:
                self._conn = await self._connect()
            return await self._transaction(self._conn, op)

    async def publish(self, group_id: str, event: E, priority: int = 0) -> int:
        return await self._run(_ops.publish(self._codec, group_id, event, priority))

    async def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        return await self._run(_ops.publish_many(self._codec, items))

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Lease[E] | None:
        claimed = await self._run(_ops.claim(worker_id, visibility, min_priority))
        return None if claimed is None else claimed.lease(self._codec)

    async def ack(self, lease: Lease[object]) -> None:
        await self._run(_ops.ack(lease))

    async def nack(self, lease: Lease[object], delay: float = 0) -> None:
        await self._run(_ops.nack(lease, delay))

    async def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return await self._run(_ops.extend(lease, visibility))

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
