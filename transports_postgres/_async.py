"""`AsyncPostgresTransport`: the operations of `_ops`, run by core's `drive_async` over
psycopg's `AsyncConnectionPool`, with the same statements and round trips as the sync twin.

The pool is opened lazily, on first use (an event loop must be running). A blocked
``claim(wait=)`` follows core's `wait_plan`, awaiting an event that a listener task, on
its own LISTEN connection, sets. A claim whose task is cancelled gives back what the
server leased for it (core's `GiveBack`, with `_ops.Unclaim`). ``within(conn)`` takes a
psycopg `AsyncConnection`, as the sync twin takes a `Connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from transports_core import AsyncWithin, Event, Lease, TransportError
from transports_core import backend as core
from transports_core.backend import Claimed, GiveBack, Operation, drive_async

from . import _ops
from ._errors import Call, JoinedCall, postgres_errors, unreachable
from ._sync import (
    LISTEN_TICK,
    Configured,
    Listening,
    OneCursor,
    bind,
    check_alive,
    check_joinable,
    first_connect,
    has_rows,
    in_transaction,
    not_this_store,
    note_goodbye,
    own,
    pool_arguments,
)
from ._url import PostgresOptions

E = TypeVar("E")
T = TypeVar("T")


class AConn(psycopg.AsyncConnection[Any], OneCursor[psycopg.AsyncCursor[Any]]):
    def _new_cursor(self) -> psycopg.AsyncCursor[Any]:
        return self.cursor()


async def _result(cursor: psycopg.AsyncCursor[Any]) -> _ops.Result:
    return _ops.Result(await cursor.fetchall() if has_rows(cursor) else [], cursor.rowcount)


async def run_batch(conn: AConn, schema: str, call: Call, batch: _ops.Batch) -> list[_ops.Result]:
    """The sync twin's `run_batch`, awaited."""
    if len(batch) == 1:
        call.sent = True
        stmt = batch[0]
        cursor = await conn.single().execute(stmt.statement.render(schema), bind(stmt))
        return [await _result(cursor)]
    if not batch:
        return []
    call.sent = True
    async with conn.pipeline():
        cursors = [await conn.execute(s.statement.render(schema), bind(s)) for s in batch]
    return [await _result(cursor) for cursor in cursors]


async def run_caller(
    conn: psycopg.AsyncConnection[Any], schema: str, call: Call, batch: _ops.Batch
) -> list[_ops.Result]:
    """The sync twin's `run_caller`, awaited."""
    if not batch:
        return []
    call.sent = True
    if len(batch) == 1:
        (stmt,) = batch
        cursor = psycopg.AsyncCursor(conn, row_factory=tuple_row)
        return [await _result(await cursor.execute(stmt.statement.render(schema), bind(stmt)))]
    async with conn.pipeline():
        cursors = [
            await psycopg.AsyncCursor(conn, row_factory=tuple_row).execute(
                s.statement.render(schema), bind(s)
            )
            for s in batch
        ]
    return [await _result(cursor) for cursor in cursors]


async def configure(conn: AConn) -> None:
    note_goodbye(conn)


async def _first(cursor: psycopg.AsyncCursor[Any]) -> int:
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


class APool(AsyncConnectionPool[AConn]):
    """The sync twin's `Pool`, awaited."""

    def __init__(self, options: PostgresOptions) -> None:
        self._options = options
        super().__init__(
            options.conninfo,
            connection_class=AConn,
            configure=configure,
            **pool_arguments(options),
        )

    async def getconn(self, timeout: float | None = None) -> AConn:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            conn = await super().getconn(max(0.0, deadline - time.monotonic()))
            try:
                check_alive(conn)
            except psycopg.OperationalError:
                await self.putconn(conn)
                options = self._options
                probe = await psycopg.AsyncConnection.connect(
                    options.conninfo, **first_connect(options)
                )
                await probe.close()
                await self.drain()
                continue
            return conn


