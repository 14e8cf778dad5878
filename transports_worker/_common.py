"""What both workers share: their options and checks, the worker id, the handles they
open, and every decision: what a finished handler leads to, and how a delivery is
settled and reported. A settle is one transport call at most: the decisions name it
(`Runtime._settle_call`) and take its outcome (`Runtime._settle_done`), and each twin
makes it with its own kind of call. No I/O.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, Literal, TypeVar

from transports_core import (
    Event,
    EventDecodeError,
    Lease,
    LeaseLost,
    TransportError,
    redact_url,
)
from transports_core.backend import check_worker_id

from ._context import Running
from ._hooks import Delivery, Fanout, Hooks, LoggingHooks
from ._outcomes import Bury, Cancelled, Outcome, Retry, RetryPolicy, failure_reason

__all__ = [
    "EXIT_DRAINED",
    "EXIT_HANDED_BACK",
    "Runtime",
    "Settle",
    "check_handler",
    "decide",
    "default_worker_id",
]

E = TypeVar("E")
S = TypeVar("S")  # the transport twin a worker drives
H = TypeVar("H")  # the handler it calls
LOGGER: Final = logging.getLogger("transports_worker")
EXIT_DRAINED: Final = 0
# EX_TEMPFAIL from sysexits.h: stopped before its work was done; that work is not lost.
EXIT_HANDED_BACK: Final = 75
EXIT_NOW: Final = 130
OWN_WAIT: Final = 10.0  # the longest a claim on a handle of the worker's own waits
CLAIM_BACKOFF: Final = (0.1, 5.0)
# A transport call: the method's name and its arguments.
Call = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Settle:
    """What to do with a lease once its handler has ended."""

    action: Literal["ack", "nack", "bury", "none"]
    outcome: Outcome
    delay: float = 0.0
    reason: str = ""

    def call(self, lease: Lease[Any]) -> Call:
        if self.action == "nack":
            return "nack", (lease, self.delay)
        if self.action == "bury":
            return "bury", (lease, self.reason)
        return self.action, (lease,)


ACK: Final = Settle("ack", "acked")
HAND_BACK: Final = Settle("nack", "handed_back")
LOST: Final = Settle("none", "lost")


def decide(error: BaseException | None, attempt: int, policy: RetryPolicy) -> Settle:
    """The settle that a handler's return (``error`` None) or exception leads to."""
    if error is None:
        return ACK
    if isinstance(error, Retry):
        return Settle("nack", "retried", delay=error.delay)
    if isinstance(error, Bury):
        return Settle("bury", "buried", reason=error.reason)
    if isinstance(error, (LeaseLost, Cancelled)):
        return Settle("none", "lost")
    if policy.is_final(error, attempt):
        return Settle("bury", "buried", reason=failure_reason(error))
    return Settle("nack", "failed", delay=policy.backoff(attempt))


def default_worker_id() -> str:
    """Host, process and a random suffix: unique, and readable in ``transports inspect``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _seconds(name: str, value: object, *, positive: bool = True) -> float:
    """``value`` as seconds, or an error naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'>' if positive else '>='} 0 seconds, got {value!r}")
    return float(value)


def _whole(name: str, value: object, low: int) -> int:
    """``value`` as a whole number of at least ``low``, or an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


def check_handler(handler: object, *, asynchronous: bool) -> None:
    """A handler is called as ``handler(event, ctx)``; a coroutine function for
    `AsyncWorker`, a plain one for `Worker`."""
    if not callable(handler):
        raise TypeError(f"the handler must be callable, got {handler!r}")
    name = getattr(handler, "__qualname__", repr(handler))
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(None, None)
        except TypeError:
            raise TypeError(
                f"handler {name} must take two arguments, (event, ctx); its signature is "
                f"{name}{signature}"
            ) from None
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    )
    if asynchronous and not is_async:
        raise TypeError(f"handler {name} is not an async function: run it with Worker")
    if not asynchronous and is_async:
        raise TypeError(f"handler {name} is an async function: run it with AsyncWorker")


def describe_handler(handler: Callable[..., object]) -> str:
    module = getattr(handler, "__module__", None)
    name = getattr(handler, "__qualname__", None) or repr(handler)
    return f"{module}:{name}" if module else name


def lost_error(item: Running[Any]) -> BaseException | None:
    """The `LeaseLost` the delivery's lost lease raises, or None."""
    try:
        item._keeper.check()
    except LeaseLost as exc:
        return exc
    return None


@contextlib.contextmanager
def logged(message: str, *args: object) -> Iterator[None]:
    """Log an exception from the block and go on: shutdown matters more than a handle
    that closed badly."""
    try:
        yield
    except Exception:
        LOGGER.exception(message, *args)


class Backoff:
    """The pause before a failed claim is tried again: doubling, up to a cap."""

    def __init__(self) -> None:
        self.delay = CLAIM_BACKOFF[0]

    def failed(self, exc: BaseException) -> float:
        delay = self.delay
        LOGGER.warning("claim failed, retrying in %.1fs: %s", delay, exc)
        self.delay = min(delay * 2, CLAIM_BACKOFF[1])
        return delay

    def reset(self) -> None:
        self.delay = CLAIM_BACKOFF[0]


