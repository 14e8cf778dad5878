"""The lease keeper: renews a lease at about a third of its visibility, on the local
monotonic clock, and says when the lease is lost.

A lease counts as lost when a renewal raises `LeaseLost`, or when renewals keep failing
(a passing `TransportError`) until just before the last confirmed expiry: the keeper never
compares a server's ``expires_at`` with the local clock. A confirmation is dated from when
the renewal was *sent*, so the local idea of the expiry is never later than the server's.
A claim that took long to return may leave the keeper unable to vouch for its lease at all:
`vouch` renews it before any handler runs, or loses it.

`Schedule` (a thread over a set of jobs) drives many sync keepers; `AsyncLeaseKeeper` is a
timer, then a task from its first renewal on.
Imports only the public contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from transports_core import AsyncTransport, Lease, LeaseLost, Transport, TransportError
from transports_core.backend import check_visibility

__all__ = [
    "AsyncLeaseKeeper",
    "LeaseKeeper",
    "Job",
    "Schedule",
    "Seat",
    "async_lease_keeper",
    "lease_keeper",
]

E = TypeVar("E")
T = TypeVar("T")
LOGGER: Final = logging.getLogger("transports_worker")
RENEW_EVERY: Final = 1 / 3  # of the visibility
IDLE_WAKE: Final = 1.0  # seconds a schedule with nothing due sleeps before it looks again
NEVER: Final = float("inf")


def retry_interval(visibility: float) -> float:
    """How soon a failed renewal is tried again."""
    return max(0.01, min(1.0, visibility / 20))


def safety_margin(visibility: float) -> float:
    """How long before the last confirmed expiry a lease that cannot be renewed counts as
    lost: the handler must stop before another worker can claim the message."""
    return max(0.02, min(2.0, visibility / 10))


@functools.lru_cache(maxsize=16)
def _margins(visibility: float) -> tuple[float, float]:
    """A checked visibility's safety margin and retry interval: a worker makes a keeper
    per delivery, all with the same visibility."""
    return safety_margin(visibility), retry_interval(visibility)


_MAKING = threading.Lock()


class Signal:
    """A flag that is set once, which threads may wait on: `threading.Event`'s use here,
    without building an Event (and its Condition) for each delivery when nobody waits."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        event = self._event  # read after the flag: a waiter that made it sees one or other
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        event = self._event
        if event is None:
            with _MAKING:  # two waiters must share one Event
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        return self.is_set() or event.wait(timeout)


@dataclass(eq=False)
class Job:
    """Work a `Schedule` runs: ``fire`` once ``due()`` (monotonic seconds) has passed;
    ``due()`` returning None drops the job."""

    due: Callable[[], float | None]
    fire: Callable[[], object]


class Schedule:
    """One daemon thread running the jobs of a small, changing set when each falls due.

    The set holds only live work (a worker's running deliveries), so it is scanned
    whole at each wake instead of keeping a heap of entries that outlive their lease.
    """

    def __init__(self, name: str) -> None:
        self._jobs: set[Job] = set()
        self._cond = threading.Condition(threading.Lock())  # never re-entered
        self._planned = float("inf")
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, job: Job) -> None:
        due = job.due()
        with self._cond:
            self._jobs.add(job)
            if due is not None and due < self._planned:
                self._cond.notify()

    def expect(self, due: float) -> None:
        """A job already on the schedule now falls due at ``due``: wake the thread if it
        plans to look later than that. (Needed only for a ``due`` sooner than
        `IDLE_WAKE` from now: the longest the thread sleeps without a notify.)"""
        with self._cond:
            if due < self._planned:
                self._cond.notify()

    def discard(self, job: Job) -> None:
        with self._cond:
            self._jobs.discard(job)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _ready(self) -> list[Job] | None:
        """Wait for the jobs that are due; None once closed."""
        with self._cond:
            while not self._closed:
                now, ready, planned = time.monotonic(), [], float("inf")
                for job in list(self._jobs):
                    due = job.due()
                    if due is None:
                        self._jobs.discard(job)
                    elif due <= now:
                        ready.append(job)
                    else:
                        planned = min(planned, due)
                if ready:
                    self._planned = now
                    return ready
                # With nothing due, still wake now and then: so that adding a job due
                # later than that needs no notify, which would cost a thread switch for
                # every delivery of a quick handler (released before this thread looks).
                planned = min(planned, now + IDLE_WAKE)
                self._planned = planned
                self._cond.wait(planned - now)
            return None

    def _run(self) -> None:
        while (ready := self._ready()) is not None:
            for job in ready:
                try:
                    job.fire()
                except Exception:  # a bug in one job must not stop every other lease's
                    LOGGER.exception("lease keeper job %r failed", job)