class _AsyncWaker(Listening):
    """The LISTEN connection's task, and the event blocked claims await."""

    def __init__(self, options: PostgresOptions) -> None:
        super().__init__(options)
        self.event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._count = asyncio.Lock()
        self._chores: set[asyncio.Task[Any]] = set()

    def _bump(self) -> None:
        self.generation += 1
        event, self.event = self.event, asyncio.Event()
        event.set()

    async def _listen(self, ready: asyncio.Event) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        pid = 0
        try:
            target, how = self._target()
            conn = await psycopg.AsyncConnection.connect(target, **how)
            await conn.execute(self._listen_statement())
            pid = await _first(await conn.execute(self.BACKEND_PID))
            if pid != conn.info.backend_pid:
                async with await psycopg.AsyncConnection.connect(target, **how) as other:
                    self._heard(pid, await _first(await other.execute(self.BACKEND_PID)))
            self.pid = pid
            ready.set()
            while not self.closed:
                async for _ in conn.notifies(timeout=LISTEN_TICK):
                    self._bump()
        except Exception as exc:
            self._error = exc
        finally:
            self._stopped(ready)
            if conn is not None:
                with contextlib.suppress(psycopg.Error, asyncio.CancelledError):
                    await conn.execute(*self._goodbye(pid))
                await conn.close()

    async def _start(self) -> int:
        task = self._task
        if task is None or task.done() or self.pid is None:
            ready = asyncio.Event()
            self._error = None
            self._task = asyncio.get_running_loop().create_task(self._listen(ready))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ready.wait(), self._options.pool_timeout)
        return self._started()

    @contextlib.asynccontextmanager
    async def waiting(self, run: Callable[[_ops.Waiter], Awaitable[None]]) -> AsyncIterator[None]:
        pid: int | None = None
        try:
            async with self._count:
                pid = await self._start()
                # Counted before the registration is awaited: a cancellation landing after
                # its commit still unregisters below.
                self._waiting += 1
                if self._waiting == 1 and not self.deaf:
                    await run(_ops.Waiter(pid, True))
            yield
        finally:
            if pid is not None:
                self._waiting -= 1
                if self._waiting == 0 and not self.closed and not self.deaf:
                    # In a task: this claim may be finishing because it was cancelled.
                    chore = asyncio.get_running_loop().create_task(self._unregister(run, pid))
                    self._chores.add(chore)
                    chore.add_done_callback(self._chores.discard)

    async def _unregister(self, run: Callable[[_ops.Waiter], Awaitable[None]], pid: int) -> None:
        async with self._count:
            if self._waiting == 0 and not self.closed:
                with contextlib.suppress(TransportError):
                    await run(_ops.Waiter(pid, False))

    async def wait(self, seen: int, timeout: float) -> bool:
        """Sleep up to ``timeout`` s unless woken since generation ``seen``; whether woken."""
        if self.generation == seen and not self.closed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.event.wait(), timeout)
        return self.generation != seen

    async def close(self) -> None:
        self.closed = True
        self._bump()
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), LISTEN_TICK * 4)
        for chore in list(self._chores):
            chore.cancel()


