"""The context a handler receives with its event: the current lease, the attempt, the
worker, a logger, the two ways a sync handler learns it must stop (`Context.check`,
`Context.sleep`), and `Context.ack_within`, which acks inside the handler's own database
transaction. `AsyncContext` is its twin for async handlers, whose task is cancelled
instead. Imports no backend: the delivery's transport is handed in by the worker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from transports_core import Lease
from transports_core.backend import cannot_join

from ._hooks import Delivery
from ._keeper import AsyncLeaseKeeper, LeaseKeeper, Signal
from ._outcomes import Cancelled

__all__ = ["AsyncContext", "Context", "Running"]

E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)
HANDLER_LOG = logging.getLogger("transports_worker.handler")


# LoggerAdapter takes its type argument at run time only from Python 3.11; we support 3.10.
if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter


class DeliveryLog(_Adapter):
    """Prefixes each message with the delivery's group, seq and attempt, and puts them in
    the record's ``extra`` too (``group_id``, ``seq``, ``attempt``)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[{extra['group_id']} #{extra['seq']} attempt {extra['attempt']}] {msg}", kwargs


class _Keeper(Protocol[E_co]):
    """What a context reads of its delivery's lease keeper (either twin's)."""

    @property
    def lease(self) -> Lease[E_co]: ...

    @property
    def lost(self) -> bool: ...

    @property
    def deadline(self) -> float: ...

    def check(self) -> None: ...

    def release(self) -> bool: ...


class _AcksInside(Protocol):
    """The part of ``transport.within(conn)`` a sync context uses."""

    def ack(self, lease: Lease[object]) -> None: ...


class _AsyncAcksInside(Protocol):
    """The part of ``transport.within(conn)`` an async context uses."""

    async def ack(self, lease: Lease[object]) -> None: ...


def _within(transport: object, conn: object) -> Any:
    """``transport.within(conn)``; a transport without ``within`` cannot join ``conn``'s
    transaction and is refused as the library's own transports refuse it."""
    within = getattr(transport, "within", None)
    if within is None:
        raise cannot_join(transport)
    return within(conn)


class Running(Generic[E]):
    """What both contexts share, and what the worker keeps of a delivery in flight: its
    lease keeper, hooks' view (``_delivery``), start, the transport it settles on, and the
    one right to settle it (`_take`), which the handler's end, its timeout and shutdown's
    hand-back race for. ``_acked_within`` turns true once the handler acked inside its own
    transaction (`Context.ack_within`). (One object for both roles: a worker makes one per
    delivery.)"""

    # Slotted, as a worker makes one per delivery; "__dict__" keeps `logger` cached and
    # lets a handler's middleware hang its own attributes on the context.
    __slots__ = (
        "__dict__",
        "_acked_within",
        "_cancelled",
        "_delivery",
        "_first",
        "_keeper",
        "_once",
        "_stopping",
        "_transport",
        "attempt",
        "started",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        keeper: _Keeper[E],
        stopping: threading.Event,
        delivery: Delivery,
        transport: object,
    ) -> None:
        self.worker_id = worker_id
        self._keeper = keeper
        self._transport = transport
        self._acked_within = False
        self._stopping = stopping
        self._delivery = delivery
        self._cancelled: Cancelled | None = None
        self._first = first = keeper.lease
        self.attempt = first.attempt
        self.started = time.monotonic()
        # Held by whoever settles (or gives up on) the lease: a latch, never released.
        self._once = threading.Lock()

    def _take(self) -> bool:
        """Claim the one right to settle this delivery."""
        return self._once.acquire(False)

    @property
    def _taken(self) -> bool:
        return self._once.locked()

    @functools.cached_property
    def logger(self) -> DeliveryLog:
        """A logger whose lines name the delivery (made on first use: most handlers log
        through their own)."""
        lease = self._first
        return DeliveryLog(
            HANDLER_LOG,
            {"group_id": lease.group_id, "seq": lease.seq, "attempt": lease.attempt},
        )

    @property
    def stopping(self) -> bool:
        """True once the worker is shutting down: a long handler may choose to finish
        early (returning or raising `Retry`) instead of using up the grace period."""
        return self._stopping.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled is not None

    @property
    def lease(self) -> Lease[E]:
        return self._keeper.lease

    @property
    def lost(self) -> bool:
        return self._keeper.lost

    def check(self) -> None:
        """Raise `Cancelled` or `LeaseLost` if the handler must stop now."""
        if self._cancelled is not None:
            raise self._cancelled
        self._keeper.check()

    def cancel(self, why: Cancelled) -> None:
        self._cancelled = why

    def _acked(self) -> None:
        """The handler's ack ran inside its transaction: from now on that transaction
        holds the store's locks on the message, so the lease is no longer renewed (a
        renewal from another connection would wait for them), and the runtime does not
        ack again."""
        self._acked_within = True
        self._keeper.release()


