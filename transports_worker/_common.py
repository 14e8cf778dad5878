"""What both workers share: their options and checks, the worker id, the handles they
open, and every decision: what a finished handler leads to (a `Decision`), and how a
delivery is settled and reported. A settle is one transport call (`Decision.send`, typed
for either twin), retried while it fails in passing (`SettleTries`): the decisions pick
its lease (`Runtime._settle_lease`) and take its outcome (`Runtime._settle_done`), and each
twin makes and retries the call with its own kind of call and pause.

With several slots and a transport that has the batch calls, the worker claims for all
its free slots in one ``claim_many`` and settles what its handlers decided in one
``settle_many``: `SettleQueue` decides when a batch of settles goes, and
`Runtime._settling_many` is each batch's decisions as steps that both twins drive. No I/O.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import socket
import threading
import time
import uuid
from asyncio import CancelledError
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, Literal, Protocol, TypeGuard, TypeVar

from transports_core import (
    Event,
    EventDecodeError,
    Lease,
    LeaseLost,
    OutcomeUnknown,
    Settlement,
    TransportError,
    redact_url,
)
from transports_core.backend import (
    check_count,
    check_priority,
    check_seconds,
    check_visibility,
    check_worker_id,
)

from ._context import Running
from ._hooks import Delivery, Fanout, Hooks, LoggingHooks
from ._keeper import retry_interval
from ._outcomes import (
    Bury,
    Cancelled,
    Outcome,
    Retry,
    RetryPolicy,
    failure_reason,
    storable_reason,
)

__all__ = [
    "EXIT_DRAINED",
    "EXIT_HANDED_BACK",
    "ClaimPause",
    "Decision",
    "Pending",
    "Runtime",
    "SettleQueue",
    "SettleTries",
    "batches",
    "check_handler",
    "check_source",
    "check_twin",
    "decide",
    "default_worker_id",
    "escapes",
    "is_async_handler",
    "not_awaitable",
    "not_awaited",
]

E = TypeVar("E")
S = TypeVar("S")  # the transport twin a worker drives
H = TypeVar("H")  # the handler it calls
R_co = TypeVar("R_co", covariant=True)  # what a settling call returns: None, or an awaitable
R = TypeVar("R")
W = TypeVar("W")  # what ends a delivery once its batch of settles is done, in either twin
LOGGER: Final = logging.getLogger("transports_worker")
EXIT_DRAINED: Final = 0
# EX_TEMPFAIL from sysexits.h: stopped before its work was done; that work is not lost.
EXIT_HANDED_BACK: Final = 75
EXIT_NOW: Final = 130
# What stops a worker that handles signals: the first drains, the second hands back.
SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
OWN_WAIT: Final = 10.0  # the longest a claim on a handle of the worker's own waits
# A failed claim is tried again after the first pause, doubling up to the second: at most a
# second, so that claiming resumes within a second of a server coming back.
CLAIM_PAUSES: Final = (0.1, 1.0)
# How long a settle may wait for others to share its ``settle_many``, unless every delivery
# the worker holds is waiting already. Its lease is still renewed meanwhile.
SETTLE_WINDOW: Final = 0.003


class Settles(Protocol[R_co]):
    """The settling calls of either twin: ``R_co`` is None for a `Transport`, a coroutine
    for an `AsyncTransport`."""

    def ack(self, lease: Lease[object]) -> R_co: ...

    def nack(self, lease: Lease[object], delay: float = 0) -> R_co: ...

    def bury(self, lease: Lease[object], reason: str) -> R_co: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a lease once its handler has ended: the transport call to make
    (``action``; "none" makes none) and the outcome to report once it is made."""

    action: Literal["ack", "nack", "bury", "none"]
    outcome: Outcome
    delay: float = 0.0
    reason: str = ""

    def send(self, transport: Settles[R], lease: Lease[Any]) -> R:
        """Make the call on ``transport``: a sync twin's returns None, an async twin's
        returns the coroutine to await."""
        action = self.action
        if action == "ack":
            return transport.ack(lease)
        if action == "nack":
            return transport.nack(lease, self.delay)
        if action == "bury":
            return transport.bury(lease, self.reason)
        raise ValueError(f"{self!r} makes no transport call")

    def settlement(self, lease: Lease[Any]) -> Settlement[Any]:
        """The call as one item of ``settle_many``."""
        action = self.action
        if action == "none":
            raise ValueError(f"{self!r} makes no transport call")
        return Settlement(lease, action, self.delay, self.reason)