class Seat:
    """A worker slot's place on both schedules, for one keeper at a time: the keeper of
    each delivery takes the seat instead of adding (and later discarding) jobs of its own,
    which would take both schedules' locks twice per delivery. A released keeper stays
    seated, due never, until the next one takes its place."""

    def __init__(self, renewals: Schedule, watchdog: Schedule) -> None:
        self.keeper: LeaseKeeper[Any] | None = None
        self._renewals, self._watchdog = renewals, watchdog
        renewals.add(Job(self._renew_due, self._renew))
        watchdog.add(Job(self._expiry_due, self._expire))

    def take(self, keeper: LeaseKeeper[Any], now: float) -> None:
        """Seat ``keeper``, made at ``now`` (monotonic)."""
        self.keeper = keeper
        # A keeper just made is active: its plan is its dues, read without the checks.
        # A schedule looks on its own within IDLE_WAKE: only a sooner due needs a wake.
        soon = now + IDLE_WAKE
        renewal, deadline = keeper.next_renewal, keeper.deadline
        if renewal < soon or deadline < soon:
            self._renewals.expect(renewal)
            self._watchdog.expect(deadline)

    def _renew_due(self) -> float:
        keeper = self.keeper
        due = None if keeper is None else keeper.renewal_due()
        return NEVER if due is None else due

    def _expiry_due(self) -> float:
        keeper = self.keeper
        due = None if keeper is None else keeper.expiry_due()
        return NEVER if due is None else due

    def _renew(self) -> None:
        # The seat may have changed hands since the schedule looked: renew only if due.
        keeper = self.keeper
        if keeper is not None and self._renew_due() <= time.monotonic():
            keeper.renew()

    def _expire(self) -> None:
        keeper = self.keeper
        if keeper is not None:
            keeper.expire()


class _Flag(Protocol):
    def is_set(self) -> bool: ...

    def set(self) -> None: ...


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python 3.10, which has no add_note, the same list
    that 3.11 keeps (``__notes__``), which its tracebacks do not print."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        vars(error)["__notes__"] = [*getattr(error, "__notes__", ()), note]


