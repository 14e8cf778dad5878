"""What the runtime suite's scenarios share: the fixtures' types, the `Outage` protocol, a
`Recorder` of outcomes, a worker run on a thread of its own, handlers that sleep through
their context, and the journal the contention scenario writes. Imports pytest nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, Protocol

from transports_core import (
    AsyncTransport,
    Event,
    Lease,
    Transport,
    open_async_transport,
    open_transport,
)
from transports_core.conformance.journal import Journal
from transports_worker._async import AsyncWorker
from transports_worker._context import AsyncContext, Context
from transports_worker._hooks import Delivery, Hooks
from transports_worker._outcomes import Cancelled, Outcome

__all__ = [
    "PATIENCE",
    "VISIBILITY",
    "AsyncTransportFactory",
    "Flavour",
    "Held",
    "Journaling",
    "Outage",
    "QuickHandles",
    "Recorder",
    "RunningWorker",
    "Start",
    "TransportFactory",
    "sleepers",
    "wait_for",
]

# Called with open_transport's keywords (``event_type=``) or none; opens a new handle.
TransportFactory = Callable[..., Transport[Any]]
AsyncTransportFactory = Callable[..., AsyncTransport[Any]]
Flavour = Literal["sync", "async"]
# The suite's ``start`` fixture: ``start(sync_handler, async_handler, **options)``.
Start = Callable[..., "RunningWorker"]

VISIBILITY: Final = 1.0  # short, so that a handler outlives several renewals quickly
PATIENCE: Final = 30.0  # how long any wait for the worker may take before the test fails


class Outage(Protocol):
    """What the transient-failure scenarios need from a backend.

    ``transport()`` opens a handle that gives up quickly (well under a tenth of a second
    more than usual) while the store is unavailable, raising a `TransportError`;
    ``async_transport()`` its async twin; ``during()`` makes the store unavailable to
    such handles for the block's length.
    """

    def transport(self) -> Transport[Event]: ...

    def async_transport(self) -> AsyncTransport[Event]: ...

    def during(self) -> contextlib.AbstractContextManager[None]: ...


class QuickHandles:
    """The half of an `Outage` that opens handles: ``url`` with ``options`` that make a
    handle give up quickly. A backend's outage adds ``during``."""

    def __init__(self, url: str, **options: object) -> None:
        self.url, self.options = url, options

    def transport(self) -> Transport[Event]:
        return open_transport(self.url, **self.options)

    def async_transport(self) -> AsyncTransport[Event]:
        return open_async_transport(self.url, **self.options)


class Recorder(Hooks):
    """Hooks that remember every delivery's outcome, and let a test wait for them."""

    def __init__(self) -> None:
        self.started_: list[Delivery] = []
        self.settled_: list[tuple[Delivery, Outcome, BaseException | None]] = []
        self.renewals = 0
        self._cond = threading.Condition()

    def started(self, delivery: Delivery) -> None:
        with self._cond:
            self.started_.append(delivery)
            self._cond.notify_all()

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        with self._cond:
            self.settled_.append((delivery, outcome, error))
            self._cond.notify_all()

    def renewed(self, delivery: Delivery) -> None:
        with self._cond:
            self.renewals += 1

    def outcomes(self) -> list[tuple[int, int, Outcome]]:
        with self._cond:
            return [(d.seq, d.attempt, outcome) for d, outcome, _ in self.settled_]

    def wait_settled(self, count: int, timeout: float = PATIENCE) -> None:
        with self._cond:
            done = self._cond.wait_for(lambda: len(self.settled_) >= count, timeout)
        assert done, f"only {len(self.settled_)} of {count} deliveries settled: {self.outcomes()}"


class Held:
    """When a handler held its lease, as the journal wants it: from its start (just after
    the claim returned) to its end (just before the worker settles)."""

    spans: ClassVar[dict[tuple[int, int, str], list[int]]] = {}
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, key: tuple[int, int, str]) -> None:
        self.key = key
        with self.lock:
            self.spans[key] = [time.monotonic_ns(), 0]

    def end(self) -> None:
        with self.lock:
            self.spans[self.key][1] = time.monotonic_ns()


class Journaling(Hooks):
    """Writes one journal entry per delivery that reached its settle."""

    OUTCOMES: ClassVar[dict[str, str]] = {"acked": "ack", "retried": "nack", "failed": "nack"}

    def __init__(self, path: Path, total: int) -> None:
        self._journal = Journal(path)
        self.acked = 0
        self._cond = threading.Condition()

    @staticmethod
    def begin(lease: Lease[Event]) -> Held:
        return Held((lease.seq, lease.attempt, lease.worker_id))

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        with Held.lock:
            claimed, released = Held.spans.pop((delivery.seq, delivery.attempt, delivery.worker_id))
        self._journal.record(delivery, claimed, released, self.OUTCOMES.get(outcome, outcome))
        with self._cond:
            self.acked += outcome == "acked"
            self._cond.notify_all()

    def wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def close(self) -> None:
        self._journal.close()


class RunningWorker:
    """A worker running on a thread of its own (its own event loop for `AsyncWorker`)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            if isinstance(self.worker, AsyncWorker):
                self.code = asyncio.run(self.worker.run())
            else:
                self.code = self.worker.run()
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = PATIENCE) -> int:
        """Stop the worker (draining), and return its exit code."""
        self.worker.stop()
        return self.join(timeout)

    def join(self, timeout: float = PATIENCE) -> int:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.worker!r} did not stop in {timeout}s"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code


def wait_for(flag: threading.Event, what: str, timeout: float = PATIENCE) -> None:
    assert flag.wait(timeout), f"timed out after {timeout}s waiting for {what}"


def sleepers(
    flag: threading.Event, seconds: float, cancelled: threading.Event | None = None
) -> tuple[
    Callable[[Event, Context[Event]], None],
    Callable[[Event, AsyncContext[Event]], Awaitable[None]],
]:
    """A sync and an async handler that set ``flag`` as they start, then sleep through
    the context for ``seconds`` (so that a cancel or a lost lease ends them); a cancel
    also sets ``cancelled``."""
    said = threading.Event() if cancelled is None else cancelled

    def sleeps(event: Event, ctx: Context[Event]) -> None:
        flag.set()
        try:
            ctx.sleep(seconds)
        except Cancelled:
            said.set()
            raise

    async def asleeps(event: Event, ctx: AsyncContext[Event]) -> None:
        flag.set()
        try:
            await ctx.sleep(seconds)
        except asyncio.CancelledError:
            said.set()
            raise

    return sleeps, asleeps
