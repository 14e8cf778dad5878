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
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar, cast

from transports_core import Event, Lease, TransportError
from transports_core.backend import AsyncTransportBase, Claimed

from . import _ops
from . import _sql as sql
from ._errors import is_transient, sqlite_errors
from ._sync import Engine, Twin, Waiting
from ._url import SqliteOptions
from ._watch import CLAIM, LOOK, WaitState, Watcher

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
        try:
            value = self._attempt(conn, op)
        except sqlite3.DatabaseError as exc:
            if is_transient(exc):
                return NOT_HERE  # rolled back: the engine's thread runs it from the start
            with sqlite_errors(self.options.path):
                raise
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
    """The engine's own thread: runs the calls handed to it one at a time, in order,
    holding `lock`, and resolves each call's future on the event loop that handed it over.

    A call may come with an ``undo``: if its caller is cancelled once it has run, ``undo``
    gets its value on the thread before any call handed over later runs. So a claim's
    value that is on its way to the loop is "undecided" until the loop takes it, and a
    call handed over meanwhile first undoes the values whose callers are gone."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        # Held around each call: whoever else uses the connection takes it without waiting.
        self.lock = threading.Lock()
        self._stopped = False
        self._guard = threading.Lock()  # over `_undecided`
        self._undecided: dict[_Call[Any], object] = {}
        # Calls handed over (counted on the loop's thread) and calls done with (counted
        # on this one): while they differ, one is queued or running. (Loops on several
        # threads sharing a transport can only misjudge that; `lock` alone keeps two
        # calls off the connection at once.)
        self._handed = 0
        self._finished = 0

    def idle(self) -> bool:
        """Whether no call is queued or running, and no claim's value is undecided."""
        return self._handed == self._finished and not self._undecided

    def call(
        self, run: Callable[[], T], undo: Callable[[T], object] | None = None
    ) -> asyncio.Future[T]:
        """Run ``run`` on the thread; see the class for ``undo``."""
        if self._stopped:
            raise TransportError("the transport is closed")
        if self.thread.ident is None:
            self.thread.start()
        loop = asyncio.get_running_loop()
        if self._undecided:
            self._undo_abandoned()
        future: asyncio.Future[T] = loop.create_future()
        self._hand(_Call(run, future, loop, undo))
        return future

    def _hand(self, call: _Call[Any]) -> None:
        self._handed += 1
        self._calls.put(call)

    def _undo_abandoned(self) -> None:
        with self._guard:
            gone = [(c, v) for c, v in self._undecided.items() if c.future.cancelled()]
            for call, _ in gone:
                del self._undecided[call]
        for call, value in gone:
            self._undo(call, value)

    def _undo(self, call: _Call[T], value: T) -> None:
        """Queue ``call``'s undo of ``value`` (its caller is gone: nobody awaits it)."""
        assert call.undo is not None
        undo = partial(call.undo, value)
        self._hand(_Call(undo, call.loop.create_future(), call.loop, None))

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            with self.lock:
                outcome = self._run(call)
            self._finished += 1
            # Told only now, once idle: the caller's next call may run on its loop at once.
            if outcome is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    call.loop.call_soon_threadsafe(self._settle, call, *outcome)

    def _run(self, call: _Call[T]) -> tuple[T | None, BaseException | None] | None:
        """Run ``call``: its value or its error, for its caller; None if nobody waits."""
        if call.future.cancelled():
            return None  # given up before it began: it never happens
        try:
            value = call.run()
        except BaseException as exc:  # the caller gets it, whatever it is
            return None, exc
        if call.undo is not None:
            with self._guard:
                abandoned = call.future.cancelled()
                if not abandoned:
                    self._undecided[call] = value
            if abandoned:
                call.undo(value)
                return None
        return value, None

    def _settle(self, call: _Call[T], value: T | None, error: BaseException | None) -> None:
        if call.undo is not None and error is None:
            with self._guard:
                if self._undecided.pop(call, self) is self:
                    return  # undone already, by `_undo_abandoned`
            if call.future.cancelled():
                self._undo(call, cast(T, value))  # no error: the call returned a value
                return
        future = call.future
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def stop(self) -> None:
        self._stopped = True
        self._calls.put(None)


class _Call(Generic[T]):
    __slots__ = ("future", "loop", "run", "undo")

    def __init__(
        self,
        run: Callable[[], T],
        future: asyncio.Future[T],
        loop: asyncio.AbstractEventLoop,
        undo: Callable[[T], object] | None,
    ) -> None:
        self.run, self.future, self.loop, self.undo = run, future, loop, undo


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A checkpoint that failed is tried again after more commits, and an error that
    lasts reaches the next call: nobody waits for this one's."""
    if not future.cancelled():
        future.exception()


class AsyncSqliteTransport(Twin[E], AsyncTransportBase[E]):
    """A durable transport in one SQLite file (or in memory), for asyncio."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        super().__init__(options, event_type)
        self._thread = _Thread("transports-sqlite")
        self._engine: LoopEngine | None = None
        self._closed = False  # close() was called: waiting claims stop
        self._gone = False  # the engine's thread has closed the connection
        self._checkpointing = False  # a checkpoint is handed to the engine's thread

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

    def _submit(
        self, run: Callable[[], T], undo: Callable[[T], object] | None = None
    ) -> asyncio.Future[T]:
        try:
            return self._thread.call(run, undo)
        except TransportError:
            raise TransportError(f"{self!r} is closed") from None

    async def _away(self, op: _ops.Op[T]) -> T:
        """Run ``op`` on the engine's thread."""
        value = await self._submit(partial(self._perform, op))
        if self._engine is not None:
            self._tidy(self._engine)
        return value

    # Narrower than the base's: it only ever gets the operations of its own `_ops`.
    async def _run(self, op: _ops.Op[T]) -> T:  # type: ignore[override]
        value = self._here(op)
        if isinstance(value, NotHere):
            return await self._away(op)
        return value

    async def _claim(self, op: _ops.Claim) -> Claimed | None:
        claimed = self._here(op)
        if not isinstance(claimed, NotHere):
            return claimed  # no await: the caller has it
        # A claim whose caller was cancelled once it ran gives its lease back, so that a
        # cancelled claim never leaves a lease nobody holds.
        future = self._submit(partial(self._perform, op), self._hand_back)
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelled after the value arrived, before this task ran again.
            if future.done() and not future.cancelled() and future.exception() is None:
                with contextlib.suppress(TransportError):
                    self._submit(partial(self._hand_back, future.result()))
            raise

    def _hand_back(self, claimed: Claimed | None) -> None:
        """On the engine's thread: undo a claim whose caller was cancelled."""
        if claimed is None:
            return
        unclaim = _ops.Unclaim(Lease(*claimed))
        with contextlib.suppress(TransportError):  # closed meanwhile: nothing to give
            self._perform(unclaim)

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
            reply: object = None
            while (step := waiting.next(reply)) is not None:
                if step == LOOK:
                    reply = await self._look(engine, op.min_priority)
                elif step == CLAIM:
                    reply = await self._claim(op)
                    if reply is not None:
                        return reply
                else:
                    assert isinstance(step, float)
                    reply = await _sleep(waiting.watcher, step)
        return None

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

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        engine = self._engine
        if engine is not None:
            for watcher in tuple(engine.waiters):
                watcher.nudge()
        # Queued behind every transaction handed over before it, which still run.
        closing = self._submit(self._close_here)
        self._thread.stop()
        await asyncio.shield(closing)

    def _close_here(self) -> None:
        self._gone = True
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