ACK: Final = Decision("ack", "acked")
# The handler acked inside its own transaction (``ctx.ack_within``) and returned.
ACKED_WITHIN: Final = Decision("none", "acked")
HAND_BACK: Final = Decision("nack", "handed_back")
LOST: Final = Decision("none", "lost")


def escapes(error: BaseException | None) -> TypeGuard[BaseException]:
    """Whether a handler's ``error`` ends the run rather than the delivery (see
    `Runtime._escape`): a `BaseException` that is no `Exception` (`SystemExit`,
    `KeyboardInterrupt`, `GeneratorExit`, one of the application's own), except asyncio's
    `CancelledError`, which is a failure or the worker's own cancellation."""
    return error is not None and not isinstance(error, (Exception, CancelledError))


def decide(error: BaseException | None, attempt: int, policy: RetryPolicy) -> Decision:
    """The decision that a handler's return (``error`` None) or exception leads to."""
    if error is None:
        return ACK
    if isinstance(error, Retry):
        return Decision("nack", "retried", delay=error.delay)
    if isinstance(error, Bury):
        return Decision("bury", "buried", reason=storable_reason(error.reason))
    if isinstance(error, (LeaseLost, Cancelled)):
        return LOST
    if policy.is_final(error, attempt):
        return Decision("bury", "buried", reason=failure_reason(error))
    return Decision("nack", "failed", delay=policy.backoff(attempt))


class SettleTries:
    """A settle's call tried again while it fails in passing (a `TransportError` other
    than `LeaseLost`), until trying once more would end past ``deadline``, the lease's
    deadline on the keeper's clock: after that another worker may hold the message.

    A call that raised `OutcomeUnknown` may have been made: if a later try raises
    `LeaseLost`, the first one took effect, and the settle counts as made."""

    __slots__ = ("_deadline", "_pause", "_unknown", "failed")

    def __init__(self, deadline: float, pause: float) -> None:
        self._deadline = deadline
        self._pause = pause
        self._unknown = False
        self.failed: TransportError | None = None  # once done: why the settle was not made

    def again(self, failed: TransportError) -> float | None:
        """After a try raised ``failed``: the pause before the next, or None when done
        (with ``failed`` set, or None when the settle counts as made)."""
        if isinstance(failed, LeaseLost):
            self.failed = None if self._unknown else failed
            return None
        self._unknown = self._unknown or isinstance(failed, OutcomeUnknown)
        if time.monotonic() + self._pause >= self._deadline:
            self.failed = failed
            return None
        LOGGER.debug("a settle failed, retrying: %s", failed)
        return self._pause


def batches(handle: object) -> bool:
    """Whether ``handle`` has the batch calls: a transport written against the protocol
    before them has not, and is driven one call at a time."""
    return callable(getattr(handle, "claim_many", None)) and callable(
        getattr(handle, "settle_many", None)
    )


@dataclass(eq=False, slots=True)
class Pending(Generic[W]):
    """A delivery whose handler has ended, waiting in the `SettleQueue`: its decision,
    and what ends the delivery once its batch is done (``then``: the twin's)."""

    item: Running[Any]
    decision: Decision
    error: BaseException | None
    then: W


