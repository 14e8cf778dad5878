"""`Worker`: runs a sync handler on threads, one lease per slot, with the leases kept.

Threads: the caller's (supervises: signals, drain, hand-back), ``concurrency`` slot
threads (each claims only while it is free, runs the handler, then settles), and two
schedule threads (renewals; the watchdog for lease deadlines and timeouts). Imports the
public contract only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final, Generic, TypeVar

from transports_core import (
    Event,
    EventDecodeError,
    Lease,
    LeaseLost,
    Transport,
    TransportError,
    open_transport,
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
from ._context import Context
from ._hooks import Delivery, Fanout, Hooks, LoggingHooks
from ._keeper import Job, LeaseKeeper, Schedule, Seat, Signal
from ._outcomes import Cancelled, RetryPolicy, failure_reason

__all__ = ["Worker"]

E = TypeVar("E")
LOGGER: Final = logging.getLogger("transports_worker")
# A claim on a handle the worker shares with its caller cannot be woken by closing it,
# so it waits in short turns to notice stop() soon enough.
SHARED_WAIT: Final = 0.5
OWN_WAIT: Final = 10.0
CLAIM_BACKOFF: Final = (0.1, 5.0)
EXIT_NOW: Final = 130


@dataclass(eq=False)
class _Slot(Generic[E]):
    """A slot's claiming handle, and whether stopping may close it under a claim."""

    handle: Transport[E]
    seat: Seat
    claiming: bool = False
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin_claim(self) -> bool:
        """Mark a claim as under way; False once stopping has closed the slot."""
        with self.lock:
            self.claiming = not self.closed
            return self.claiming

    def end_claim(self) -> bool:
        """Mark the claim as returned; True if the handle is still open."""
        with self.lock:
            self.claiming = False
            return not self.closed

    def close(self) -> bool:
        """Close the slot to claims; True if a claim is under way (to be woken)."""
        with self.lock:
            self.closed = True
            return self.claiming


@dataclass
class _Running(Generic[E]):
    """One delivery in flight."""

    lease: Lease[E]
    keeper: LeaseKeeper[E]
    ctx: Context[E]
    delivery: Delivery
    started: float = field(default_factory=time.monotonic)
    taken: bool = False  # someone has settled (or given up on) the lease
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        """Claim the one right to settle this delivery."""
        with self.lock:
            if self.taken:
                return False
            self.taken = True
            return True


