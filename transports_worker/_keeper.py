"""The lease keeper: renews a lease at about a third of its visibility, on the local
monotonic clock, and says when the lease is lost.

A lease counts as lost when a renewal raises `LeaseLost`, or when renewals keep failing
(a passing `TransportError`) until just before the last confirmed expiry: the keeper never
compares a server's ``expires_at`` with the local clock. A confirmation is dated from when
the renewal was *sent*, so the local idea of the expiry is never later than the server's.

`Timers` (a thread with a heap) drives many sync keepers; `AsyncLeaseKeeper` is one task.
Imports only the public contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final, Generic, TypeVar

from transports_core import AsyncTransport, Lease, LeaseLost, Transport, TransportError

__all__ = [
    "AsyncLeaseKeeper",
    "LeaseKeeper",
    "Timers",
    "async_lease_keeper",
    "lease_keeper",
]

E = TypeVar("E")
LOGGER: Final = logging.getLogger("transports_worker")
RENEW_EVERY: Final = 1 / 3  # of the visibility
Tick = Callable[[], "float | None"]


def retry_interval(visibility: float) -> float:
    """How soon a failed renewal is tried again."""
    return max(0.01, min(1.0, visibility / 20))


def safety_margin(visibility: float) -> float:
    """How long before the last confirmed expiry a lease that cannot be renewed counts as
    lost: the handler must stop before another worker can claim the message."""
    return max(0.02, min(2.0, visibility / 10))


def _check_visibility(visibility: object) -> float:
    if isinstance(visibility, bool) or not isinstance(visibility, (int, float)):
        raise TypeError(f"visibility must be a number of seconds, got {visibility!r}")
    if not 0 < visibility < float("inf"):
        raise ValueError(f"visibility must be > 0 seconds, got {visibility!r}")
    return float(visibility)


class Timers:
    """One daemon thread running ``tick`` callables when they fall due; each returns
    when it wants to run next (monotonic seconds) or None to stop."""

    def __init__(self, name: str) -> None:
        self._heap: list[tuple[float, int, Tick]] = []
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def at(self, due: float, tick: Tick) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._count), tick))
            if self._heap[0][2] is tick:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._closed:
                    return
                _, _, tick = heapq.heappop(self._heap)
            try:
                due = tick()
            except Exception:  # a bug in a tick must not stop every other lease's renewals
                LOGGER.exception("lease keeper tick %r failed", tick)
                continue
            if due is not None:
                self.at(due, tick)


class LeaseKeeper(Generic[E]):
    """Keeps one lease renewed until `release`; see `lease_keeper`.

    ``lease`` is the latest renewed lease; ``lost`` turns true once it is gone, and then
    `check` raises `LeaseLost` (chained from the transport error when renewals failed).
    """

    def __init__(
        self,
        transport: Transport[E],
        lease: Lease[E],
        visibility: float,
        *,
        sent: float | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_renewed: Callable[[Lease[E]], None] | None = None,
    ) -> None:
        self.visibility = _check_visibility(visibility)
        self._transport = transport
        self._lease = lease
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._lock = threading.Lock()
        self._lost = threading.Event()
        self._error: LeaseLost | None = None
        self._released = False
        self.renewals = 0
        # ``sent``: when the claim (or last extend) that granted ``lease`` was sent.
        self._confirmed = (time.monotonic() if sent is None else sent) + self.visibility
        self._margin = safety_margin(self.visibility)
        self._retry = retry_interval(self.visibility)

    @property
    def lease(self) -> Lease[E]:
        return self._lease

    @property
    def deadline(self) -> float:
        """Monotonic time past which the lease counts as lost unless renewed before."""
        return self._confirmed - self._margin

    @property
    def lost(self) -> bool:
        if not self._lost.is_set() and not self._released and time.monotonic() >= self.deadline:
            self._lose(None)
        return self._lost.is_set()

    @property
    def released(self) -> bool:
        return self._released

    def check(self) -> None:
        """Raise `LeaseLost` if the lease is gone."""
        if self.lost and self._error is not None:
            raise self._error

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
        """Stop renewing. Returns False if the lease was already lost."""
        with self._lock:
            self._released = True
            return not self._lost.is_set()

    def _lose(self, cause: BaseException | None) -> None:
        with self._lock:
            if self._released or self._lost.is_set():
                return
            error = LeaseLost(self._lease)
            error.__cause__ = cause
            if cause is None:
                error.add_note("renewals did not succeed before the lease's last confirmed end")
            self._error = error
            self._lost.set()
        if self._on_lost is not None:
            self._on_lost(error)

    def start(self, renewals: Timers, watchdog: Timers) -> None:
        renewals.at(self._confirmed - self.visibility * (1 - RENEW_EVERY), self.renew)
        watchdog.at(self.deadline, self.watch)

    def renew(self) -> float | None:
        """One renewal; returns when the next is due, None when done."""
        if self._released or self._lost.is_set():
            return None
        sent = time.monotonic()
        try:
            renewed = self._transport.extend(self._lease, self.visibility)
        except LeaseLost as exc:
            self._lose(exc)
            return None
        except TransportError as exc:
            now = time.monotonic()
            if now + self._retry >= self.deadline:
                self._lose(exc)
                return None
            LOGGER.debug("renewal of %s failed, retrying: %s", self._lease.seq, exc)
            return now + self._retry
        except Exception as exc:  # not a passing failure: the lease cannot be kept
            LOGGER.exception("renewing the lease on message %d failed", self._lease.seq)
            self._lose(exc)
            return None
        with self._lock:
            if self.released or self._lost.is_set():
                return None
            self._lease = renewed
            self._confirmed = sent + self.visibility
            self.renewals += 1
        if self._on_renewed is not None:
            self._on_renewed(renewed)
        return sent + self.visibility * RENEW_EVERY

    def watch(self) -> float | None:
        """The watchdog: loses the lease at its deadline even while a renewal hangs."""
        if self._released or self._lost.is_set():
            return None
        if time.monotonic() >= self.deadline:
            self._lose(None)
            return None
        return self.deadline


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
    renewals, watchdog = Timers("lease-keeper"), Timers("lease-watchdog")
    try:
        keeper.start(renewals, watchdog)
        yield keeper
    finally:
        keeper.release()
        renewals.close()
        watchdog.close()


class AsyncLeaseKeeper(Generic[E]):
    """`LeaseKeeper` for an `AsyncTransport`: one task renews, and ``on_lost`` runs in the
    event loop at once (the worker cancels the handler's task there)."""

    def __init__(
        self,
        transport: AsyncTransport[E],
        lease: Lease[E],
        visibility: float,
        *,
        sent: float | None = None,
        on_lost: Callable[[LeaseLost], None] | None = None,
        on_renewed: Callable[[Lease[E]], None] | None = None,
    ) -> None:
        self.visibility = _check_visibility(visibility)
        self._transport = transport
        self._lease = lease
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._error: LeaseLost | None = None
        self._released = asyncio.Event()
        self._lost = asyncio.Event()
        self.renewals = 0
        self._confirmed = (time.monotonic() if sent is None else sent) + self.visibility
        self._margin = safety_margin(self.visibility)
        self._retry = retry_interval(self.visibility)
        self._task: asyncio.Task[None] | None = None
        # A renewal still in flight when the lease was lost or released: it is left to
        # finish rather than cancelled mid-call, and its result is ignored.
        self._stray: asyncio.Task[Lease[E]] | None = None

    @property
    def lease(self) -> Lease[E]:
        return self._lease

    @property
    def deadline(self) -> float:
        return self._confirmed - self._margin

    @property
    def lost(self) -> bool:
        idle = not self._lost.is_set() and not self._released.is_set()
        if idle and time.monotonic() >= self.deadline:
            self._lose(None)
        return self._lost.is_set()

    def check(self) -> None:
        if self.lost and self._error is not None:
            raise self._error

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep())

    def release(self) -> bool:
        """Stop renewing. Returns False if the lease was already lost."""
        self._released.set()
        return not self._lost.is_set()

    async def close(self) -> None:
        """Release, and wait for the renewal task (and any renewal in flight) to end."""
        self.release()
        for task in (self._task, self._stray):
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task

    def _lose(self, cause: BaseException | None) -> None:
        if self._released.is_set() or self._lost.is_set():
            return
        error = LeaseLost(self._lease)
        error.__cause__ = cause
        if cause is None:
            error.add_note("renewals did not succeed before the lease's last confirmed end")
        self._error = error
        self._lost.set()
        if self._on_lost is not None:
            self._on_lost(error)

    async def _pause(self, until: float) -> bool:
        """Sleep until ``until``; True if released meanwhile."""
        delay = until - time.monotonic()
        if delay > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._released.wait(), delay)
        return self._released.is_set()

    async def _keep(self) -> None:
        due = self._confirmed - self.visibility * (1 - RENEW_EVERY)
        while not await self._pause(due):
            if time.monotonic() >= self.deadline:
                self._lose(None)
                return
            sent = time.monotonic()
            call = asyncio.ensure_future(self._transport.extend(self._lease, self.visibility))
            done, _ = await asyncio.wait({call}, timeout=max(self.deadline - sent, 0.0))
            if not done:
                self._stray = call
                self._lose(None)
                return
            error = call.exception()
            if isinstance(error, LeaseLost):
                self._lose(error)
                return
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
            if self._released.is_set() or self._lost.is_set():
                return
            self._lease = call.result()
            self._confirmed = sent + self.visibility
            self.renewals += 1
            if self._on_renewed is not None:
                self._on_renewed(self._lease)
            due = sent + self.visibility * RENEW_EVERY


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
