"""`AsyncSqliteTransport`: the sync twin's engine, run on the event loop's thread when
that is safe and cheap, and on a thread of its own otherwise.

A trip from the event loop to another thread and back costs about as much as a whole
claim+ack at ``synchronous=normal``, so a transaction that cannot make the loop wait runs
right where it is called (`LoopEngine.run_here`): a brief one whose commit flushes
nothing, while the engine's thread is idle, in one attempt that never waits for a lock
and never checkpoints. Everything else (what flushes, what waits for another process,
batches and admin calls, the open sequence, checkpoints) goes to the engine's thread,
whole, awaited as one future. The connection is opened lazily, on first use, on that
thread. See docs/sqlite.md, "The async twin".
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import sys
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from transports_core import Event, Lease, TransportError
from transports_core.backend import (
    AsyncTransportBase,
    Claimed,
    GiveBack,
    Operation,
    WaitState,
    wait_for_async,
)

from . import _ops
from . import _sql as sql
from ._errors import is_transient, sqlite_errors
from ._sync import CallersConnection, Engine, Twin, Waiting, own
from ._url import SqliteOptions
from ._watch import Watcher

if TYPE_CHECKING:
    import aiosqlite

E = TypeVar("E")
T = TypeVar("T")


async def _sleep(watcher: Watcher, timeout: float) -> bool:
    """The async form of `Watcher.wait`: readiness comes through the event loop."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    fds = watcher.fds()
    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        await asyncio.wait((woken,), timeout=timeout)
    finally:
        for fd in fds:
            loop.remove_reader(fd)
    return watcher.drain()


class NotHere:
    """What `LoopEngine.run_here` returns when the operation must go to the engine's
    thread instead; nothing of it was done."""

    __slots__ = ()


NOT_HERE = NotHere()


class LoopEngine(Engine):
    """The async twin's engine: `run_here` tries a transaction on the event loop's thread,
    and `run`, on the engine's own thread, runs it as the sync twin's engine does.

    A transaction runs on the loop only if it cannot make the loop wait: it is brief, its
    commit flushes nothing (`_ops.commit_flushes`), and it gets one attempt, which
    neither waits for a lock nor checkpoints. So the connection rests with a busy timeout
    of 0 and without automatic checkpoints (`_sql.session_pragmas`): an attempt that
    meets SQLITE_BUSY is rolled back and handed to the engine's thread. There a
    transaction that meets contention sets the busy timeout for its retries (see
    `Engine._retry`), and one that is not brief checkpoints in its commit as the sync
    twin's do. Brief ones are counted wherever they ran; once they may have filled as
    many pages as an automatic checkpoint waits for, the transport has the thread run
    `checkpoint`. As the first commit into a WAL that a checkpoint emptied flushes the
    WAL's new header, the thread makes that commit itself, right after the checkpoint."""

    on_loop = True

    def __init__(self, options: SqliteOptions) -> None:
        super().__init__(options)
        self.unchecked = 0  # brief transactions committed since the last checkpoint
        pages = sql.CHECKPOINT_PAGES[options.synchronous]
        self._autocheckpoint: tuple[str, str] | None = None
        self._checkpoint_after = sys.maxsize  # in memory: no WAL to checkpoint
        if not options.memory:
            self._autocheckpoint = (sql.wal_autocheckpoint(pages), sql.wal_autocheckpoint(0))
            self._checkpoint_after = pages // sql.BRIEF_COMMIT_PAGES

    def may_run_here(self, op: _ops.Op[Any]) -> bool:
        """Whether ``op`` may run on the event loop's thread (see the class)."""
        options = self.options
        return op.brief and not _ops.commit_flushes(op, options.synchronous, options.memory)

    def run_here(self, op: _ops.Op[T]) -> T | NotHere:
        """Run ``op``, which `may_run_here`, now, on the calling thread (the event loop's);
        `NOT_HERE` if the database is busy."""
        conn = self.conn
        if conn is None:
            return NOT_HERE  # closed: the engine's thread says so
        writers = self.writers(op)
        if writers is not None and not writers.acquire(blocking=False):
            return NOT_HERE  # another connection of this process writes: never wait here
        try:
            value = self.attempt_held(conn, op)
        except sqlite3.DatabaseError as exc:
            if is_transient(exc):
                return NOT_HERE  # rolled back: the engine's thread runs it from the start
            with sqlite_errors(self.options.path):
                raise
        finally:
            if writers is not None:
                writers.release()
        self.unchecked += 1
        self._ran(op)
        return value

    def run(self, op: _ops.Op[T]) -> T:
        if op.brief:
            value = super().run(op)
            self.unchecked += 1
            return value
        if self._autocheckpoint is None:
            return super().run(op)
        conn = self.connection()
        on, off = self._autocheckpoint
        conn.execute(on)
        try:
            return super().run(op)
        finally:
            conn.execute(off)

    def checkpoint_due(self) -> bool:
        return self.unchecked >= self._checkpoint_after

    def checkpoint(self) -> None:
        """On the engine's thread: the checkpoint SQLite would have run in a commit."""
        self.unchecked = 0
        self._checkpoint(sql.CHECKPOINT_PASSIVE)

    def _checkpoint(self, statement: str) -> bool:
        emptied = super()._checkpoint(statement)
        if emptied:
            # One attempt: if another connection writes first, its commit starts the WAL
            # over instead.
            try:
                self._attempt(self.connection(), _ops.RewriteHeader())
            except sqlite3.OperationalError as exc:
                if not is_transient(exc):
                    with sqlite_errors(self.options.path):
                        raise
        return emptied