class AsyncPostgresTransport(Configured[E], core.AsyncTransportBase[E]):
    """A durable transport in one PostgreSQL schema, over psycopg's async pool."""

    def __init__(self, options: PostgresOptions, event_type: object = Event) -> None:
        self._configure(options, event_type)
        self._ops = self._operations
        self._pool: APool | None = None
        self._opening: asyncio.Lock | None = None
        self._waker: _AsyncWaker | None = None
        self._giving: GiveBack[Claimed] = GiveBack(self._give_back)

    async def _open(self) -> APool:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is not None:
                return self._pool
            if self._closed:
                raise TransportError(f"{self!r} is closed")
            options = self._options
            # As the sync twin: fail at once, with libpq's reason, on a server that is down.
            try:
                first = await psycopg.AsyncConnection.connect(
                    options.conninfo, **first_connect(options)
                )
            except psycopg.OperationalError as exc:
                raise unreachable(self._where, exc) from exc
            await first.close()
            pool = APool(options)
            try:
                with postgres_errors(self._where, Call("open", writes=False)):
                    await pool.open(wait=True, timeout=options.pool_timeout)
                await self._perform(pool, _ops.Setup(self._schema_policy))
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            self._waker = _AsyncWaker(options)
            return pool

    async def _perform(self, pool: APool, op: _ops.Operation[T]) -> T:
        call = Call(op.call, op.writes)
        with postgres_errors(self._where, call):
            async with pool.connection() as conn:
                execute = functools.partial(run_batch, conn, self._schema, call)
                try:
                    return await drive_async(op, self._clock(), execute)
                except Exception:
                    # Not on a cancellation: the connection may be mid-statement, and the
                    # pool resets or discards it.
                    if in_transaction(conn):
                        with contextlib.suppress(psycopg.Error):
                            await conn.execute("ROLLBACK")
                    raise

    async def _run(self, op: Operation[_ops.Batch, list[_ops.Result], T]) -> T:
        if self._closed:
            raise TransportError(f"{self!r} is closed")
        pool = self._pool or await self._open()
        return await self._perform(pool, own(op))

    def within(self, conn: object) -> AsyncWithin[E]:
        return AsyncWithin(
            self._joined_ops, self._codec, self._on_dead, self._dedup_window, self._join(conn)
        )

    def _join(self, conn: object) -> _AsyncJoined:
        if not isinstance(conn, psycopg.AsyncConnection):
            twin = " (the sync twin takes those)" if isinstance(conn, psycopg.Connection) else ""
            raise TypeError(
                f"{self._where}: within needs a psycopg.AsyncConnection, not "
                f"{type(conn).__name__}{twin}"
            )
        check_joinable(conn, self._where, "within")
        return _AsyncJoined(self, conn)

    async def _check_store(self, theirs: tuple[Any, ...]) -> None:
        """The sync twin's `_check_store`, awaited."""
        for fresh in (False, True):
            if self._store is None or fresh:
                self._store = await self._run(_ops.Identity(self._schema))
            why = not_this_store(self._where, self._schema, self._store, theirs)
            if not why:
                return
        raise ValueError(why)

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        op = self._operations.claim(worker_id, visibility, min_priority)
        wait = core.check_wait(wait)
        claimed = await self._claim(op)
        if claimed is None and wait > 0:
            claimed = await self._wait(op, wait)
        return None if claimed is None else claimed.lease(self._codec)

    async def _claim(self, op: _ops.Claim) -> Claimed | None:
        # Cancelled while the server may be leasing: what it leases is given back.
        return await self._giving.claim(self._run(op))

    def _giving_back(self) -> GiveBack[Claimed]:
        return self._giving

    async def _give_back(self, claimed: Claimed) -> bool:
        """Undo ``claimed`` (see `_ops.Unclaim`); whether its lease was still current."""
        pool = self._pool
        return pool is not None and await self._perform(pool, _ops.Unclaim(claimed))

    async def _wait(self, op: _ops.Claim, wait: float) -> Claimed | None:
        waker = self._waker
        assert waker is not None  # the first claim opened the pool
        seen = waker.generation

        async def look() -> core.WaitState:
            nonlocal seen
            seen = waker.generation
            return self._looked(seen, await self._run(_ops.NextDue(op.min_priority)))

        try:
            async with waker.waiting(self._run):
                return await core.wait_for_async(
                    self._plan(wait),
                    look,
                    lambda: self._claim(op),
                    lambda timeout: waker.wait(seen, timeout),
                    lambda: waker.closed,
                )
        except TransportError:
            if self._closed:
                return None
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._waker is not None:
            await self._waker.close()
        await self._giving.drain()  # before the pool goes: give-backs need a connection
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._where}>"


class _AsyncJoined:
    """The sync twin's `_Joined`, on a caller's `psycopg.AsyncConnection`."""

    __slots__ = ("_checked", "_conn", "_transport")

    def __init__(
        self, transport: AsyncPostgresTransport[Any], conn: psycopg.AsyncConnection[Any]
    ) -> None:
        self._transport, self._conn, self._checked = transport, conn, False

    async def __call__(self, op: Operation[_ops.Batch, list[_ops.Result], T]) -> T:
        transport, conn = self._transport, self._conn
        schema = transport._schema
        mine = own(op)
        check_joinable(conn, transport._where, f"{mine.call} within")
        call = JoinedCall(mine.call, writes=False)
        execute = functools.partial(run_caller, conn, schema, call)
        with postgres_errors(transport._where, call):
            if not self._checked:
                if transport._pool is None:  # first use: the schema is made on opening
                    await transport._open()
                await transport._check_store(
                    await drive_async(_ops.Identity(schema), None, execute)
                )
                self._checked = True
            joined = _ops.Joined(mine)
            try:
                return await drive_async(joined, transport._clock(), execute)
            except BaseException:
                if joined.opened and not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        await execute(_ops.UNDO)
                raise