class _Keeping(Generic[E, T]):
    """What both keepers hold and decide alike: the latest lease, its deadline and next
    renewal on the local clock, the margins, and the `LeaseLost` a lost lease raises.
    ``T`` is the transport twin that renews."""

    # Slotted: a worker makes a keeper for every delivery.
    __slots__ = (
        "_error",
        "_lease",
        "_lost",
        "_margin",
        "_on_failed",
        "_on_lost",
        "_on_renewed",
        "_released",
        "_retry",
        "_transport",
        "deadline",
        "next_renewal",
        "renewals",
        "visibility",
    )
    _lost: _Flag

    def __init__(
        self,
        transport: T,
        lease: Lease[E],
        visibility: float,
        *,
        sent: float | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_renewed: Callable[[Lease[E]], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        if type(visibility) is not float or not 0.0 < visibility < NEVER:  # not as checked
            visibility = check_visibility(visibility)
        self.visibility = visibility
        self._margin, self._retry = _margins(visibility)
        self._transport = transport
        self._lease = lease
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._on_failed = on_failed
        self._error: LeaseLost | None = None
        self._released = False
        self.renewals = 0
        # ``sent``: when the claim that granted ``lease`` was sent.
        self._plan(time.monotonic() if sent is None else sent)
        self._setup()

    def _plan(self, sent: float) -> None:
        """Date the lease from ``sent``, when the call that granted it was sent:
        ``deadline``, the monotonic time past which the lease counts as lost unless renewed
        before (a safety margin before its end), and ``next_renewal``."""
        self.deadline = sent + self.visibility - self._margin
        self.next_renewal = sent + self.visibility * RENEW_EVERY

    def _setup(self) -> None:
        """The twin's own state."""

    @property
    def lease(self) -> Lease[E]:
        return self._lease

    @property
    def lost(self) -> bool:
        self.expire()
        return self._lost.is_set()

    def expire(self) -> None:
        """Lose the lease once its deadline has passed without a renewal: whoever looks
        first, the watchdog or a reader, reports it."""
        if not self._released and time.monotonic() >= self.deadline and not self._lost.is_set():
            self._lose(None)

    def _doubtful(self, now: float) -> bool:
        """Whether the keeper cannot vouch for the lease at ``now``: its deadline has
        passed, or is less than a safety margin away (too close to renew in time)."""
        return now + self._margin >= self.deadline

    def _vouched(self, renewed: Lease[E], sent: float) -> bool:
        self._confirm(renewed, sent)
        if self._on_renewed is not None:
            self._on_renewed(renewed)
        return True

    def _failed(self, error: BaseException) -> None:
        """A renewal raised ``error``, other than `LeaseLost`: tell ``on_failed``."""
        if self._on_failed is not None:
            self._on_failed(error)

    def _unvouched(self, error: BaseException) -> bool:
        if not isinstance(error, LeaseLost):
            self._failed(error)
        if not isinstance(error, TransportError):
            LOGGER.error("renewing the lease on message %d failed", self._lease.seq, exc_info=error)
        self._lose(error)
        return False

    @property
    def released(self) -> bool:
        return self._released

    def check(self) -> None:
        """Raise `LeaseLost` if the lease is gone."""
        if self.lost and self._error is not None:
            raise self._error

    def _lose(self, cause: BaseException | None) -> None:
        raise NotImplementedError

    def _mark_lost(self, cause: BaseException | None) -> LeaseLost | None:
        """Mark the lease lost, once and not after release; return the error to report."""
        if self._released or self._lost.is_set():
            return None
        # A renewal the store refused knows why; the keeper's own clock does not.
        error = LeaseLost(self._lease, cause.reason if isinstance(cause, LeaseLost) else None)
        error.__cause__ = cause
        if cause is None:
            _add_note(error, "renewals did not succeed before the lease's last confirmed end")
        self._error = error
        self._lost.set()
        return error

    def _confirm(self, renewed: Lease[E], sent: float) -> None:
        self._lease = renewed
        self._plan(sent)
        self.renewals += 1


class LeaseKeeper(_Keeping[E, Transport[E]]):
    """Keeps one lease renewed until `release`; see `lease_keeper`.

    ``lease`` is the latest renewed lease; ``lost`` turns true once it is gone, and then
    `check` raises `LeaseLost` (chained from the transport error when renewals failed).
    """

    __slots__ = ("_lock", "_schedules")
    _lost: Signal

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._lost = Signal()
        self._schedules: tuple[tuple[Schedule, Job], ...] = ()

    def vouch(self) -> bool:
        """Before the handler starts: renew the lease now, on the calling thread, if the
        keeper cannot vouch for it (a claim that took about ``visibility`` to return).
        True if the lease is held; a renewal that fails in any way loses it."""
        sent = time.monotonic()
        if not self._doubtful(sent):
            return True
        try:
            renewed = self._transport.extend(self._lease, self.visibility)
        except Exception as exc:
            return self._unvouched(exc)
        with self._lock:
            return self._vouched(renewed, sent)

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost (True) or ``timeout`` passes (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._released:
            now = time.monotonic()
            step = self.deadline - now
            if end is not None:
                step = min(step, end - now)
            if self._lost.wait(max(step, 0.0)) or self.lost:
                return True
            if end is not None and time.monotonic() >= end:
                return False
        return self._lost.is_set()

    def release(self) -> bool:
        """Stop renewing. Returns False if the lease was already lost (its deadline
        passing without a renewal counts: it is lost then)."""
        self.expire()
        lock = self._lock  # acquire and release: half the cost of a with block
        lock.acquire()
        again, self._released = self._released, True
        kept = not self._lost.is_set()
        lock.release()
        if not again:
            for schedule, job in self._schedules:
                schedule.discard(job)
        return kept

    def _lose(self, cause: BaseException | None) -> None:
        with self._lock:
            error = self._mark_lost(cause)
        if error is not None and self._on_lost is not None:
            self._on_lost(error)

    def start(self, renewals: Schedule, watchdog: Schedule) -> None:
        """Renew on ``renewals``; lose the lease at its deadline on ``watchdog``, which
        runs no transport call, so a renewal that hangs cannot delay it."""
        self._schedules = (
            (renewals, Job(self.renewal_due, self.renew)),
            (watchdog, Job(self.expiry_due, self.expire)),
        )
        for schedule, job in self._schedules:
            schedule.add(job)

    def _active(self) -> bool:
        return not self._released and not self._lost.is_set()

    def renewal_due(self) -> float | None:
        """When the next renewal is due (monotonic); None once lost or released."""
        return self.next_renewal if self._active() else None

    def expiry_due(self) -> float | None:
        """When the lease expires unless renewed: its deadline; None once lost or
        released."""
        return self.deadline if self._active() else None

    def renew(self) -> None:
        """One renewal, then the next is planned (or none, once lost or released)."""
        if not self._active():
            return
        sent = time.monotonic()
        try:
            renewed = self._transport.extend(self._lease, self.visibility)
        except LeaseLost as exc:
            self._lose(exc)
            return
        except TransportError as exc:
            self._failed(exc)
            now = time.monotonic()
            if now + self._retry >= self.deadline:
                self._lose(exc)
                return
            LOGGER.debug("renewal of %s failed, retrying: %s", self._lease.seq, exc)
            self.next_renewal = now + self._retry
            return
        except Exception as exc:  # not a passing failure: the lease cannot be kept
            self._failed(exc)
            LOGGER.exception("renewing the lease on message %d failed", self._lease.seq)
            self._lose(exc)
            return
        with self._lock:
            if not self._active():
                return
            self._confirm(renewed, sent)
        if self._on_renewed is not None:
            self._on_renewed(renewed)


@contextlib.contextmanager
def lease_keeper(
    transport: Transport[E], lease: Lease[E], *, visibility: float
) -> Iterator[LeaseKeeper[E]]:
    """Keep ``lease`` renewed while the block runs, around code that is not a handler::

        lease = transport.claim("me", visibility=30)
        with lease_keeper(transport, lease, visibility=30) as keeper:
            for chunk in work:
                keeper.check()            # raises LeaseLost once the lease is gone
                process(chunk)
        transport.ack(keeper.lease)

    Renewals run on two private daemon threads, so the lease is kept even while the block
    does not call `check`.
    """
    keeper = LeaseKeeper(transport, lease, visibility)
    renewals, watchdog = Schedule("lease-keeper"), Schedule("lease-watchdog")
    try:
        keeper.start(renewals, watchdog)
        yield keeper
    finally:
        keeper.release()
        renewals.close()
        watchdog.close()


class AsyncLeaseKeeper(_Keeping[E, AsyncTransport[E]]):
    """`LeaseKeeper` for an `AsyncTransport`: one task renews, and ``on_lost`` runs in the
    event loop at once (the worker cancels the handler's task there). The task starts when
    the first renewal is due, from a timer: a lease released before then (most of a
    worker's) costs no task."""

    __slots__ = ("_stray", "_task", "_timer", "_wake")
    _lost: asyncio.Event

    def _setup(self) -> None:
        self._lost = asyncio.Event()
        self._wake: asyncio.Event | None = None  # set on release: ends the task's pause
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        # A renewal still in flight when the lease was lost or released: it is left to
        # finish rather than cancelled mid-call, and its result is ignored.
        self._stray: asyncio.Task[Lease[E]] | None = None

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        delay = max(self.next_renewal - time.monotonic(), 0.0)
        self._timer = loop.call_later(delay, self._renewing, loop)

    def _renewing(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if not self._released:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._keep())

    async def vouch(self) -> bool:
        """`LeaseKeeper.vouch`, awaiting the renewal."""
        sent = time.monotonic()
        if not self._doubtful(sent):
            return True
        try:
            renewed = await self._transport.extend(self._lease, self.visibility)
        except Exception as exc:
            return self._unvouched(exc)
        return self._vouched(renewed, sent)

    def release(self) -> bool:
        """Stop renewing. Returns False if the lease was already lost (its deadline
        passing without a renewal counts: it is lost then)."""
        self.expire()
        self._released = True
        timer, wake = self._timer, self._wake
        if timer is not None:
            timer.cancel()
            self._timer = None
        if wake is not None:
            wake.set()
        return not self._lost.is_set()

    async def close(self) -> None:
        """Release, and wait for the renewal task (and any renewal in flight) to end."""
        self.release()
        for task in (self._task, self._stray):
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task

    def _lose(self, cause: BaseException | None) -> None:
        error = self._mark_lost(cause)
        if error is not None and self._on_lost is not None:
            self._on_lost(error)

    async def _pause(self, until: float) -> bool:
        """Sleep until ``until``; True if released meanwhile."""
        delay = until - time.monotonic()
        wake = self._wake
        if delay > 0 and wake is not None and not self._released:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
        return self._released

    async def _keep(self) -> None:
        due = self.next_renewal
        while not await self._pause(due):
            if time.monotonic() >= self.deadline:
                self._lose(None)
                return
            sent = time.monotonic()
            call = asyncio.ensure_future(self._transport.extend(self._lease, self.visibility))
            done, _ = await asyncio.wait({call}, timeout=max(self.deadline - sent, 0.0))
            if not done:
                self._stray = call
                self._failed(TimeoutError("the renewal did not return before the lease's end"))
                self._lose(None)
                return
            error = call.exception()
            if isinstance(error, LeaseLost):
                self._lose(error)
                return
            if error is not None:
                self._failed(error)
            if isinstance(error, TransportError):
                now = time.monotonic()
                if now + self._retry >= self.deadline:
                    self._lose(error)
                    return
                due = now + self._retry
                continue
            if error is not None:
                LOGGER.error(
                    "renewing the lease on message %d failed", self._lease.seq, exc_info=error
                )
                self._lose(error)
                return
            if self._released or self._lost.is_set():
                return
            self._confirm(call.result(), sent)
            if self._on_renewed is not None:
                self._on_renewed(self._lease)
            due = self.next_renewal


@contextlib.asynccontextmanager
async def async_lease_keeper(
    transport: AsyncTransport[E], lease: Lease[E], *, visibility: float
) -> AsyncIterator[AsyncLeaseKeeper[E]]:
    """The async twin of `lease_keeper`. Once the lease is lost, the task that entered
    the block is cancelled at once (and `LeaseLost` is raised in its place when the block
    exits), so no code inside runs on without the lease."""
    task = asyncio.current_task()
    cancelled: list[LeaseLost] = []

    def lost(error: LeaseLost) -> None:
        cancelled.append(error)
        if task is not None:
            task.cancel()

    keeper = AsyncLeaseKeeper(transport, lease, visibility, on_lost=lost)
    keeper.start()
    try:
        yield keeper
    except asyncio.CancelledError:
        # Only our own cancellation becomes LeaseLost; one from outside stays itself.
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if cancelled and (uncancel is None or uncancel() == 0):
            raise cancelled[0] from cancelled[0].__cause__
        raise
    finally:
        await keeper.close()
