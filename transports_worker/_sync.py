"""`Worker`: runs a sync handler on threads, one lease per slot, with the leases kept.

Threads: the caller's (supervises: signals, drain, hand-back), ``concurrency`` slot
threads (each claims only while it is free, runs the handler, then settles), and two
schedule threads (renewals; the watchdog for lease deadlines and timeouts). In batches,
one more thread claims for every free slot at once and hands the leases to the slot
threads, and one sends the settles together, freeing their slots as a batch goes out.
Imports the public contract only.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from inspect import isawaitable
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
    not_awaited,
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


def _nothing() -> None:
    pass


def _blocking_signals() -> Callable[[], None]:
    """Block `SIGNALS` in this thread (and so in the threads it starts); returns the
    undoing, for this thread alone."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

    def unblock() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    return unblock


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
    decodes is buried. A `BaseException` that is no `Exception` (`SystemExit`, say) has
    its lease handed back at once and stops the worker, which drains as after a first
    `stop`; `run` then raises it.

    `run` returns `EXIT_DRAINED` (0) when every running handler finished, or
    `EXIT_HANDED_BACK` (75) when some were cancelled at shutdown and their leases given
    back (``nack(0)``) for another worker.
    """

    asynchronous = False

    def _setup(self) -> None:
        self._pipe: tuple[int, int] | None = None
        # In batches: the claimer waits on the gate for free slots, and the sender on
        # ``_due`` for settles that are due; one lock, as both read ``_free``. Under it
        # too, the seats of the free slots, which the claimer hands out with the leases.
        lock = threading.Lock()
        self._gate = threading.Condition(lock)
        self._due = threading.Condition(lock)
        self._seats: list[Seat] = []
        # The leases handed over and not yet taken by a slot thread (`_serve`): the
        # threads waiting for them, whether one was woken and has not looked yet, and
        # whether the claimer has ended (then they end once nothing is left).
        self._work: collections.deque[tuple[Lease[E], float, Seat]] = collections.deque()
        self._handing = threading.Condition(threading.Lock())
        self._idle = 0
        self._waking = False
        self._handed_all = False
        self._settles: SettleQueue[Callable[[], Seat]] = SettleQueue(
            min(SETTLE_WINDOW, self.visibility / 100)
        )
        # Set once the drain and hand-back are over: the sender sends what is waiting at
        # once, then ends (``_sender_gone``), and a settle after that is made alone.
        self._sent_all = False
        self._sender_gone = False

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming and drain (first call); cancel the running handlers and hand
        their leases back (second call). Safe from any thread and from signal handlers:
        it takes no lock, it only counts and wakes the thread in `run`."""
        self._requests += 1
        self._nudge()

    def _stop_claiming(self) -> None:
        self._nudge()  # the supervisor closes the claims under way, as for `stop`

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
        self.stop()
        self._signal_seen(signal.Signals(signum).name)

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
        handled = self._handles_signals()
        # The threads made from here on (the slots', the driver's pools') leave SIGTERM
        # and SIGINT to this one: a signal taken by another thread runs its handler only
        # once this thread runs Python again, and this thread may be blocked in a join.
        unblock = _blocking_signals() if handled else _nothing
        try:
            self._open()
        except BaseException:
            unblock()
            raise
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.set_blocking(writer, False)
        self._pipe = (reader, writer)
        restore = self._install_signals() if handled else _nothing
        self._renewals = Schedule("worker-renewals")
        self._watchdog = Schedule("worker-watchdog")
        threads, sender = self._threads()
        try:
            for thread in threads:
                thread.start()
            unblock()
            self._supervise()
            self._last_sends()
            # Idle slots end as their claim returns; one in a handler that ignores its
            # cancellation is left behind (a daemon thread): nothing it does is settled.
            end = time.monotonic() + SHARED_WAIT + 1.0
            for thread in threads:
                thread.join(max(end - time.monotonic(), 0))
        finally:
            unblock()  # a thread that would not start
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
        # A slot thread runs each delivery on the seat handed over with it: a delivery
        # keeps its seat until its settle is made, while its thread goes on to the next.
        # Its slot is free once its batch goes out, so twice as many seats as slots: one
        # for each delivery handled and one for each in the batch on its way.
        self._slots = [_Slot(batcher, seat()) for _ in range(self.concurrency)]
        self._seats = [slot.seat for slot in self._slots]
        self._seats += [seat() for _ in range(self.concurrency)]
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
        with self._due:
            self._sent_all = True
            self._due.notify()

    def _install_signals(self) -> Callable[[], None]:
        """Handle SIGTERM and SIGINT. A signal also wakes the supervisor through the
        pipe (`signal.set_wakeup_fd`), for one that a thread not of this worker takes."""
        previous = {sig: signal.signal(sig, self._signalled) for sig in SIGNALS}
        assert self._pipe is not None
        wakeup = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)

        def restore() -> None:
            signal.set_wakeup_fd(wakeup)
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
                self._gate.notify()
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
                    self._deliver(lease, sent, own, slot, slot.seat)
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
        slot threads; until the worker stops."""
        claimer, gate = slot.handle, self._gate
        wait = min(OWN_WAIT if self._owned else SHARED_WAIT, self.visibility / 2)
        pause = ClaimPause()
        stopping = self._stopping
        try:
            while not stopping.is_set():
                with gate:
                    while not self._free and not stopping.is_set():
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
                    undecodable, leases = self._undecoded(exc)
                    for error in undecodable:
                        self._bury_undecodable(error)
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
                taken = len(leases)
                with gate:
                    self._free -= taken
                    seats = self._seats[-taken:]
                    del self._seats[-taken:]
                self._hand_over(zip(leases, [sent] * taken, seats, strict=True))
        except BaseException as exc:
            LOGGER.exception("the worker's claimer failed")
            self._fatal = exc
            self._nudge()
        finally:
            with self._handing:
                self._handed_all = True
                self._handing.notify_all()

    def _hand_over(self, items: Iterable[tuple[Lease[E], float, Seat]]) -> None:
        """Queue leases for the slot threads and wake one waiting thread: it wakes the
        next if any is left (see `_serve`)."""
        handing = self._handing
        with handing:
            self._work.extend(items)
            if self._idle and not self._waking:
                self._waking = True
                handing.notify()

    def _serve(self, slot: _Slot[E]) -> None:
        """Handle the leases the claimer hands over, each on the seat that comes with
        it, until the claimer has ended and none is left. A delivery whose settle goes
        with others has its slot freed by the sender as the batch goes out, and is ended by
        it once the batch is done (`_send`).

        A thread that takes a lease wakes one more only if more are left and none is
        on its way: so that a quick handler's thread takes the next lease itself instead
        of a wake-up per lease, while a handler that blocks does not hold the rest back
        for longer than the next thread takes to wake."""
        handing, work, own = self._handing, self._work, slot.handle
        try:
            while True:
                with handing:
                    while not work:
                        if self._handed_all:
                            return
                        self._idle += 1
                        handing.wait()
                        self._idle -= 1
                        self._waking = False
                    lease, sent, seat = work.popleft()
                    if work and self._idle and not self._waking:
                        self._waking = True
                        handing.notify()
                queued = False
                try:
                    queued = self._deliver(lease, sent, own, slot, seat)
                except Exception:  # ours or the backend's bug: the lease lapses, go on
                    LOGGER.exception("delivering message %d failed", lease.seq)
                finally:
                    if not queued:
                        self._vacate([seat])
        except BaseException as exc:
            LOGGER.exception("a worker slot failed")
            self._fatal = exc
            self._nudge()

    def _vacate(self, seats: list[Seat]) -> None:
        """Free the slots of deliveries that are over, with their seats; wake the
        claimer, and the sender if every delivery still held now waits for it."""
        with self._gate:
            self._seats.extend(seats)
            self._free += len(seats)
            self._gate.notify()
            if self._settles.due(self.concurrency - self._free) == 0.0:
                self._due.notify()

    def _unseat(self, seats: list[Seat]) -> None:
        """Take back the seats of a batch's deliveries, whose slots were freed when the
        batch went out (`_send_batches`)."""
        with self._gate:
            self._seats.extend(seats)

    def _queue(
        self,
        item: Running[E],
        decision: Decision,
        error: BaseException | None,
        then: Callable[[], Seat],
    ) -> bool:
        """In batches, queue ``decision``'s settle to go with others (True): the sender
        makes it, then ends the delivery with ``then``. False once the sender has ended,
        as the worker does: then the caller settles alone."""
        with self._due:
            if self._sender_gone:
                return False
            pending = Pending(item, decision, error, then)
            if self._settles.add(pending, self.concurrency - self._free):
                self._due.notify()
        return True

    def _send_batches(self) -> None:
        """Send the settles as they fall due (see `SettleQueue`); until the worker ends
        and none is left."""
        due_now, settles = self._due, self._settles
        batcher = self._batcher
        assert batcher is not None
        while True:
            with due_now:
                while True:
                    due = settles.due(self.concurrency - self._free)
                    if due is None:
                        if self._sent_all:
                            self._sender_gone = True
                            return
                        due_now.wait()
                        continue
                    left = due - time.monotonic()
                    if left <= 0 or self._sent_all:
                        break
                    due_now.wait(left)
                batch = settles.take()
                # Their slots are free from now on: the claimer fills them while the
                # batch is on its way (seats still held until it is done: `_send`).
                self._free += len(batch)
                self._gate.notify()
            self._send(batch, batcher)

    def _send(self, batch: list[Pending[Callable[[], Seat]]], transport: Transport[E]) -> None:
        """Drive one batch's steps (`Runtime._settling_many`), then end its deliveries
        and take back their seats."""
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
            self._unseat([pending.then() for pending in batch])

    # -- handling --------------------------------------------------------------------

    def _deliver(
        self, lease: Lease[E], sent: float, own: Transport[E], slot: _Slot[E], seat: Seat
    ) -> bool:
        """Run the handler on ``seat`` and settle; True if the settle was queued to go
        with others (`_queue`), and the delivery is ended by the sender."""
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
            return False
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
            return False
        limit: Job | None = None
        queued = False
        try:
            seat.take(keeper, ctx.started)
            if self.timeout is not None:
                limit = self._limit(ctx, self.timeout)
            error: BaseException | None = None
            try:
                returned = self._handler(lease.event, ctx)
                if returned is not None and isawaitable(returned):
                    raise not_awaited(self._handler, returned)
            except BaseException as exc:  # a CancelledError too: see `AsyncWorker`
                error = exc
            if escapes(error):
                self._escape(error)
                if ctx._take():  # else the watchdog or the hand-back settled it
                    self._count_handed_back(self._settle(ctx, HAND_BACK, error, own))
                return False
            if ctx._take():
                decision = self._ending(ctx, error)
                if self._batched and decision.action != "none":
                    then = partial(self._end, key, keeper, limit, seat)
                    queued = self._queue(ctx, decision, error, then)
                if not queued:
                    self._settle(ctx, decision, error, own)
        finally:
            if not queued:
                self._end(key, keeper, limit, seat)
        return queued

    def _end(self, key: int, keeper: LeaseKeeper[E], limit: Job | None, seat: Seat) -> Seat:
        """A delivery is over: stop keeping its lease and watching its time, and forget
        it; return its seat."""
        if not keeper.released:  # settling released it, unless it never got there
            keeper.release()
        if limit is not None:
            self._watchdog.discard(limit)
        del self._running[key]
        if self._stopping.is_set():
            self._nudge()
        return seat

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