class _Thread:
    """The engine's own thread: it runs the calls handed to it one at a time, in order,
    each holding `lock`, and resolves each call's future on the event loop that handed it
    over. A call whose future is cancelled before it begins never runs; one cancelled
    while it runs finishes, unheard (a claim's caller is covered by `GiveBack`).

    `idle` is what the loop asks before it runs a call itself: no call is queued or
    running. Calls handed over are counted on the loop's thread, and calls done with on
    this one, before the loop hears of their value, so that the caller's next call may
    run on the loop at once. (Loops on several threads sharing one transport can only
    misjudge `idle`; `lock` alone keeps two calls off the connection at once.)

    The standard library's ``ThreadPoolExecutor(max_workers=1)`` with
    ``asyncio.wrap_future`` would do the same, at half again the cost of each trip (see
    docs/sqlite.md, "The async twin")."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        # Held around each call: whoever else uses the connection takes it without waiting.
        self.lock = threading.Lock()
        self._stopped = False
        self._handed = 0
        self._finished = 0

    def idle(self) -> bool:
        return self._handed == self._finished

    def call(self, run: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``run`` on the thread; raises `TransportError` once `stop` was called."""
        if self._stopped:
            raise TransportError("the transport is closed")
        if self._thread.ident is None:
            self._thread.start()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._handed += 1
        self._calls.put((run, future))
        return future

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            run, future = call
            if not future.cancelled():
                with self.lock:
                    try:
                        outcome: tuple[object, BaseException | None] = (run(), None)
                    except BaseException as exc:  # the caller gets it, whatever it is
                        outcome = (None, exc)
                self._finished += 1  # before the loop hears: see `idle`
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    future.get_loop().call_soon_threadsafe(_resolve, future, *outcome)
            else:
                self._finished += 1

    def stop(self) -> None:
        """No more calls; those handed over still run."""
        self._stopped = True
        self._calls.put(None)


_Call = tuple[Callable[[], Any], "asyncio.Future[Any]"]