class Runtime(Generic[E, S, H]):
    """What both workers hold and decide alike: their checked options, hooks and stop
    requests, and which handles they open. ``S`` is the transport twin, ``H`` the
    handler's type."""

    asynchronous: ClassVar[bool]

    def __init__(
        self,
        source: str | S | Callable[[], S],
        handler: H,
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
        # Each option is refused with an error naming it before anything runs.
        self.concurrency = _whole("concurrency", concurrency, 1)
        self.visibility = _seconds("visibility", visibility)
        self.timeout = None if timeout is None else _seconds("timeout", timeout)
        self.grace = _seconds("grace", grace, positive=False)
        self.min_priority = _whole("min_priority", min_priority, 0)
        if worker_id is not None:
            check_worker_id(worker_id)
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        self.retry = RetryPolicy() if retry is None else retry
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")
        check_handler(handler, asynchronous=self.asynchronous)
        self._source = source
        self._handler = handler
        self._event_type: object = Event if event_type is None else event_type
        self._hooks = Fanout((LoggingHooks(),) if hooks is None else hooks)
        self._handle_signals = handle_signals
        self._stopping = threading.Event()
        self._requests = 0
        self._claimers: list[S] = []
        self._settler: S | None = None
        self._owned = False
        self._started = False
        self._fatal: BaseException | None = None
        self._closing = False
        self.handed_back = 0
        self._handed_lock = threading.Lock()  # the supervisor and the slots count
        # Deliveries in flight. Slots add and remove their own without a lock they share:
        # one that every slot takes for each delivery queues them behind each other.
        self._running: dict[int, Running[Any]] = {}
        self._setup()

    def _setup(self) -> None:
        """The twin's own state, made with the options."""

    def __repr__(self) -> str:
        source = redact_url(self._source) if isinstance(self._source, str) else self._source
        name = type(self).__name__
        return f"<{name} {self.worker_id!r} on {source!r}, concurrency {self.concurrency}>"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _begin(self) -> None:
        if self._started:
            raise RuntimeError(f"{self!r} has already run: make a new {type(self).__name__}")
        self._started = True

    def _open_all(self, open_url: Callable[..., S]) -> None:
        """Open the handles: from a URL or a factory, one claiming handle per slot, so
        that no claim queues behind another slot's, and one shared by the renewals and
        the settles made off a slot; a transport passed in is all of them, not closed."""
        source = self._source
        if isinstance(source, str):
            url = source

            def opener() -> S:
                return open_url(url, event_type=self._event_type)
        elif hasattr(source, "claim") and hasattr(source, "extend"):
            self._settler = source  # type: ignore[assignment]
            self._claimers = [source] * self.concurrency  # type: ignore[list-item]
            return
        elif callable(source):
            opener = source
        else:
            raise TypeError(f"source must be a URL, a transport or a factory, got {source!r}")
        self._settler = opener()
        self._owned = True
        for _ in range(self.concurrency):
            self._claimers.append(opener())

    def _owned_handles(self) -> list[S]:
        if not self._owned:
            return []
        return [h for h in (*self._claimers, self._settler) if h is not None]

    # -- decisions: a settle takes one transport call at most, which each twin's
    # `_settle` makes with its own kind of call, between these two --------------------

    def _ending(self, item: Running[Any], error: BaseException | None) -> Settle:
        """The settle for a delivery whose handler returned (``error`` None) or raised."""
        return decide(error, item.attempt, self.retry)

    def _settle_call(
        self, item: Running[Any], settle: Settle, error: BaseException | None
    ) -> Call | None:
        """Stop keeping the lease to carry out ``settle``: the transport call to make, or
        None when there is none (the delivery is reported here: its lease was lost, or
        ``settle`` sends nothing)."""
        keeper = item._keeper
        if not keeper.release():
            self._report(item, "lost", error or lost_error(item))
            return None
        if settle.action == "none":
            self._report(item, settle.outcome, error)
            return None
        return settle.call(keeper.lease)

    def _settle_done(
        self,
        item: Running[Any],
        settle: Settle,
        error: BaseException | None,
        failed: TransportError | None,
    ) -> bool:
        """Report how ``settle``'s call went (``failed``: what it raised); True if the
        transport took it. LeaseLost means someone else settled the message; any other
        failure, that the lease lapses and the message comes back. Either way this
        delivery is over without our settle."""
        if failed is not None:
            self._report(item, "lost", failed)
            return False
        self._report(item, settle.outcome, error)
        return True

    def _report(self, item: Running[Any], outcome: Outcome, error: BaseException | None) -> None:
        self._hooks.settled(item._delivery, outcome, time.monotonic() - item.started, error)

    def _undecodable(self, exc: EventDecodeError) -> tuple[Delivery, Call]:
        """A message that no longer decodes is buried, by this call, and reported as a
        delivery (started now, then `_buried`)."""
        delivery = Delivery.of(exc.lease)
        self._hooks.started(delivery)
        return delivery, ("bury", (exc.lease, failure_reason(exc)))

    def _buried(
        self, delivery: Delivery, exc: EventDecodeError, failed: TransportError | None
    ) -> None:
        self._hooks.settled(delivery, "buried" if failed is None else "lost", 0.0, failed or exc)

    def _count_handed_back(self, handed: int) -> None:
        with self._handed_lock:
            self.handed_back += handed

    def _exit_code(self) -> int:
        return EXIT_HANDED_BACK if self.handed_back else EXIT_DRAINED

    def _signal_seen(self, name: str) -> None:
        """A third SIGTERM or SIGINT exits at once; the others are logged, then stop."""
        if self._requests >= 2:
            os._exit(EXIT_NOW)
        how = "draining" if self._requests == 0 else "cancelling running handlers"
        LOGGER.warning("%s: %s", name, how)
