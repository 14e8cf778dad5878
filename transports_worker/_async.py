"""`AsyncWorker`: runs an async handler as one task per lease, with the leases kept.

Tasks: ``concurrency`` slots (each claims only while it is free; the claim is cancelled
to stop claiming), and per delivery the handler's task and its lease keeper's task. A
lost lease cancels the handler's task at once, from the keeper. In batches, one task
claims for every free slot at once and starts a task per lease, and one sends the
settles together. Imports the public contract only.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from inspect import isawaitable
from typing import Any, Final, TypeVar

from transports_core import (
    AsyncTransport,
    EventDecodeError,
    Lease,
    LeaseLost,
    TransportError,
    open_async_transport,
)

from ._common import (
    HAND_BACK,
    LOGGER,
    LOST,
    OWN_WAIT,
    SETTLE_WINDOW,
    SIGNALS,
    BatchReply,
    ClaimPause,
    Decision,
    Pending,
    Runtime,
    SettleQueue,
    SettleTries,
    escapes,
    logged,
    lost_error,
    not_awaitable,
)
from ._context import AsyncContext, Running
from ._hooks import Delivery
from ._keeper import AsyncLeaseKeeper
from ._outcomes import Cancelled

__all__ = ["AsyncWorker"]

E = TypeVar("E")
# How long a cancelled handler may take to unwind before the worker stops waiting.
UNWIND: Final = 1.0


async def _retried(
    decision: Decision,
    lease: Lease[E],
    transport: AsyncTransport[E],
    tries: SettleTries,
    failed: TransportError,
) -> TransportError | None:
    """`_sync._retried`, awaiting the call and the pause."""
    while (pause := tries.again(failed)) is not None:
        await asyncio.sleep(pause)
        try:
            await decision.send(transport, lease)
        except TransportError as exc:
            failed = exc
        else:
            return None
    return tries.failed


@dataclass(frozen=True, slots=True)
class _Escaped:
    """What a handler's task returns in place of raising an error that `escapes`: asyncio
    would re-raise a SystemExit or KeyboardInterrupt straight out of the event loop, past
    the worker, which must first hand the lease back and drain (`Runtime._escape`)."""

    error: BaseException


def _escaped(task: asyncio.Task[object]) -> BaseException | None:
    """The error that escaped the handler of ``task``, once done (see `_Escaped`)."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    returned = task.result()
    return returned.error if isinstance(returned, _Escaped) else None


def _cancellation(task: asyncio.Task[object]) -> asyncio.CancelledError:
    """The `asyncio.CancelledError` that ended ``task``."""
    try:
        task.result()
    except asyncio.CancelledError as exc:
        return exc
    raise AssertionError(f"{task!r} was not cancelled")