def _resolve(future: asyncio.Future[Any], value: object, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A checkpoint that failed is tried again after more commits, and an error that
    lasts reaches the next call: nobody waits for this one's."""
    if not future.cancelled():
        future.exception()


class OnAiosqlite:
    """`AsyncJoined` for an aiosqlite connection: each operation is one trip to the
    thread that owns the connection, which runs it there whole (`CallersConnection`)
    through aiosqlite's own queue of calls (``Connection._execute``, not public, but
    aiosqlite's one way onto that thread: statement by statement, the public calls would
    make a trip each)."""

    __slots__ = ("_joined", "_opened", "_submit")

    def __init__(
        self,
        submit: Callable[..., Any],
        joined: CallersConnection,
        opened: Callable[[], Awaitable[object]],
    ) -> None:
        self._submit = submit
        self._joined = joined
        self._opened: Callable[[], Awaitable[object]] | None = opened

    async def __call__(self, op: Operation[_ops.Stmt, _ops.Result, T]) -> T:
        if self._opened is not None:  # the transport opens its file on first use
            await self._opened()
            self._opened = None
        value: T = await self._submit(self._joined, op)
        return value


def _aiosqlite_connection() -> type[aiosqlite.Connection] | None:
    """aiosqlite's connection class; None without aiosqlite (the ``aiosqlite`` extra),
    when nobody can have one of its connections either."""
    try:
        import aiosqlite
    except ImportError:
        return None
    return aiosqlite.Connection


# How long a cancelled claim's task waits for what its call leased to be given back
# before it ends: a call that waits for the write lock must not hold the cancellation up.
CANCEL_PATIENCE: Final = 0.05


class AsyncSqliteTransport(Twin[E], AsyncTransportBase[E]):
    """A durable transport in one SQLite file (or in memory), for asyncio.

    A claim whose task is cancelled follows core's `GiveBack`: what the store leased
    meanwhile is given back (`_ops.Unclaim`: free at once, its delivery uncounted). The
    cancellation waits for that at most `CANCEL_PATIENCE`, since the claim may be waiting
    for another process's write lock; calls made after it wait for the give-backs still
    owed, so even the very next claim finds the message."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        super().__init__(options, event_type)
        self._thread = _Thread("transports-sqlite")
        self._engine: LoopEngine | None = None
        self._closed = False  # close() was called: waiting claims stop
        self._gone = False  # the engine's thread has closed the connection
        self._checkpointing = False  # a checkpoint is handed to the engine's thread
        self._give_back: GiveBack[Claimed] = GiveBack(self._unclaim, patience=CANCEL_PATIENCE)

    def _engine_here(self) -> LoopEngine:
        """The engine, opened on first use; only ever called on the engine's thread."""
        if self._gone:
            raise TransportError(f"{self!r} is closed")
        if self._engine is None:
            self._engine = LoopEngine(self._options)
        return self._engine

    def _perform(self, op: _ops.Op[T]) -> T:
        return self._engine_here().run(op)

    def _here(self, op: _ops.Op[T]) -> T | NotHere:
        """Run ``op`` on the event loop's thread, if the engine's thread is idle and ``op``
        may run here (see `LoopEngine`); else `NOT_HERE`."""
        engine, thread = self._engine, self._thread
        if engine is None or self._closed or not engine.may_run_here(op) or not thread.idle():
            return NOT_HERE
        if not thread.lock.acquire(blocking=False):
            return NOT_HERE
        try:
            value = engine.run_here(op)
        finally:
            thread.lock.release()
        self._tidy(engine)
        return value

    def _tidy(self, engine: LoopEngine) -> None:
        """Hand a due checkpoint to the engine's thread (see `LoopEngine`)."""
        if self._checkpointing or not engine.checkpoint_due() or self._closed:
            return
        self._checkpointing = True
        self._thread.call(partial(self._checkpoint, engine)).add_done_callback(_retrieve)

    def _checkpoint(self, engine: LoopEngine) -> None:
        try:
            if not self._gone:
                engine.checkpoint()
        finally:
            self._checkpointing = False

    def _submit(self, run: Callable[[], T]) -> asyncio.Future[T]:
        try:
            return self._thread.call(run)
        except TransportError:
            raise TransportError(f"{self!r} is closed") from None

    async def _away(self, op: _ops.Op[T]) -> T:
        """Run ``op`` on the engine's thread."""
        value = await self._submit(partial(self._perform, op))
        if self._engine is not None:
            self._tidy(self._engine)
        return value

    async def _run(self, op: Operation[_ops.Stmt, _ops.Result, T]) -> T:
        mine = own(op)
        if self._give_back.owed:
            await self._give_back.drain()
        value = self._here(mine)
        if isinstance(value, NotHere):
            return await self._away(mine)
        return value

    async def _claim(self, op: _ops.Claim) -> Claimed | None:
        if self._give_back.owed:
            await self._give_back.drain()
        claimed = self._here(op)
        if not isinstance(claimed, NotHere):
            return claimed  # no await: the caller has it
        return await self._give_back.claim(self._submit(partial(self._perform, op)))

    def _giving_back(self) -> GiveBack[Claimed]:
        return self._give_back

    async def _leasing(self, op: Operation[_ops.Stmt, _ops.Result, T], *held: Lease[Any]) -> T:
        if not self._give_back.owed:
            value = self._here(own(op))
            if not isinstance(value, NotHere):
                return value  # run on the loop's thread, with no await: nothing cancelled it
        return await super()._leasing(op, *held)

    async def _unclaim(self, claimed: Claimed) -> None:
        """The give-back of a cancelled claim's lease (see the class)."""
        unclaim = _ops.Unclaim(Lease(*claimed))
        # Not `_run`, which drains the give-backs under way, this one among them.
        with contextlib.suppress(TransportError):  # closed meanwhile: nothing to give
            given = self._here(unclaim)
            if isinstance(given, NotHere):
                await self._away(unclaim)

    async def _look(self, engine: LoopEngine, min_priority: int) -> WaitState:
        state = self._here(_ops.wait_state(min_priority))
        if isinstance(state, NotHere):
            return await self._submit(partial(engine.look, min_priority))
        return engine.seen(state)

    async def _wait(self, op: _ops.Claim, wait: float) -> Claimed | None:
        """Claim until a message comes or ``wait`` runs out (see `Waiting`)."""
        engine = self._engine
        if engine is None:
            return None
        with Waiting(engine, self._options, wait, lambda: self._closed) as waiting:
            return await wait_for_async(
                waiting.plan,
                partial(self._look, engine, op.min_priority),
                partial(self._claim, op),
                partial(_sleep, waiting.watcher),
                waiting.closed,
            )
        return None  # the transport closed meanwhile (see `Waiting`)

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        op, seconds = self._claim_of(worker_id, visibility, min_priority, wait)
        claimed = await self._claim(op)
        if claimed is None and seconds > 0:
            claimed = await self._wait(op, seconds)
        if claimed is None:
            engine = self._engine
            # The WAL's size is one stat; shrinking it, on the engine's thread.
            if not self._closed and engine is not None and engine.idle_due():
                await self._submit(engine.idle)
            return None
        return claimed.lease(self._codec)

    def _join(self, conn: object) -> OnAiosqlite:
        connection = _aiosqlite_connection()
        if connection is None or not isinstance(conn, connection):
            instead = (
                ": use SqliteTransport.within for a sqlite3 one, whose calls block"
                if isinstance(conn, sqlite3.Connection)
                else ""
            )
            raise TypeError(
                f"{self!r} joins the transaction of an aiosqlite.Connection, not of "
                f"{type(conn).__module__}.{type(conn).__qualname__}{instead}"
            )
        if self._closed:
            raise TransportError(f"{self!r} is closed")
        submit = getattr(conn, "_execute", None)
        if not callable(submit):
            raise TransportError(
                "this version of aiosqlite has no Connection._execute, the one way to run "
                "an operation on its connection's thread; durable-transports[aiosqlite] "
                "names the versions that do"
            )
        try:
            raw: sqlite3.Connection = conn._conn
        except ValueError:
            raise ValueError(f"{conn!r} is not connected, or closed") from None
        return OnAiosqlite(submit, CallersConnection(self._options, raw), self._opened)

    async def _opened(self) -> None:
        """Open the engine (and so set the file up) unless it is open already."""
        if self._engine is None:
            await self._submit(self._engine_here)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        engine = self._engine
        if engine is not None:
            for watcher in tuple(engine.waiters):
                watcher.nudge()
        await self._give_back.drain()
        # Queued behind every transaction handed over before it, which still run.
        closing = self._submit(self._close_here)
        self._thread.stop()
        await asyncio.shield(closing)

    def _close_here(self) -> None:
        self._gone = True
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