class SettleQueue(Generic[W]):
    """The settles waiting to share one ``settle_many``, and when they go (`due`): at
    once when every delivery the worker holds is waiting here (no handler is left that
    could join them), else ``window`` seconds after the first came. A slot is not free
    again until its settle goes out, so the queue never holds more than the worker's
    concurrency, and its lease keeper renews the lease until the batch is sent. No lock
    and no I/O: each twin guards and drives it."""

    __slots__ = ("_pending", "_since", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._pending: list[Pending[W]] = []
        self._since = 0.0

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, pending: Pending[W], held: int) -> bool:
        """Queue ``pending`` while the worker holds ``held`` deliveries; True if the
        sender must be woken (the queue was empty, or it is due now)."""
        queue = self._pending
        queue.append(pending)
        if len(queue) == 1:
            self._since = time.monotonic()
            return True
        return len(queue) >= held

    def due(self, held: int) -> float | None:
        """When to send the queue (monotonic; 0.0 is at once) while the worker holds
        ``held`` deliveries; None while it is empty."""
        queue = self._pending
        if not queue:
            return None
        if len(queue) >= held:
            return 0.0
        return self._since + self.window

    def take(self) -> list[Pending[W]]:
        taken, self._pending = self._pending, []
        return taken


# A step of a batch of settles: the items of a ``settle_many`` to make, or seconds to pause.
BatchStep = list[Settlement[Any]] | float
# What the twin sends back: the call's stale leases, the error it raised, or None (a pause).
BatchReply = list[LeaseLost] | TransportError | None


def default_worker_id() -> str:
    """Host, process and a random suffix: unique, and readable in ``transports inspect``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _unwrapped(target: object) -> object:
    """``target`` behind its decorators (those that keep ``__wrapped__``, as
    `functools.wraps` does)."""
    try:
        return inspect.unwrap(target)  # type: ignore[arg-type]  # any object unwraps
    except ValueError:  # a cycle of __wrapped__
        return target


def is_async_handler(handler: object) -> bool:
    """Whether ``handler`` is an async function (or an object whose ``__call__`` is one),
    also behind decorators that keep ``__wrapped__``: a plain wrapper of an ``async def``
    returns a coroutine, which only `AsyncWorker` awaits."""
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    return any(
        inspect.iscoroutinefunction(_unwrapped(target))
        for target in (handler, call)
        if target is not None
    )


def check_handler(handler: object, *, asynchronous: bool) -> None:
    """A handler is called as ``handler(event, ctx)``; for `Worker` it must not be an
    async function (`is_async_handler`). `AsyncWorker` takes any callable that returns
    an awaitable, and refuses only a plain ``def`` that is no wrapper of an async one:
    it returns what no one can await (what it returns is checked at each call too)."""
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
    is_async = is_async_handler(handler)
    if asynchronous and not is_async and inspect.isfunction(_unwrapped(handler)):
        raise TypeError(f"handler {name} is not an async function: run it with Worker")
    if not asynchronous and is_async:
        raise TypeError(f"handler {name} is an async function: run it with AsyncWorker")


def check_twin(handle: object, *, asynchronous: bool) -> None:
    """Refuse the other twin's transport, by its public shape (both twins pass
    ``isinstance(handle, Transport)``): an `AsyncTransport`'s ``claim`` is a coroutine
    function and it is an async context manager only; a `Transport`'s is neither. A
    wrapper that shows neither (one that forwards with ``__getattr__``, say) is taken."""
    claim = getattr(handle, "claim", None)
    enters, aenters = hasattr(handle, "__enter__"), hasattr(handle, "__aenter__")
    if inspect.iscoroutinefunction(claim) or (aenters and not enters):
        if not asynchronous:
            raise TypeError(
                f"{handle!r} is an async transport: Worker needs a Transport "
                "(open_transport); run an async handler on it with AsyncWorker"
            )
    elif enters and not aenters and asynchronous:
        raise TypeError(
            f"{handle!r} is a sync transport: AsyncWorker needs an AsyncTransport "
            "(open_async_transport); run a sync handler on it with Worker"
        )


def check_source(source: object, *, asynchronous: bool) -> None:
    """A worker's source is a URL, a factory (checked once it has opened a handle), or
    a transport of the worker's own twin."""
    if isinstance(source, str) or callable(source):  # a transport is not callable
        return
    if not (hasattr(source, "claim") and hasattr(source, "extend")):
        raise TypeError(f"source must be a URL, a transport or a factory, got {source!r}")
    check_twin(source, asynchronous=asynchronous)