class AsyncWorker(Runtime[E, AsyncTransport[E], Callable[[E, AsyncContext[E]], Awaitable[object]]]):
    """`Worker` for async handlers (``async def handler(event, ctx)``), on an
    `AsyncTransport`: the same options, outcomes and exit codes; `run` is a coroutine.
    A handler whose lease is lost, whose ``timeout`` passes, or that is still running when
    shutdown's ``grace`` ends, has its task cancelled at once."""

    asynchronous = True

    def _setup(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._claims: set[asyncio.Future[Any]] = set()
        # In batches: the tasks of the deliveries the claimer started; the claimer waits
        # on ``_room`` for a free slot, the sender on ``_due`` for settles to send.
        self._serving: set[asyncio.Task[None]] = set()
        self._room: asyncio.Event | None = None
        self._due: asyncio.Event | None = None
        self._settles: SettleQueue[asyncio.Future[None]] = SettleQueue(
            min(SETTLE_WINDOW, self.visibility / 100)
        )
        self._sent_all = False  # as in `Worker`
        self._sender_gone = False

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
        self._stop_claiming()

    def _stop_claiming(self) -> None:
        self._cancel_claims()
        if self._wake is not None:
            self._wake.set()
        if self._room is not None:
            self._room.set()

    def _cancel_claims(self) -> None:
        """Cancel each claim under way, once: cancelling a claim never leaves a lease
        nobody holds, but a second cancellation would interrupt the driver's own
        cancelling of the claim's statement (psycopg then closes the connection, with a
        warning), so a claim cancelled already is not cancelled again."""
        claims, self._claims = self._claims, set()
        for claim in claims:
            claim.cancel()

    def _signalled(self, sig: signal.Signals) -> None:
        self._request_stop()
        self._signal_seen(sig.name)

    async def _open(self) -> None:
        try:
            self._open_all(open_async_transport)
        except BaseException:
            await self._close_handles()
            raise

    async def run(self) -> int:
        """Work until stopped; return `EXIT_DRAINED` or `EXIT_HANDED_BACK`."""
        self._begin()
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        # Before opening: a signal that comes meanwhile is acted on once they are open
        # (the loop runs its handler then), as `Worker` does.
        signals = self._install_signals()
        try:
            await self._open()
        except BaseException:
            self._remove_signals(signals)
            raise
        sender: asyncio.Task[None] | None = None
        if self._batched:
            self._room, self._due = asyncio.Event(), asyncio.Event()
            sender = self._loop.create_task(self._send_batches())
            slots = [self._loop.create_task(self._claim_batches(self._claimers[0]))]
        else:
            slots = [self._loop.create_task(self._slot(claimer)) for claimer in self._claimers]
        try:
            await self._supervise()
            self._last_sends()
        finally:
            self._remove_signals(signals)
            # Idle slots end as their claim is cancelled; a handler that ignores its own
            # cancellation is given up on after UNWIND: nothing it does is settled.
            _, stuck = await asyncio.wait([*slots, *self._serving], timeout=UNWIND)
            for task in stuck:
                task.cancel()
            if sender is not None:
                self._last_sends()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(sender), self.visibility + 1.0)
            await self._close_handles()
        if self._fatal is not None:
            raise self._fatal
        # Only now: a slot whose claim returned as the worker stopped may have handed back.
        return self._exit_code()

    def _install_signals(self) -> list[signal.Signals]:
        if not self._handles_signals():
            return []
        assert self._loop is not None
        installed = []
        for sig in SIGNALS:
            self._loop.add_signal_handler(sig, self._signalled, sig)
            installed.append(sig)
        return installed

    def _remove_signals(self, signals: list[signal.Signals]) -> None:
        assert self._loop is not None
        for sig in signals:
            self._loop.remove_signal_handler(sig)

    async def _close_handles(self) -> None:
        for handle in self._owned_handles():
            with logged("closing %r failed", handle):
                await handle.close()

    async def _supervise(self) -> None:
        wake = self._wake
        assert wake is not None
        while self._requests == 0 and self._fatal is None:
            await wake.wait()
            wake.clear()
        self._stopping.set()
        self._cancel_claims()
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
        settler = self._settler
        assert settler is not None
        taken: list[AsyncContext[E]] = []
        for item in list(self._running.values()):
            if not item._take():
                continue
            item.cancel(Cancelled("shutdown"))
            assert isinstance(item, AsyncContext)
            assert item._task is not None
            item._task.cancel()
            taken.append(item)
        # All unwind at once, for UNWIND at most all told: then their leases go back.
        tasks = {item._task for item in taken if item._task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=UNWIND)
        for item in taken:
            handed += await self._settle(item, HAND_BACK, None, settler)
        self._count_handed_back(handed)

    async def _slot(self, claimer: AsyncTransport[E]) -> None:
        """Claim while free, handle, settle; until the worker stops."""
        wait = min(OWN_WAIT, self.visibility / 2)
        pause = ClaimPause()
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
                    await asyncio.sleep(pause.failed(exc))
                    continue
                finally:
                    self._claims.discard(claim)
                pause.reset()
                if lease is None:
                    self._hooks.claimed_nothing(self.worker_id)
                    continue
                try:
                    await self._deliver(lease, sent, claimer)
                except Exception:  # ours or the backend's bug: the lease lapses, go on
                    LOGGER.exception("delivering message %d failed", lease.seq)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            LOGGER.exception("a worker slot failed")
            self._fatal = exc
            if self._wake is not None:
                self._wake.set()

    # -- in batches ------------------------------------------------------------------

    def _held(self) -> int:
        return self.concurrency - self._free

    async def _claim_batches(self, claimer: AsyncTransport[E]) -> None:
        """`Worker._claim_batches`: a task per lease instead of a slot's thread."""
        assert self._loop is not None
        assert self._room is not None
        room, loop = self._room, self._loop
        wait = min(OWN_WAIT, self.visibility / 2)
        pause = ClaimPause()
        try:
            while not self._stopping.is_set():
                if not self._free:
                    room.clear()
                    await room.wait()
                    continue
                sent = time.monotonic()
                claim = asyncio.ensure_future(
                    claimer.claim_many(
                        self.worker_id, self.visibility, self._free, self.min_priority, wait=wait
                    )
                )
                self._claims.add(claim)
                try:
                    leases: list[Lease[E]] = await claim
                except asyncio.CancelledError:
                    if self._stopping.is_set():
                        return
                    raise
                except EventDecodeError as exc:
                    undecodable, leases = self._undecoded(exc)
                    for error in undecodable:
                        await self._bury_undecodable(error)
                except TransportError as exc:
                    if self._stopping.is_set():
                        return
                    await asyncio.sleep(pause.failed(exc))
                    continue
                finally:
                    self._claims.discard(claim)
                pause.reset()
                if not leases:
                    self._hooks.claimed_nothing(self.worker_id)
                    continue
                self._free -= len(leases)
                for lease in leases:
                    task = loop.create_task(self._serve(lease, sent))
                    self._serving.add(task)
                    task.add_done_callback(self._serving.discard)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            LOGGER.exception("the worker's claimer failed")
            self._fatal = exc
            if self._wake is not None:
                self._wake.set()

    async def _serve(self, lease: Lease[E], sent: float) -> None:
        """`Worker._serve`: a delivery whose settle went with others had its slot freed
        by the sender as the batch went out."""
        batcher = self._batcher
        assert batcher is not None
        assert self._room is not None
        queued = False
        try:
            queued = await self._deliver(lease, sent, batcher)
        except Exception:  # ours or the backend's bug: the lease lapses, go on
            LOGGER.exception("delivering message %d failed", lease.seq)
        finally:
            if not queued:
                self._free += 1
                self._room.set()
                if self._due is not None and self._settles.due(self._held()) == 0.0:
                    self._due.set()

    async def _finish(
        self,
        item: Running[E],
        decision: Decision,
        error: BaseException | None,
        own: AsyncTransport[E],
    ) -> bool:
        """Settle ``decision``, in batches with others (`Worker._queue`); True if it
        went with others, whose sender freed the slot as the batch went out."""
        if not self._batched or decision.action == "none":
            await self._settle(item, decision, error, own)
            return False
        assert self._loop is not None
        assert self._due is not None
        if self._sender_gone:  # settled as the worker ends
            await self._settle(item, decision, error, own)
            return False
        pending = Pending(item, decision, error, self._loop.create_future())
        if self._settles.add(pending, self._held()):
            self._due.set()
        await pending.then
        return True

    async def _send_batches(self) -> None:
        """`Worker._send_batches`, as a task."""
        due_event, settles, loop = self._due, self._settles, asyncio.get_running_loop()
        batcher = self._batcher
        assert due_event is not None
        assert batcher is not None
        while True:
            due = settles.due(self._held())
            if due is None:
                if self._sent_all:
                    self._sender_gone = True
                    return
                due_event.clear()
                await due_event.wait()
                continue
            left = due - time.monotonic()
            if left > 0 and not self._sent_all:
                # A timer rather than wait_for: a timeout's exception, with its traceback,
                # would leave a reference cycle behind for every batch that waits.
                due_event.clear()
                timer = loop.call_later(left, due_event.set)
                await due_event.wait()
                timer.cancel()
                continue
            batch = settles.take()
            # Their slots are free from now on: the claimer fills them while the batch
            # is on its way.
            self._free += len(batch)
            if self._room is not None:
                self._room.set()
            await self._send(batch, batcher)

    async def _send(
        self, batch: list[Pending[asyncio.Future[None]]], transport: AsyncTransport[E]
    ) -> None:
        """`Worker._send`, awaiting the calls and pauses."""
        steps = self._settling_many(batch)
        try:
            step = next(steps)
            while True:
                reply: BatchReply = None
                if isinstance(step, float):
                    await asyncio.sleep(step)
                else:
                    try:
                        reply = await transport.settle_many(step)
                    except TransportError as exc:
                        reply = exc
                step = steps.send(reply)
        except StopIteration:
            pass
        except Exception:  # ours or the backend's bug: those leases lapse
            LOGGER.exception("settling %d deliveries failed", len(batch))
        finally:
            for pending in batch:
                if not pending.then.done():
                    pending.then.set_result(None)

    def _last_sends(self) -> None:
        """`Worker._last_sends`."""
        self._sent_all = True
        if self._due is not None:
            self._due.set()

    async def _bury_undecodable(self, exc: EventDecodeError) -> None:
        delivery, decision = self._undecodable(exc)
        settler = self._settler
        assert settler is not None
        failed: TransportError | None = None
        try:
            await decision.send(settler, exc.lease)
        except TransportError as error:
            failed = error
        self._buried(delivery, exc, failed)

    async def _settle(
        self,
        item: Running[E],
        decision: Decision,
        error: BaseException | None,
        transport: AsyncTransport[E],
    ) -> bool:
        """`Worker._settle`, awaiting the call."""
        lease = self._settle_lease(item, decision, error)
        if lease is None:
            return False
        try:
            await decision.send(transport, lease)
        except TransportError as exc:
            failed = await _retried(decision, lease, transport, self._tries(item), exc)
            return self._settle_done(item, decision, error, failed)
        return self._settle_done(item, decision, error, None)

    async def _deliver(self, lease: Lease[E], sent: float, own: AsyncTransport[E]) -> bool:
        """Run the handler; settle on ``own``, the handle that claimed (as `Worker`).
        True if the settle went with others (`_finish`)."""
        settler = self._settler
        assert settler is not None
        assert self._loop is not None
        delivery = Delivery.of(lease)
        hooks = self._hooks
        task_box: list[asyncio.Task[object]] = []

        # Not a reference to the context, which holds the keeper that holds this.
        def lost(error: LeaseLost) -> None:
            hooks.lost(delivery, error)
            for task in task_box:
                task.cancel()

        keeper = AsyncLeaseKeeper(
            settler,
            lease,
            self.visibility,
            sent=sent,
            on_lost=lost,
            on_renewed=hooks.renewal_of(delivery),
            on_failed=hooks.renewal_failure_of(delivery),
        )
        ctx = AsyncContext(self.worker_id, keeper, self._stopping, delivery, own)
        hooks.started(delivery)
        if not await keeper.vouch():  # the claim took too long: the handler must not run
            self._report(ctx, "lost", lost_error(ctx))
            return False
        if self._closing:  # claimed as the worker stopped: give it straight back
            self._count_handed_back(await self._settle(ctx, HAND_BACK, None, own))
            return False
        task: asyncio.Task[object] = self._loop.create_task(self._call(lease.event, ctx))
        ctx._task = task
        task_box.append(task)
        self._running[id(ctx)] = ctx
        keeper.start()
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if not done:
                if ctx._take():
                    ctx.cancel(Cancelled("timeout"))
                    task.cancel()
                    await asyncio.wait({task}, timeout=UNWIND)
                    if (escaped := _escaped(task)) is not None:
                        self._escape(escaped)  # it unwound by raising one
                    error: BaseException | None = TimeoutError(
                        f"the handler ran past its timeout of {self.timeout:g}s"
                    )
                    return await self._finish(ctx, self._ending(ctx, error), error, own)
                return False
            if (escaped := _escaped(task)) is not None:
                self._escape(escaped)
                if ctx._take():  # else the hand-back settled it
                    self._count_handed_back(await self._settle(ctx, HAND_BACK, escaped, own))
                return False
            if not ctx._take():
                return False
            if task.cancelled():
                if ctx.lost or ctx.cancelled:  # the worker cancelled it: the lease is lost
                    await self._settle(ctx, LOST, None, own)
                    return False
                # Its own await raised CancelledError (something else cancelled what it
                # awaited): a failure like any other exception.
                error = _cancellation(task)
                return await self._finish(ctx, self._ending(ctx, error), error, own)
            error = task.exception()
            return await self._finish(ctx, self._ending(ctx, error), error, own)
        finally:
            await keeper.close()
            del self._running[id(ctx)]
            if self._stopping.is_set() and self._wake is not None:
                self._wake.set()

    async def _call(self, event: E, ctx: AsyncContext[E]) -> object:
        try:
            returned: object = self._handler(event, ctx)
            if not isawaitable(returned):
                raise not_awaitable(self._handler, returned)
            return await returned
        except BaseException as exc:
            if not escapes(exc):
                raise
            return _Escaped(exc)
