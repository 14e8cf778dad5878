"""`AsyncSqliteTransport`: the sync twin's `Engine`, run on a thread of its own.

Each call hands its whole transaction to that thread and awaits it as one future, so a
claim+ack costs two trips between the event loop and the thread, whatever the number of
statements. A driver that runs statement by statement (aiosqlite) costs a trip for each
of them, and its public API cannot run a whole transaction in one. One thread also keeps
the transactions of concurrent tasks apart without a lock. The connection is opened
lazily, on first use. See docs/sqlite.md, "The async twin".
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar, cast

from transports_core import Event, Lease, TransportError
from transports_core.backend import AsyncTransportBase, EventCodec, check_wait

from . import _ops
from ._sync import Engine, watcher_for
from ._url import SqliteOptions
from ._watch import CLAIM, LOOK, Watcher, plan

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


class _Thread:
    """The engine's own thread: runs the calls handed to it one at a time, in order, and
    resolves each call's future on the event loop that handed it over.

    A call may come with an ``undo``: if its caller is cancelled once it has run, ``undo``
    gets its value on the thread before any call handed over later runs. So a claim's
    value that is on its way to the loop is "undecided" until the loop takes it, and a
    call handed over meanwhile first undoes the values whose callers are gone."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._stopped = False
        self._lock = threading.Lock()
        self._undecided: dict[_Call[Any], object] = {}

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
        self._calls.put(_Call(run, future, loop, undo))
        return future

    def _undo_abandoned(self) -> None:
        with self._lock:
            gone = [(c, v) for c, v in self._undecided.items() if c.future.cancelled()]
            for call, _ in gone:
                del self._undecided[call]
        for call, value in gone:
            self._undo(call, value)

    def _undo(self, call: _Call[T], value: T) -> None:
        """Queue ``call``'s undo of ``value`` (its caller is gone: nobody awaits it)."""
        assert call.undo is not None
        undo = partial(call.undo, value)
        self._calls.put(_Call(undo, call.loop.create_future(), call.loop, None))

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            if call.future.cancelled():
                continue  # given up before it began: it never happens
            try:
                value = call.run()
            except BaseException as exc:  # the caller gets it, whatever it is
                self._resolve(call, None, exc)
                continue
            if call.undo is not None:
                with self._lock:
                    abandoned = call.future.cancelled()
                    if not abandoned:
                        self._undecided[call] = value
                if abandoned:
                    call.undo(value)
                    continue
            self._resolve(call, value, None)

    def _resolve(self, call: _Call[T], value: T | None, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            call.loop.call_soon_threadsafe(self._settle, call, value, error)

    def _settle(self, call: _Call[T], value: T | None, error: BaseException | None) -> None:
        if call.undo is not None and error is None:
            with self._lock:
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


class AsyncSqliteTransport(AsyncTransportBase[E]):
    """A durable transport in one SQLite file (or in memory), for asyncio."""

    _ops = _ops

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        self._options = options
        self._codec = EventCodec(event_type)
        self._on_dead = options.on_dead
        self._claims = _ops.Claims(options.max_attempts, options.on_dead)
        self._thread = _Thread("transports-sqlite")
        self._engine: Engine | None = None
        self._closed = False  # close() was called: waiting claims stop
        self._gone = False  # the engine's thread has closed the connection

    def _engine_here(self) -> Engine:
        """The engine, opened on first use; only ever called on the engine's thread."""
        if self._gone:
            raise TransportError(f"{self!r} is closed")
        if self._engine is None:
            self._engine = Engine(self._options)
        return self._engine

    def _perform(self, op: _ops.Op[T]) -> T:
        return self._engine_here().run(op)

    def _submit(
        self, run: Callable[[], T], undo: Callable[[T], object] | None = None
    ) -> asyncio.Future[T]:
        try:
            return self._thread.call(run, undo)
        except TransportError:
            raise TransportError(f"{self!r} is closed") from None

    # Narrower than the base's: it only ever gets the operations of its own `_ops`.
    async def _run(self, op: _ops.Op[T]) -> T:  # type: ignore[override]
        return await self._submit(partial(self._perform, op))

    async def _claim(self, op: _ops.Claim) -> _ops.Claimed | None:
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

    def _hand_back(self, claimed: _ops.Claimed | None) -> None:
        """On the engine's thread: undo a claim whose caller was cancelled."""
        if claimed is None:
            return
        unclaim = _ops.Unclaim(Lease(*claimed))
        with contextlib.suppress(TransportError):  # closed meanwhile: nothing to give
            self._perform(unclaim)

    async def _wait(self, op: _ops.Claim, wait: float) -> _ops.Claimed | None:
        """Claim until a message comes or ``wait`` runs out (see `_watch.plan`)."""
        engine = self._engine
        if engine is None:
            return None
        watcher = watcher_for(self._options)
        engine.waiters.add(watcher)
        steps = plan(wait, watcher.sees_files, self._options.clock, time.monotonic)
        try:
            reply: object = None
            while not self._closed:
                step = steps.send(reply)
                if step == LOOK:
                    reply = await self._submit(partial(engine.look, op.min_priority))
                elif step == CLAIM:
                    claimed = await self._claim(op)
                    if claimed is not None:
                        return claimed
                    reply = False
                else:
                    assert isinstance(step, float)
                    reply = await _sleep(watcher, step)
        except StopIteration:
            pass
        except TransportError:
            if not self._closed:
                raise
        finally:
            steps.close()
            engine.waiters.discard(watcher)
            watcher.close()
        return None

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        op = self._claims(worker_id, visibility, min_priority)
        seconds = 0.0 if type(wait) is int and wait == 0 else check_wait(wait)
        claimed = await self._claim(op)
        if claimed is None and seconds > 0:
            claimed = await self._wait(op, seconds)
        if claimed is None:
            if not self._closed:  # closed while it waited: the wait ends with nothing
                await self._submit(lambda: self._engine_here().idle())
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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} sqlite:///{self._options.path}>"