class Context(Running[E]):
    """What a sync handler gets beside its event.

    ``lease`` is kept current as the lease keeper renews it. `check` and `sleep` raise
    `LeaseLost` once the lease is lost and `Cancelled` once the worker stops waiting (the
    ``timeout``, or shutdown's ``grace``): Python cannot stop a thread, so a long handler
    should call one of them between steps. Nothing is settled after either is raised.
    """

    __slots__ = ("_interrupt", "_sync_keeper")

    def __init__(
        self,
        worker_id: str,
        keeper: LeaseKeeper[E],
        stopping: threading.Event,
        delivery: Delivery,
        interrupt: Signal,
        transport: object,
    ) -> None:
        super().__init__(worker_id, keeper, stopping, delivery, transport)
        self._sync_keeper = keeper
        # Set once the handler must stop: the worker sets it when the lease is lost.
        self._interrupt = interrupt

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake and raise as `check` does as soon as the handler must stop."""
        end = time.monotonic() + seconds
        while True:
            self.check()
            left = end - time.monotonic()
            if left <= 0:
                return
            # The lease's deadline is local: wake for it even if no renewal reports it.
            deadline = self._sync_keeper.deadline
            self._interrupt.wait(min(left, max(deadline - time.monotonic(), 0)))

    def ack_within(self, conn: object) -> None:
        """Ack this delivery inside ``conn``'s open transaction, the handler's own: its
        writes and the ack then commit (or roll back) together. The worker does not ack
        again when the handler returns, and stops renewing the lease at once: commit
        promptly. Raises what `check` raises, and what ``transport.within(conn).ack``
        does: `LeaseLost` if the lease is no longer current, a `TransportError` from a
        transport that cannot join ``conn``'s transaction, ``TypeError``/``ValueError``
        for a connection it does not take."""
        self.check()
        view: _AcksInside = _within(self._transport, conn)
        view.ack(self._keeper.lease)
        self._acked()

    def cancel(self, why: Cancelled) -> None:
        super().cancel(why)
        self._interrupt.set()


class AsyncContext(Running[E]):
    """What an async handler gets beside its event. Its task is cancelled at once when the
    lease is lost or the worker stops waiting, so `check` is only needed around code that
    catches `asyncio.CancelledError`."""

    __slots__ = ("_task",)

    def __init__(
        self,
        worker_id: str,
        keeper: AsyncLeaseKeeper[E],
        stopping: threading.Event,
        delivery: Delivery,
        transport: object,
    ) -> None:
        super().__init__(worker_id, keeper, stopping, delivery, transport)
        self._task: asyncio.Task[object] | None = None  # the handler's, once started

    async def sleep(self, seconds: float) -> None:
        self.check()
        await asyncio.sleep(seconds)
        self.check()

    async def ack_within(self, conn: object) -> None:
        """`Context.ack_within` for an async connection of the store (``await`` it)."""
        self.check()
        view: _AsyncAcksInside = _within(self._transport, conn)
        await view.ack(self._keeper.lease)
        self._acked()
