"""`AsyncWorker`: runs an async handler as one task per lease, with the leases kept.

Tasks: ``concurrency`` slots (each claims only while it is free; the claim is cancelled
to stop claiming), and per delivery the handler's task and its lease keeper's task. A
lost lease cancels the handler's task at once, from the keeper. Imports the public contract only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from transports_core import (
    AsyncTransport,
    Event,
    EventDecodeError,
    Lease,
    LeaseLost,
    TransportError,
    open_async_transport,
    redact_url,
)

from ._common import (
    EXIT_DRAINED,
    EXIT_HANDED_BACK,
    Settle,
    check_handler,
    check_options,
    decide,
    default_worker_id,
)
from ._context import AsyncContext
from ._hooks import Delivery, Fanout, Hooks, LoggingHooks
from ._keeper import AsyncLeaseKeeper
from ._outcomes import Cancelled, RetryPolicy, failure_reason

__all__ = ["AsyncWorker"]

E = TypeVar("E")
LOGGER: Final = logging.getLogger("transports_worker")
OWN_WAIT: Final = 10.0
CLAIM_BACKOFF: Final = (0.1, 5.0)
EXIT_NOW: Final = 130
# How long a cancelled handler may take to unwind before the worker stops waiting.
UNWIND: Final = 1.0


@dataclass
class _Running(Generic[E]):
    keeper: AsyncLeaseKeeper[E]
    ctx: AsyncContext[E]
    delivery: Delivery
    task: asyncio.Task[object]
    started: float = field(default_factory=time.monotonic)
    taken: bool = False

    def take(self) -> bool:
        if self.taken:
            return False
        self.taken = True
        return True


class AsyncWorker(Generic[E]):
    """`Worker` for async handlers (``async def handler(event, ctx)``), on an
    `AsyncTransport`: the same options, outcomes and exit codes; `run` is a coroutine.
    A handler whose lease is lost, whose ``timeout`` passes, or that is still running when
    shutdown's ``grace`` ends, has its task cancelled at once."""

    def __init__(
        self,
        source: str | AsyncTransport[E] | Callable[[], AsyncTransport[E]],
        handler: Callable[[E, AsyncContext[E]], Awaitable[object]],
        *,
        event_type: type[E] | None = None,
        concurrency: int = 1,
        visibility: float = 30.0,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        grace: float = 25.0,
        min_priority: int = 0,
        worker_id: str | None = None,
        hooks: Sequence[Hooks] | None = None,
        handle_signals: bool = True,
    ) -> None:
        retry = RetryPolicy() if retry is None else retry
        check_options(
            concurrency=concurrency,
            visibility=visibility,
            timeout=timeout,
            grace=grace,
            min_priority=min_priority,
            worker_id=worker_id,
            retry=retry,
        )
        check_handler(handler, asynchronous=True)
        self._source = source
        self._handler = handler
        self._event_type: object = Event if event_type is None else event_type
        self.concurrency = concurrency
        self.visibility = float(visibility)
        self.timeout = None if timeout is None else float(timeout)
        self.retry = retry
        self.grace = float(grace)
        self.min_priority = min_priority
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        self._hooks = Fanout((LoggingHooks(),) if hooks is None else hooks)
        self._handle_signals = handle_signals
        self._stopping = threading.Event()
        self._requests = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._claims: set[asyncio.Future[Lease[E] | None]] = set()
        self._running: dict[int, _Running[E]] = {}
        self._claimers: list[AsyncTransport[E]] = []
        self._settler: AsyncTransport[E] | None = None
        self._owned = False
        self._started = False
        self._fatal: BaseException | None = None
        self._closing = False
        self.handed_back = 0

    def __repr__(self) -> str:
        source = redact_url(self._source) if isinstance(self._source, str) else self._source
        return f"<AsyncWorker {self.worker_id!r} on {source!r}, concurrency {self.concurrency}>"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """As `Worker.stop`; safe from any thread."""
        loop = self._loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop is not None and current is not loop and not loop.is_closed():
            loop.call_soon_threadsafe(self._request_stop)
        else:
            self._request_stop()

    def _request_stop(self) -> None:
        self._requests += 1
        self._stopping.set()
        for claim in list(self._claims):
            claim.cancel()  # cancelling a claim never leaves a lease nobody holds
        if self._wake is not None:
            self._wake.set()

    def _signalled(self, sig: signal.Signals) -> None:
        if self._requests >= 2:
            os._exit(EXIT_NOW)
        how = "draining" if self._requests == 0 else "cancelling running handlers"
        LOGGER.warning("%s: %s", sig.name, how)
        self._request_stop()

    async def _open(self) -> None:
        source = self._source
        if isinstance(source, str):
            url = source

            def opener() -> AsyncTransport[Any]:
                return open_async_transport(url, event_type=self._event_type)
        elif hasattr(source, "claim") and hasattr(source, "extend"):
            self._settler = source  # type: ignore[assignment]
            self._claimers = [source] * self.concurrency  # type: ignore[list-item]
            return
        elif callable(source):
            opener = source
        else:
            raise TypeError(f"source must be a URL, a transport or a factory, got {source!r}")
        # One claiming handle per slot, so that no claim queues behind another slot's,
        # and one handle shared by the renewals and settles.
        self._settler = opener()
        self._owned = True
        try:
            for _ in range(self.concurrency):
                self._claimers.append(opener())
        except BaseException:
            await self._close_handles()
            raise

    async def run(self) -> int:
        """Work until stopped; return `EXIT_DRAINED` or `EXIT_HANDED_BACK`."""
        if self._started:
            raise RuntimeError(f"{self!r} has already run: make a new AsyncWorker")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await self._open()
        signals = self._install_signals()
        slots = [self._loop.create_task(self._slot(claimer)) for claimer in self._claimers]
        try:
            code = await self._supervise()
        finally:
            for sig in signals:
                self._loop.remove_signal_handler(sig)
            # Idle slots end as their claim is cancelled; a handler that ignores its own
            # cancellation is given up on after UNWIND: nothing it does is settled.
            _, stuck = await asyncio.wait(slots, timeout=UNWIND)
            for task in stuck:
                task.cancel()
            await self._close_handles()
        if self._fatal is not None:
            raise self._fatal
        return code

    def _install_signals(self) -> list[signal.Signals]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._signalled, sig)
            installed.append(sig)
        return installed

    async def _close_handles(self) -> None:
        if self._owned:
            for handle in (*self._claimers, self._settler):
                if handle is not None:
                    try:
                        await handle.close()
                    except Exception:
                        LOGGER.exception("closing %r failed", handle)

    async def _supervise(self) -> int:
        wake = self._wake
        assert wake is not None
        while self._requests == 0 and self._fatal is None:
            await wake.wait()
            wake.clear()
        self._stopping.set()
        for claim in list(self._claims):
            claim.cancel()
        deadline = time.monotonic() + self.grace
        while self._requests < 2 and self._running:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), left)
            wake.clear()
        self._closing = True
        handed = 0
        for item in list(self._running.values()):
            if not item.take():
                continue
            item.ctx.cancel(Cancelled("shutdown"))
            item.task.cancel()
            await asyncio.wait({item.task}, timeout=UNWIND)
            if await self._settle(item, Settle("nack", "handed_back"), None):
                handed += 1
        self.handed_back += handed
        return EXIT_HANDED_BACK if self.handed_back else EXIT_DRAINED

    async def _slot(self, claimer: AsyncTransport[E]) -> None:
        """Claim while free, handle, settle; until the worker stops."""
        wait = min(OWN_WAIT, self.visibility / 2)
        backoff = CLAIM_BACKOFF[0]
        try:
            while not self._stopping.is_set():
                sent = time.monotonic()
                claim = asyncio.ensure_future(
                    claimer.claim(self.worker_id, self.visibility, self.min_priority, wait=wait)
                )
                self._claims.add(claim)
                try:
                    lease = await claim
                except asyncio.CancelledError:
                    if self._stopping.is_set():
                        return
                    raise
                except EventDecodeError as exc:
                    await self._bury_undecodable(exc)
                    continue
                except TransportError as exc:
                    if self._stopping.is_set():
                        return
                    LOGGER.warning("claim failed, retrying in %.1fs: %s", backoff, exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, CLAIM_BACKOFF[1])
                    continue
                finally:
                    self._claims.discard(claim)
                backoff = CLAIM_BACKOFF[0]
                if lease is None:
                    continue
                try:
                    await self._deliver(lease, sent)
                except Exception:  # ours or the backend's bug: the lease lapses, go on
                    LOGGER.exception("delivering message %d failed", lease.seq)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            LOGGER.exception("a worker slot failed")
            self._fatal = exc
            if self._wake is not None:
                self._wake.set()

    async def _bury_undecodable(self, exc: EventDecodeError) -> None:
        delivery = Delivery.of(exc.lease)
        settler = self._settler
        assert settler is not None
        self._hooks.started(delivery)
        try:
            await settler.bury(exc.lease, failure_reason(exc))
        except TransportError as error:
            self._hooks.settled(delivery, "lost", 0.0, error)
            return
        self._hooks.settled(delivery, "buried", 0.0, exc)

    async def _deliver(self, lease: Lease[E], sent: float) -> None:
        settler = self._settler
        assert settler is not None
        assert self._loop is not None
        delivery = Delivery.of(lease)
        if self._closing:  # claimed as the worker stopped: give it straight back
            await self._give_back(lease)
            return
        task_box: list[asyncio.Task[object]] = []

        def lost(error: LeaseLost) -> None:
            self._hooks.lost(delivery, error)
            for task in task_box:
                task.cancel()

        keeper = AsyncLeaseKeeper(
            settler,
            lease,
            self.visibility,
            sent=sent,
            on_lost=lost,
            on_renewed=lambda _: self._hooks.renewed(delivery),
        )
        ctx = AsyncContext(self.worker_id, keeper, self._stopping)
        self._hooks.started(delivery)
        task: asyncio.Task[object] = self._loop.create_task(self._call(lease.event, ctx))
        task_box.append(task)
        item = _Running(keeper, ctx, delivery, task)
        self._running[id(item)] = item
        keeper.start()
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if not done:
                if item.take():
                    ctx.cancel(Cancelled("timeout"))
                    task.cancel()
                    await asyncio.wait({task}, timeout=UNWIND)
                    error: BaseException | None = TimeoutError(
                        f"the handler ran past its timeout of {self.timeout:g}s"
                    )
                    assert error is not None
                    await self._settle(item, decide(error, lease.attempt, self.retry), error)
                return
            if not item.take():
                return
            if task.cancelled():
                await self._settle(item, Settle("none", "lost"), None)
                return
            error = task.exception()
            if error is not None and not isinstance(error, Exception):
                raise error
            await self._settle(item, decide(error, lease.attempt, self.retry), error)
        finally:
            await keeper.close()
            del self._running[id(item)]
            if self._stopping.is_set() and self._wake is not None:
                self._wake.set()

    async def _call(self, event: E, ctx: AsyncContext[E]) -> object:
        return await self._handler(event, ctx)

    async def _give_back(self, lease: Lease[E]) -> None:
        settler = self._settler
        assert settler is not None
        try:
            await settler.nack(lease)
            self.handed_back += 1
        except TransportError as exc:
            LOGGER.warning("handing back message %d: %s", lease.seq, exc)

    async def _settle(self, item: _Running[E], settle: Settle, error: BaseException | None) -> bool:
        settler = self._settler
        assert settler is not None
        keeper = item.keeper
        seconds = time.monotonic() - item.started
        if keeper.lost or not keeper.release():
            lost: BaseException | None = error
            if lost is None:
                try:
                    keeper.check()
                except LeaseLost as exc:
                    lost = exc
            self._hooks.settled(item.delivery, "lost", seconds, lost)
            return False
        lease = keeper.lease
        try:
            if settle.action == "ack":
                await settler.ack(lease)
            elif settle.action == "nack":
                await settler.nack(lease, settle.delay)
            elif settle.action == "bury":
                await settler.bury(lease, settle.reason)
        except TransportError as exc:
            self._hooks.settled(item.delivery, "lost", seconds, exc)
            return False
        self._hooks.settled(item.delivery, settle.outcome, seconds, error)
        return settle.action != "none"