def not_awaited(handler: object, returned: object) -> TypeError:
    """The failure of a `Worker`'s handler that returned an awaitable: nobody would
    await it, so it is closed (a coroutine's body never runs) and the delivery fails."""
    if inspect.iscoroutine(returned):
        returned.close()
    name = getattr(handler, "__qualname__", repr(handler))
    return TypeError(
        f"handler {name} returned an awaitable ({type(returned).__name__}), which Worker "
        "does not await: run an async handler with AsyncWorker"
    )


def not_awaitable(handler: object, returned: object) -> TypeError:
    """The failure of an `AsyncWorker`'s handler that returned something it cannot await."""
    name = getattr(handler, "__qualname__", repr(handler))
    return TypeError(
        f"handler {name} returned {type(returned).__name__}, not an awaitable: it is not "
        "an async function; run it with Worker"
    )


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


class ClaimPause:
    """The pause before a failed claim is tried again: doubling, up to `CLAIM_PAUSES`'s
    cap."""

    def __init__(self) -> None:
        self.delay = CLAIM_PAUSES[0]

    def failed(self, exc: BaseException) -> float:
        delay = self.delay
        LOGGER.warning("claim failed, retrying in %.1fs: %s", delay, exc)
        self.delay = min(delay * 2, CLAIM_PAUSES[1])
        return delay

    def reset(self) -> None:
        self.delay = CLAIM_PAUSES[0]


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
        batch: bool = True,
    ) -> None:
        # Each option is refused with an error naming it before anything runs.
        self.concurrency = check_count(concurrency, "concurrency")
        self.visibility = check_visibility(visibility)
        self.timeout = None if timeout is None else check_seconds(timeout, "timeout")
        self.grace = check_seconds(grace, "grace", zero=True)
        self.min_priority = check_priority(min_priority, "min_priority")
        if worker_id is not None:
            check_worker_id(worker_id)
        self.worker_id = default_worker_id() if worker_id is None else worker_id
        self.retry = RetryPolicy() if retry is None else retry
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")
        check_handler(handler, asynchronous=self.asynchronous)
        check_source(source, asynchronous=self.asynchronous)
        self._source = source
        self._handler = handler
        self._event_type: object = Event if event_type is None else event_type
        self._hooks = Fanout((LoggingHooks(),) if hooks is None else hooks)
        self._handle_signals = handle_signals
        if not isinstance(batch, bool):
            raise TypeError(f"batch must be True or False, got {batch!r}")
        self.batch = batch
        # Whether the worker claims and settles in batches: decided once its handles are
        # open (see `_open_all`), with the handle that settles batches.
        self._batched = False
        self._batcher: S | None = None
        self._free = self.concurrency  # slots without a delivery (batches only)
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

    def _stop_claiming(self) -> None:
        """Stop claiming and wake the supervisor, which drains as after a first `stop`
        (the twin's: ``_stopping`` is set already)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        source = redact_url(self._source) if isinstance(self._source, str) else self._source
        name = type(self).__name__
        batches = "" if self.batch else ", no batches"
        return f"<{name} {self.worker_id!r} on {source!r}, concurrency {self.concurrency}{batches}>"

    @classmethod
    def check_handler(cls, handler: object) -> None:
        """Raise `TypeError` if this worker cannot run ``handler``: not callable, not
        taking ``(event, ctx)``, or of the other kind (an async function, also behind a
        decorator that keeps ``__wrapped__``, is for `AsyncWorker` alone). Opens nothing."""
        check_handler(handler, asynchronous=cls.asynchronous)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _begin(self) -> None:
        if self._started:
            raise RuntimeError(f"{self!r} has already run: make a new {type(self).__name__}")
        self._started = True
        if self._requests:  # stop() before run(): no claims at all
            self._stopping.set()

    def _open_all(self, open_url: Callable[..., S]) -> None:
        """Open the handles: from a URL or a factory, one claiming handle per slot, so
        that no claim queues behind another slot's, and one shared by the renewals and
        the settles made off a slot; a transport passed in is all of them, not closed."""
        source = self._source
        if isinstance(source, str):
            url = source

            def opener() -> S:
                return open_url(url, event_type=self._event_type)
        elif callable(source):  # a transport is not callable: a factory

            def opener() -> S:
                handle = source()
                # Before anything is claimed on it; the other twin's handle cannot be
                # closed here (an async one's close must be awaited on its loop).
                check_twin(handle, asynchronous=self.asynchronous)
                return handle
        else:  # a transport: `check_source` let nothing else through
            self._settler = source
            self._claimers = [source] * self.concurrency
            if self._batching(source):
                self._claimers, self._batcher = [source], source
            return
        self._settler = opener()
        self._owned = True
        self._claimers.append(opener())
        if self._batching(self._claimers[0]):
            # One handle claims for every slot, another settles the batches: so that a
            # batch of settles never waits behind a claim that blocks.
            self._batcher = opener()
            return
        for _ in range(self.concurrency - 1):
            self._claimers.append(opener())

    def _batching(self, handle: S) -> bool:
        """Decide whether to claim and settle in batches, on ``handle``'s kind: with
        several slots, unless turned off or the transport has no batch calls."""
        self._batched = self.batch and self.concurrency > 1 and batches(handle)
        return self._batched

    def _owned_handles(self) -> list[S]:
        if not self._owned:
            return []
        return [h for h in (*self._claimers, self._batcher, self._settler) if h is not None]

    # -- decisions: a settle is one transport call, which each twin's `_settle` makes
    # (and retries, see `SettleTries`) with its own kind of call, between these two ------

    def _ending(self, item: Running[Any], error: BaseException | None) -> Decision:
        """The decision for a delivery whose handler returned (``error`` None) or raised."""
        if error is None and item._acked_within:
            return ACKED_WITHIN
        return decide(error, item.attempt, self.retry)

    def _settle_lease(
        self, item: Running[Any], decision: Decision, error: BaseException | None
    ) -> Lease[Any] | None:
        """Stop keeping the lease to carry out ``decision``: the lease to settle, or None
        when there is no call to make (the delivery is reported here: its lease was lost,
        or ``decision`` makes no call)."""
        keeper = item._keeper
        # After an ack inside the handler's transaction the lease is no longer kept: that
        # transaction's locks keep the message, and the settle's call finds out the rest.
        if not keeper.release() and not item._acked_within:
            self._report(item, "lost", error or lost_error(item))
            return None
        if decision.action == "none":
            self._report(item, decision.outcome, error)
            return None
        return keeper.lease

    def _tries(self, item: Running[Any]) -> SettleTries:
        """The retries of a settle that failed in passing, up to the lease's deadline."""
        return SettleTries(item._keeper.deadline, retry_interval(self.visibility))

    def _settle_done(
        self,
        item: Running[Any],
        decision: Decision,
        error: BaseException | None,
        failed: TransportError | None,
    ) -> bool:
        """Report how ``decision``'s call went (``failed``: why it was not made); True if
        the transport took it. LeaseLost means someone else settled the message; any other
        failure, that the lease lapses and the message comes back. Either way this
        delivery is over without our settle. After ``ctx.ack_within``, LeaseLost means the
        handler's transaction committed its ack: the delivery was acked after all."""
        if isinstance(failed, LeaseLost) and item._acked_within:
            self._report(item, "acked", error)
            return False
        if failed is not None:
            self._report(item, "lost", failed)
            return False
        self._report(item, decision.outcome, error)
        return True

    def _settling_many(self, batch: list[Pending[Any]]) -> Generator[BatchStep, BatchReply, None]:
        """The decisions of one batch of settles, as steps that each twin drives: a list
        of `Settlement` is a ``settle_many`` to make (the twin sends back its stale
        leases, or the `TransportError` it raised), a float a pause. Each delivery ends as
        its own settle would: its lease is taken from the keeper only now (the keeper
        renewed it while it waited), a stale lease is reported as a single call's
        `LeaseLost` is, and a call that fails in passing is made again for the items
        whose deadline allows (`SettleTries`, one per item, so that `OutcomeUnknown`
        then `LeaseLost` counts as made for each)."""
        sending: list[tuple[Pending[Any], Settlement[Any], SettleTries]] = []
        for pending in batch:
            lease = self._settle_lease(pending.item, pending.decision, pending.error)
            if lease is not None:
                item = (pending, pending.decision.settlement(lease), self._tries(pending.item))
                sending.append(item)
        while sending:
            reply = yield [settlement for _, settlement, _ in sending]
            if isinstance(reply, TransportError):
                pause: float | None = None
                left = []
                for entry in sending:
                    pending, _, tries = entry
                    wait = tries.again(reply)
                    if wait is None:
                        self._pending_done(pending, tries.failed)
                    else:
                        left.append(entry)
                        pause = wait
                sending = left
                if pause is not None:
                    yield pause
                continue
            stale = {lost.lease.seq: lost for lost in reply or ()}
            for pending, settlement, tries in sending:
                failed: TransportError | None = None
                lost = stale.get(settlement.lease.seq)
                if lost is not None:
                    tries.again(lost)
                    failed = tries.failed
                self._pending_done(pending, failed)
            return

    def _pending_done(self, pending: Pending[Any], failed: TransportError | None) -> None:
        self._settle_done(pending.item, pending.decision, pending.error, failed)

    def _report(self, item: Running[Any], outcome: Outcome, error: BaseException | None) -> None:
        self._hooks.settled(item._delivery, outcome, time.monotonic() - item.started, error)

    def _undecodable(self, exc: EventDecodeError) -> tuple[Delivery, Decision]:
        """A message that no longer decodes is buried, by this decision, and reported as
        a delivery (started now, then `_buried`)."""
        delivery = Delivery.of(exc.lease)
        self._hooks.started(delivery)
        return delivery, Decision("bury", "buried", reason=failure_reason(exc))

    @staticmethod
    def _undecoded(exc: EventDecodeError) -> tuple[list[EventDecodeError], list[Lease[Any]]]:
        """A ``claim_many``'s `EventDecodeError`, split: the error of every message of the
        batch that does not decode (each buried alone, see `_undecodable`), and the
        leases that did decode, to deliver."""
        raw = {error.lease.seq for error in exc.undecodable}
        return [exc, *exc.undecodable], [lease for lease in exc.others if lease.seq not in raw]

    def _buried(
        self, delivery: Delivery, exc: EventDecodeError, failed: TransportError | None
    ) -> None:
        self._hooks.settled(delivery, "buried" if failed is None else "lost", 0.0, failed or exc)

    def _escape(self, error: BaseException) -> None:
        """A handler raised ``error``, which `escapes`: its lease is handed back (by the
        twin, as at shutdown), the worker stops claiming and drains the other handlers
        as after a first `stop` (without counting as one), and `run` raises the first
        such error, the object itself, once every delivery is settled and the handles
        closed. A KeyboardInterrupt or SystemExit meant to end the process so ends it,
        without leaving a lease to lapse."""
        if self._fatal is None:
            self._fatal = error
        self._stopping.set()
        self._stop_claiming()

    def _count_handed_back(self, handed: int) -> None:
        with self._handed_lock:
            self.handed_back += handed

    def _exit_code(self) -> int:
        return EXIT_HANDED_BACK if self.handed_back else EXIT_DRAINED

    def _handles_signals(self) -> bool:
        """Whether this run handles `SIGNALS`: asked to, and on the main thread, the one
        where Python runs signal handlers."""
        return self._handle_signals and threading.current_thread() is threading.main_thread()

    def _signal_seen(self, name: str) -> None:
        """Called once a SIGTERM or SIGINT has been counted as a stop: a third exits at
        once, the others are logged. Counted first, then logged: the sync twin's handler
        can be entered again by a signal that arrives while it runs, and it must then
        log what that signal does."""
        if self._requests > 2:
            os._exit(EXIT_NOW)
        how = "draining" if self._requests == 1 else "cancelling running handlers"
        LOGGER.warning("%s: %s", name, how)