class Worker(Generic[E]):
    """Runs ``handler(event, ctx)`` for every message, until stopped.

    ``source`` is a URL (opened with ``event_type``), a `Transport`, or a factory that
    opens one. From a URL or a factory the worker opens a claiming handle per slot and
    one more to renew and settle, so that no claim queues behind another and `stop`
    wakes blocked claims at once (by closing them); a transport passed in is used for
    everything and not closed.

    Outcomes: a return acks; `Retry` nacks with its delay; `Bury` buries; any other
    exception is retried after the ``retry`` policy's backoff, or buried (with its type
    and message) when it is permanent or the last attempt; a handler still running after
    ``timeout`` seconds is cancelled and counts as a failure; a message that no longer
    decodes is buried.

    `run` returns `EXIT_DRAINED` (0) when every running handler finished, or
    `EXIT_HANDED_BACK` (75) when some were cancelled at shutdown and their leases given
    back (``nack(0)``) for another worker.
    """

    def __init__(
        self,
        source: str | Transport[E] | Callable[[], Transport[E]],
        handler: Callable[[E, Context[E]], object],
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
        check_handler(handler, asynchronous=False)
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
        self._pipe: tuple[int, int] | None = None
        self._running: dict[int, _Running[E]] = {}
        self._running_lock = threading.Lock()
        self._claimers: list[Transport[E]] = []
        self._settler: Transport[E] | None = None
        self._owned = False
        self._fatal: BaseException | None = None
        self._closing = False
        self._started = False
        self.handed_back = 0

    def __repr__(self) -> str:
        source = redact_url(self._source) if isinstance(self._source, str) else self._source
        return f"<Worker {self.worker_id!r} on {source!r}, concurrency {self.concurrency}>"

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

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if self._requests >= 2:
            os._exit(EXIT_NOW)
        LOGGER.warning(
            "%s: %s",
            signal.Signals(signum).name,
            "draining" if self._requests == 0 else "cancelling running handlers",
        )
        self.stop()

    # -- the run ---------------------------------------------------------------------

    def _open(self) -> None:
        source = self._source
        if isinstance(source, str):
            url = source

            def opener() -> Transport[Any]:
                return open_transport(url, event_type=self._event_type)
        elif hasattr(source, "claim") and hasattr(source, "extend"):
            self._settler = source  # type: ignore[assignment]
            self._claimers = [source] * self.concurrency  # type: ignore[list-item]
            return
        elif callable(source):
            opener = source
        else:
            raise TypeError(f"source must be a URL, a Transport or a factory, got {source!r}")
        # One claiming handle per slot, so that no claim queues behind another slot's,
        # and one handle shared by the renewals and settles.
        self._settler = opener()
        self._owned = True
        try:
            for _ in range(self.concurrency):
                self._claimers.append(opener())
        except BaseException:
            self._close_handles()
            raise

    def run(self) -> int:
        """Work until stopped (by `stop`, SIGTERM or SIGINT); return the exit code."""
        if self._started:
            raise RuntimeError(f"{self!r} has already run: make a new Worker")
        self._started = True
        self._open()
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.set_blocking(writer, False)
        self._pipe = (reader, writer)
        restore = self._install_signals()
        self._renewals = Schedule("worker-renewals")
        self._watchdog = Schedule("worker-watchdog")
        self._slots = [
            _Slot(claimer, Seat(self._renewals, self._watchdog)) for claimer in self._claimers
        ]
        threads = [
            threading.Thread(target=self._slot, args=(slot,), name=f"worker-slot-{n}", daemon=True)
            for n, slot in enumerate(self._slots)
        ]
        try:
            for thread in threads:
                thread.start()
            code = self._supervise()
            # Idle slots end as their claim returns; one in a handler that ignores its
            # cancellation is left behind (a daemon thread): nothing it does is settled.
            end = time.monotonic() + SHARED_WAIT + 1.0
            for thread in threads:
                thread.join(max(end - time.monotonic(), 0))
        finally:
            restore()
            self._renewals.close()
            self._watchdog.close()
            self._close_handles()
            self._pipe = None
            os.close(reader)
            os.close(writer)
        if self._fatal is not None:
            raise self._fatal
        return code

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
        if self._owned:
            for handle in (*self._claimers, self._settler):
                if handle is not None:
                    try:
                        handle.close()
                    except Exception:
                        LOGGER.exception("closing %r failed", handle)

    def _supervise(self) -> int:
        while self._requests == 0 and self._fatal is None:
            self._sleep(None)
        self._stopping.set()
        if self._owned:
            for slot in self._slots:
                if not slot.close():
                    continue  # its handler settles on it; it is closed after the drain
                try:
                    slot.handle.close()  # wakes a blocked claim, which then leases nothing
                except Exception:  # the drain matters more than a handle that closed badly
                    LOGGER.exception("closing a claiming handle failed")
        deadline = time.monotonic() + self.grace
        while self._requests < 2:
            with self._running_lock:
                running = len(self._running)
            left = deadline - time.monotonic()
            if running == 0 or left <= 0:
                break
            self._sleep(left)
        return self._hand_back()

    def _hand_back(self) -> int:
        with self._running_lock:
            self._closing = True
            running = list(self._running.values())
        handed = 0
        for item in running:
            if not item.take():
                continue
            item.ctx.cancel(Cancelled("shutdown"))
            if not self._settle(item, Settle("nack", "handed_back"), None, self._settler):
                continue
            handed += 1
        self.handed_back += handed
        return EXIT_HANDED_BACK if self.handed_back else EXIT_DRAINED

    # -- claiming --------------------------------------------------------------------

    def _slot(self, slot: _Slot[E]) -> None:
        """Claim while free, handle, settle; until the worker stops."""
        claimer, shared = slot.handle, self._settler
        assert shared is not None
        # At most half a visibility, so that a lease granted late in a long wait is
        # still confirmed (by its first renewal, due at once) well before its end.
        wait = min(OWN_WAIT if self._owned else SHARED_WAIT, self.visibility / 2)
        backoff = CLAIM_BACKOFF[0]
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
                    LOGGER.warning("claim failed, retrying in %.1fs: %s", backoff, exc)
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, CLAIM_BACKOFF[1])
                    continue
                finally:
                    # Settle on the handle that claimed (a store that caches per
                    # connection keeps its cache) unless stopping closed it meanwhile.
                    own = claimer if slot.end_claim() else shared
                backoff = CLAIM_BACKOFF[0]
                if lease is None:
                    continue
                try:
                    self._deliver(lease, sent, own, slot.seat)
                except Exception:  # ours or the backend's bug: the lease lapses, go on
                    LOGGER.exception("delivering message %d failed", lease.seq)
        except BaseException as exc:
            LOGGER.exception("a worker slot failed")
            self._fatal = exc
            self._nudge()

    def _bury_undecodable(self, exc: EventDecodeError) -> None:
        delivery = Delivery.of(exc.lease)
        settler = self._settler
        assert settler is not None
        self._hooks.started(delivery)
        try:
            settler.bury(exc.lease, failure_reason(exc))
        except TransportError as error:
            self._hooks.settled(delivery, "lost", 0.0, error)
            return
        self._hooks.settled(delivery, "buried", 0.0, exc)

    # -- handling --------------------------------------------------------------------

    def _deliver(self, lease: Lease[E], sent: float, own: Transport[E], seat: Seat) -> None:
        settler = self._settler
        assert settler is not None
        delivery = Delivery.of(lease)
        interrupt = Signal()

        def lost(error: LeaseLost) -> None:
            interrupt.set()
            self._hooks.lost(delivery, error)

        keeper = LeaseKeeper(
            settler,
            lease,
            self.visibility,
            sent=sent,
            on_lost=lost,
            on_renewed=lambda _: self._hooks.renewed(delivery),
        )
        ctx = Context(self.worker_id, keeper, self._stopping, interrupt)
        item = _Running(lease, keeper, ctx, delivery)
        limit: Job | None = None
        # One look at closing and the registration together, so that the hand-back
        # either sees this delivery or this delivery sees that it has begun.
        with self._running_lock:
            closing = self._closing
            if not closing:
                self._running[id(item)] = item
        if closing:  # claimed as the worker stopped: give it straight back
            try:
                own.nack(lease)
                self.handed_back += 1
            except TransportError as exc:
                LOGGER.warning("handing back message %d: %s", lease.seq, exc)
            return
        try:
            seat.take(keeper)
            if self.timeout is not None:
                timeout = self.timeout
                limit = Job(
                    lambda: None if item.taken else item.started + timeout,
                    lambda: self._timed_out(item),
                )
                self._watchdog.add(limit)
            self._hooks.started(delivery)
            error: BaseException | None = None
            try:
                self._handler(lease.event, ctx)
            except Exception as exc:
                error = exc
            if item.take():
                self._settle(item, decide(error, lease.attempt, self.retry), error, own)
        finally:
            keeper.release()
            if limit is not None:
                self._watchdog.discard(limit)
            with self._running_lock:
                del self._running[id(item)]
            if self._stopping.is_set():
                self._nudge()

    def _timed_out(self, item: _Running[E]) -> None:
        if not item.take():
            return
        item.ctx.cancel(Cancelled("timeout"))
        error = TimeoutError(f"the handler ran past its timeout of {self.timeout:g}s")
        # Settle off the watchdog thread, which other leases' deadlines depend on.
        threading.Thread(
            target=self._settle,
            args=(item, decide(error, item.lease.attempt, self.retry), error, self._settler),
            name="worker-timeout",
            daemon=True,
        ).start()

    def _settle(
        self,
        item: _Running[E],
        settle: Settle,
        error: BaseException | None,
        settler: Transport[E] | None,
    ) -> bool:
        """Carry out ``settle`` on ``settler`` once the handler is done (or given up on);
        report it. Returns whether the transport took it."""
        assert settler is not None
        keeper = item.keeper
        seconds = time.monotonic() - item.started
        if keeper.lost or not keeper.release():
            self._hooks.settled(item.delivery, "lost", seconds, error or keeper_error(keeper))
            return False
        lease = keeper.lease
        try:
            if settle.action == "ack":
                settler.ack(lease)
            elif settle.action == "nack":
                settler.nack(lease, settle.delay)
            elif settle.action == "bury":
                settler.bury(lease, settle.reason)
        except TransportError as exc:
            # LeaseLost: someone else settled it; anything else: the lease lapses and the
            # message comes back. Either way this delivery is over without our settle.
            self._hooks.settled(item.delivery, "lost", seconds, exc)
            return False
        self._hooks.settled(item.delivery, settle.outcome, seconds, error)
        return settle.action != "none"


def keeper_error(keeper: LeaseKeeper[Any]) -> BaseException | None:
    try:
        keeper.check()
    except LeaseLost as exc:
        return exc
    return None
