"""`Worker`: runs a sync handler on threads, one lease per slot, with the leases kept.

Threads: the caller's (supervises: signals, drain, hand-back), ``concurrency`` slot
threads (each claims only while it is free, runs the handler, then settles), and two
schedule threads (renewals; the watchdog for lease deadlines and timeouts). In batches,
one more thread claims for every free slot at once and hands the leases to the slots,
and one sends the slots' settles together. Imports the public contract only.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Final, Generic, TypeVar

from transports_core import (
    EventDecodeError,
    Lease,
    LeaseLost,
    Transport,
    TransportError,
    open_transport,
)

from ._common import (
    HAND_BACK,
    LOGGER,
    OWN_WAIT,
    SETTLE_WINDOW,
    BatchReply,
    ClaimPause,
    Decision,
    Pending,
    Runtime,
    SettleQueue,
    SettleTries,
    logged,
    lost_error,
)
from ._context import Context, Running
from ._hooks import Delivery
from ._keeper import Job, LeaseKeeper, Schedule, Seat, Signal
from ._outcomes import Cancelled

__all__ = ["Worker"]

E = TypeVar("E")
# A claim on a handle the worker shares with its caller cannot be woken by closing it,
# so it waits in short turns to notice stop() soon enough.
SHARED_WAIT: Final = 0.5


@dataclass(eq=False)
class _Slot(Generic[E]):
    """A slot's claiming handle, and whether stopping may close it under a claim.

    The lock is taken three times a delivery: by `acquire` and `release`, which cost
    half of a ``with`` block; nothing between them can raise."""

    handle: Transport[E]
    seat: Seat
    claiming: bool = False
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin_claim(self) -> bool:
        """Mark a claim as under way; False once stopping has closed the slot."""
        self.lock.acquire()
        claiming = self.claiming = not self.closed
        self.lock.release()
        return claiming

    def end_claim(self) -> bool:
        """Mark the claim as returned; True if the handle is still open."""
        self.lock.acquire()
        self.claiming = False
        open_ = not self.closed
        self.lock.release()
        return open_

    def close(self) -> bool:
        """Close the slot to claims; True if a claim is under way (to be woken)."""
        with self.lock:
            self.closed = True
            return self.claiming


def _retried(
    decision: Decision,
    lease: Lease[E],
    transport: Transport[E],
    tries: SettleTries,
    failed: TransportError,
) -> TransportError | None:
    """Make ``decision``'s call again after it raised ``failed``, for as long as ``tries``
    allows: None once it is made, else why it was not."""
    while (pause := tries.again(failed)) is not None:
        time.sleep(pause)
        try:
            decision.send(transport, lease)
        except TransportError as exc:
            failed = exc
        else:
            return None
    return tries.failed


class Worker(Runtime[E, Transport[E], Callable[[E, Context[E]], object]]):
    """Runs ``handler(event, ctx)`` for every message, until stopped.

    ``source`` is a URL (opened with ``event_type``), a `Transport`, or a factory that
    opens one. From a URL or a factory the worker opens a handle per slot, which claims
    and settles what it claimed, and one more to renew, so that no claim queues behind
    another and `stop` wakes blocked claims at once (by closing them); a transport
    passed in is used for everything and not closed.

    With ``concurrency`` above 1 and a transport that has the batch calls, the worker
    works in batches (unless ``batch`` is False): one handle claims for every free slot
    at once (``claim_many``), and the settles that the slots' handlers lead to go
    together (``settle_many``), each waiting at most a few milliseconds for others.

    Outcomes: a return acks (unless the handler acked already, inside its own
    transaction, with `Context.ack_within`); `Retry` nacks with its delay; `Bury` buries; any other
    exception is retried after the ``retry`` policy's backoff, or buried (with its type
    and message) when it is permanent or the last attempt; a handler still running after
    ``timeout`` seconds is cancelled and counts as a failure; a message that no longer
    decodes is buried.

    `run` returns `EXIT_DRAINED` (0) when every running handler finished, or
    `EXIT_HANDED_BACK` (75) when some were cancelled at shutdown and their leases given
    back (``nack(0)``) for another worker.
    """

    asynchronous = False

    def _setup(self) -> None:
        self._pipe: tuple[int, int] | None = None
        # In batches: the claimer waits on the gate for a free slot, and the sender for
        # settles that are due; the claimer hands leases to the slots through the inbox.
        self._gate = threading.Condition(threading.Lock())
        self._inbox: queue.SimpleQueue[tuple[Lease[E], float] | None] = queue.SimpleQueue()
        self._settles: SettleQueue[Signal] = SettleQueue(min(SETTLE_WINDOW, self.visibility / 100))
        # Set once the drain and hand-back are over: the sender sends what is waiting at
        # once, then ends (``_sender_gone``), and a settle after that is made alone.
        self._sent_all = False
        self._sender_gone = False
        # Slots whose batch of settles is done but which have not freed themselves yet:
        # the claimer waits for them, so that it claims for the whole batch's slots at
        # once rather than for the first to come back (asyncio runs them all first).
        self._returning = 0

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming and drain (first call); cancel the running handlers and hand
        their leases back (second call). Safe from any thread and from signal handlers:
        it takes no lock, it only counts and wakes the thread in `run`."""
        self._requests += 1
        self._nudge()

    def _nudge(self) -> None:
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed
                os.write(pipe[1], b"\0")

    def _sleep(self, timeout: float | None) -> None:
        """Wait for a nudge, at most ``timeout`` seconds."""
        pipe = self._pipe
        assert pipe is not None
        readable, _, _ = select.select([pipe[0]], [], [], timeout)
        if readable:
            with contextlib.suppress(BlockingIOError):
                os.read(pipe[0], 4096)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        self._signal_seen(signal.Signals(signum).name)
        self.stop()

    # -- the run ---------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self._open_all(open_transport)
        except BaseException:
            self._close_handles()
            raise

    def run(self) -> int:
        """Work until stopped (by `stop`, SIGTERM or SIGINT); return the exit code."""
        self._begin()
        self._open()
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.set_blocking(writer, False)
        self._pipe = (reader, writer)
        restore = self._install_signals()
        self._renewals = Schedule("worker-renewals")
        self._watchdog = Schedule("worker-watchdog")
        threads, sender = self._threads()
        try:
            for thread in threads:
                thread.start()
            self._supervise()
            self._last_sends()
            # Idle slots end as their claim returns; one in a handler that ignores its
            # cancellation is left behind (a daemon thread): nothing it does is settled.
            end = time.monotonic() + SHARED_WAIT + 1.0
            for thread in threads:
                thread.join(max(end - time.monotonic(), 0))
        finally:
            if sender is not None and sender.ident is not None:
                self._last_sends()
                # Its retries end by the leases' deadlines, a visibility away at most.
                sender.join(self.visibility + 1.0)
            restore()
            self._renewals.close()
            self._watchdog.close()
            self._close_handles()
            self._pipe = None
            os.close(reader)
            os.close(writer)
        if self._fatal is not None:
            raise self._fatal
        # Only now: a slot whose claim returned as the worker stopped may have handed back.
        return self._exit_code()

    def _threads(self) -> tuple[list[threading.Thread], threading.Thread | None]:
        """The slots' threads (and in batches the claimer's and the sender's, which is
        also returned alone: it is stopped last)."""

        def seat() -> Seat:
            return Seat(self._renewals, self._watchdog)

        if not self._batched:
            self._slots = [_Slot(claimer, seat()) for claimer in self._claimers]
            self._claiming = self._slots
            return [
                threading.Thread(
                    target=self._slot, args=(slot,), name=f"worker-slot-{n}", daemon=True
                )
                for n, slot in enumerate(self._slots)
            ], None
        batcher = self._batcher
        assert batcher is not None
        self._slots = [_Slot(batcher, seat()) for _ in range(self.concurrency)]
        claimer = _Slot(self._claimers[0], seat())
        self._claiming = [claimer]
        threads = [
            threading.Thread(target=self._serve, args=(slot,), name=f"worker-slot-{n}", daemon=True)
            for n, slot in enumerate(self._slots)
        ]
        threads.append(
            threading.Thread(
                target=self._claim_batches, args=(claimer,), name="worker-claimer", daemon=True
            )
        )
        sender = threading.Thread(target=self._send_batches, name="worker-sender", daemon=True)
        return [*threads, sender], sender

    def _last_sends(self) -> None:
        """Have the sender send every settle still waiting without waiting for more,
        then end; the handles close only after it has."""
        with self._gate:
            self._sent_all = True
            self._gate.notify_all()

    def _install_signals(self) -> Callable[[], None]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        signals = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.signal(sig, self._signalled) for sig in signals}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _close_handles(self) -> None:
        for handle in self._owned_handles():
            with logged("closing %r failed", handle):
                handle.close()

    def _supervise(self) -> None:
        while self._requests == 0 and self._fatal is None:
            self._sleep(None)
        self._stopping.set()
        if self._batched:
            with self._gate:  # wakes the claimer if it waits for a free slot
                self._gate.notify_all()
        if self._owned:
            for slot in self._claiming:
                if not slot.close():
                    continue  # its handler settles on it; it is closed after the drain
                with logged("closing a claiming handle failed"):
                    slot.handle.close()  # wakes a blocked claim, which then leases nothing
        deadline = time.monotonic() + self.grace
        while self._requests < 2:
            left = deadline - time.monotonic()
            if not self._running or left <= 0:
                break
            self._sleep(left)
        self._hand_back()

    def _hand_back(self) -> None:
        self._closing = True
        for slot in self._slots:  # a delivery registering now finishes (see `_deliver`)
            with slot.lock:
                pass
        handed = 0
        settler = self._settler
        assert settler is not None
        for item in tuple(self._running.copy().values()):
            if not item._take():
                continue
            item.cancel(Cancelled("shutdown"))
            handed += self._settle(item, HAND_BACK, None, settler)
        self._count_handed_back(handed)

    # -- claiming --------------------------------------------------------------------

    def _slot(self, slot: _Slot[E]) -> None:
        """Claim while free, handle, settle; until the worker stops."""
        claimer, shared = slot.handle, self._settler
        assert shared is not None
        # At most half a visibility, so that a lease granted late in a long wait is
        # still confirmed (by its first renewal, due at once) well before its end.
        wait = min(OWN_WAIT if self._owned else SHARED_WAIT, self.visibility / 2)
        pause = ClaimPause()
        try:
            while not self._stopping.is_set():
                if not slot.begin_claim():
                    return
                sent = time.monotonic()
                try:
                    lease = claimer.claim(
                        self.worker_id, self.visibility, self.min_priority, wait=wait
                    )
                except EventDecodeError as exc:
                    self._bury_undecodable(exc)
                    continue
                except Exception as exc:
                    if self._stopping.is_set():
                        # The worker closed this handle to wake the claim: whatever the
                        # backend raised about that, nothing was leased.
                        return
                    if not isinstance(exc, TransportError):
                        raise
                    self._stopping.wait(pause.failed(exc))
                    continue
                finally:
                    # Settle on the handle that claimed (a store that caches per
                    # connection keeps its cache) unless stopping closed it meanwhile.
                    own = claimer if slot.end_claim() else shared
                pause.reset()
                if lease is None:
                    self._hooks.claimed_nothing(self.worker_id)
                    continue
                try:
                    self._deliver(lease, sent, own, slot)
                except Exception:  # ours or the backend's bug: the lease lapses, go on
                    LOGGER.exception("delivering message %d failed", lease.seq)
        except BaseException as exc:
            LOGGER.exception("a worker slot failed")
            self._fatal = exc
            self._nudge()

    def _bury_undecodable(self, exc: EventDecodeError) -> None:
        delivery, decision = self._undecodable(exc)
        settler = self._settler
        assert settler is not None
        failed: TransportError | None = None
        try:
            decision.send(settler, exc.lease)
        except TransportError as error:
            failed = error
        self._buried(delivery, exc, failed)

    def _settle(
        self,
        item: Running[E],
        decision: Decision,
        error: BaseException | None,
        transport: Transport[E],
    ) -> bool:
        """Carry out ``decision`` on ``transport`` and report it; True if the transport
        took it."""
        lease = self._settle_lease(item, decision, error)
        if lease is None:
            return False
        try:
            decision.send(transport, lease)
        except TransportError as exc:
            failed = _retried(decision, lease, transport, self._tries(item), exc)
            return self._settle_done(item, decision, error, failed)
        return self._settle_done(item, decision, error, None)

    # -- in batches ------------------------------------------------------------------

    def _claim_batches(self, slot: _Slot[E]) -> None:
        """Claim for every free slot in one ``claim_many``, and hand the leases to the
        slots; until the worker stops."""
        claimer, gate = slot.handle, self._gate
        wait = min(OWN_WAIT if self._owned else SHARED_WAIT, self.visibility / 2)
        pause = ClaimPause()
        stopping = self._stopping
        try:
            while not stopping.is_set():
                with gate:
                    while (not self._free or self._returning) and not stopping.is_set():
                        gate.wait()
                    limit = self._free
                if not limit or stopping.is_set() or not slot.begin_claim():
                    return
                sent = time.monotonic()
                try:
                    leases = claimer.claim_many(
                        self.worker_id, self.visibility, limit, self.min_priority, wait=wait
                    )
                except EventDecodeError as exc:
                    self._bury_undecodable(exc)
                    leases = exc.others
                except Exception as exc:
                    if stopping.is_set():
                        return  # as in `_slot`: the worker closed the handle to wake it
                    if not isinstance(exc, TransportError):
                        raise
                    stopping.wait(pause.failed(exc))
                    continue
                finally:
                    slot.end_claim()
                pause.reset()
                if not leases:
                    self._hooks.claimed_nothing(self.worker_id)
                    continue
                with gate:
                    self._free -= len(leases)
                for lease in leases:
                    self._inbox.put((lease, sent))
        except BaseException as exc:
            LOGGER.exception("the worker's claimer failed")
            self._fatal = exc
            self._nudge()
        finally:
            for _ in self._slots:
                self._inbox.put(None)

    def _serve(self, slot: _Slot[E]) -> None:
        """Handle the leases the claimer hands over, then free the slot; until it hands
        over None."""
        inbox, gate, own = self._inbox, self._gate, slot.handle
        try:
            while (handed := inbox.get()) is not None:
                lease, sent = handed
                try:
                    self._deliver(lease, sent, own, slot)
                except Exception:  # ours or the backend's bug: the lease lapses, go on
                    LOGGER.exception("delivering message %d failed", lease.seq)
                finally:
                    with gate:
                        self._free += 1
                        if self._returning:  # a slot of a batch, or one just before it
                            self._returning -= 1
                        gate.notify_all()
        except BaseException as exc:
            LOGGER.exception("a worker slot failed")
            self._fatal = exc
            self._nudge()

    def _finish(
        self, item: Running[E], decision: Decision, error: BaseException | None, own: Transport[E]
    ) -> bool:
        """`_settle`, or in batches: wait for the sender to make the call with others."""
        if not self._batched or decision.action == "none":
            return self._settle(item, decision, error, own)
        pending = Pending(item, decision, error, Signal())
        gate = self._gate
        with gate:
            gone = self._sender_gone
            if not gone and self._settles.add(pending, self.concurrency - self._free):
                gate.notify_all()
        if gone:  # settled as the worker ends
            return self._settle(item, decision, error, own)
        pending.waiter.wait()
        return pending.taken

    def _send_batches(self) -> None:
        """Send the settles as they fall due (see `SettleQueue`); until the worker ends
        and none is left."""
        gate, settles = self._gate, self._settles
        batcher = self._batcher
        assert batcher is not None
        while True:
            with gate:
                while True:
                    due = settles.due(self.concurrency - self._free)
                    if due is None:
                        if self._sent_all:
                            self._sender_gone = True
                            return
                        gate.wait()
                        continue
                    left = due - time.monotonic()
                    if left <= 0 or self._sent_all:
                        break
                    gate.wait(left)
                batch = settles.take()
            self._send(batch, batcher)

    def _send(self, batch: list[Pending[Signal]], transport: Transport[E]) -> None:
        """Drive one batch's steps (`Runtime._settling_many`), then wake its slots."""
        steps = self._settling_many(batch)
        try:
            step = next(steps)
            while True:
                reply: BatchReply = None
                if isinstance(step, float):
                    time.sleep(step)
                else:
                    try:
                        reply = transport.settle_many(step)
                    except TransportError as exc:
                        reply = exc
                step = steps.send(reply)
        except StopIteration:
            pass
        except Exception:  # ours or the backend's bug: those leases lapse
            LOGGER.exception("settling %d deliveries failed", len(batch))
        finally:
            with self._gate:
                self._returning += len(batch)
            for pending in batch:
                pending.waiter.set()

    # -- handling --------------------------------------------------------------------

    def _deliver(self, lease: Lease[E], sent: float, own: Transport[E], slot: _Slot[E]) -> None:
        settler = self._settler
        assert settler is not None
        delivery = Delivery.of(lease)
        hooks = self._hooks
        interrupt = Signal()

        # Not a reference to the context, which holds the keeper that holds this.
        def lost(error: LeaseLost) -> None:
            interrupt.set()
            hooks.lost(delivery, error)

        keeper = LeaseKeeper(
            settler,
            lease,
            self.visibility,
            sent=sent,
            on_lost=lost,
            on_renewed=hooks.renewal_of(delivery),
            on_failed=hooks.renewal_failure_of(delivery),
        )
        ctx = Context(self.worker_id, keeper, self._stopping, delivery, interrupt, own)
        hooks.started(delivery)
        if not keeper.vouch():  # the claim took too long: the handler must not run
            self._report(ctx, "lost", lost_error(ctx))
            return
        key = id(ctx)
        # Under the slot's own lock, which `_hand_back` passes through once it is closing:
        # so the hand-back sees this delivery, or this delivery sees that it is closing.
        slot.lock.acquire()
        closing = self._closing
        if not closing:
            self._running[key] = ctx
        slot.lock.release()
        if closing:  # claimed as the worker stopped: give it straight back
            self._count_handed_back(self._settle(ctx, HAND_BACK, None, own))
            return
        limit: Job | None = None
        try:
            slot.seat.take(keeper, ctx.started)
            if self.timeout is not None:
                limit = self._limit(ctx, self.timeout)
            error: Exception | None = None
            try:
                self._handler(lease.event, ctx)
            except Exception as exc:
                error = exc
            if ctx._take():
                self._finish(ctx, self._ending(ctx, error), error, own)
        finally:
            if not keeper.released:  # settling released it, unless it never got there
                keeper.release()
            if limit is not None:
                self._watchdog.discard(limit)
            del self._running[key]
            if self._stopping.is_set():
                self._nudge()

    def _limit(self, ctx: Context[E], timeout: float) -> Job:
        """The watchdog's job that cancels the handler once ``timeout`` has passed."""
        started = ctx.started
        limit = Job(lambda: None if ctx._taken else started + timeout, lambda: self._timed_out(ctx))
        self._watchdog.add(limit)
        return limit

    def _timed_out(self, item: Running[E]) -> None:
        if not item._take():
            return
        item.cancel(Cancelled("timeout"))
        error = TimeoutError(f"the handler ran past its timeout of {self.timeout:g}s")
        # Settle off the watchdog thread, which other leases' deadlines depend on.
        settler = self._settler
        assert settler is not None
        threading.Thread(
            target=self._settle,
            args=(item, self._ending(item, error), error, settler),
            name="worker-timeout",
            daemon=True,
        ).start()
