"""What every backend's transport class would otherwise write again: the one-line public
methods that hand an operation to the backend's runner, and the context-manager pair.

A backend builds its operations in one module (``_ops``) that offers the builder names of
`Operations`, each returning an `Operation` of the call's value type, and runs them with
one method of its own, ``_run(op)``. `TransportBase` (sync) and `AsyncTransportBase`
(async) then implement every method of `Transport` and `TransportAdmin` except ``claim``
and ``close``, which wait and release in each backend's own way. Each method is one call
of a builder and one of ``_run``, so the hot path (publish, ack) costs no more than a
method written out in the backend.

`Settle` is the common part of the operations on a held lease (ack, nack, extend, bury).

Imports only ``_models``, ``_admin``, ``_codec``, ``_errors`` and ``_validate``; knows
nothing of any backend.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable
from operator import is_
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from ._admin import DeadLetter, GroupInfo, HeldGroup, QueuedMessage, QueueStats, TenantInfo
from ._batch import settle_op
from ._codec import Claimed, EventCodec, Item
from ._errors import EventDecodeError, LeaseLost, LostReason, TransportError
from ._models import Lease, Message, Settlement
from ._seam import GiveBack, Operation
from ._validate import (
    DEDUP_WINDOW,
    check_count,
    check_group_id,
    check_lease,
    check_limit,
    check_priority,
    check_seq,
    check_tenant,
    check_visibility,
    check_wait,
    check_weight,
    check_worker_id,
    no_options,
)

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

__all__ = [
    "AsyncClosing",
    "AsyncTransportBase",
    "Closing",
    "Operations",
    "Claiming",
    "ReuseLast",
    "Settle",
    "TransportBase",
]

E = TypeVar("E")
T = TypeVar("T")
P = ParamSpec("P")


class Claiming(Operation[Any, Any, T]):
    """The root of a claim's operation: ``worker_id``, ``visibility`` and ``min_priority``
    checked when it is built (so a worker's bad arguments never reach the store, and a
    kept operation, see `ReuseLast`, is checked once), and the transport's dead-letter
    policy, ``max_attempts`` and ``on_dead``, for a head that is out of deliveries.

    A backend's claim subclasses it next to its own root type, as `Settle`."""

    __slots__ = ("max_attempts", "min_priority", "on_dead", "visibility", "worker_id")

    def __init__(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int,
        max_attempts: int | None = None,
        on_dead: str = "release",
    ) -> None:
        self.worker_id = check_worker_id(worker_id)
        self.visibility = check_visibility(visibility)
        self.min_priority = check_priority(min_priority, "min_priority")
        self.max_attempts = max_attempts
        self.on_dead = on_dead


class Settle(Operation[Any, Any, T]):
    """An operation on a held lease (ack, nack, extend, bury): it checks ``lease`` when
    built (`check_lease`), and its reply says whether the lease was still current.

    A backend's settling operations subclass it next to their own root type. Its one
    slot is ``lease``; a subclass adds its own (it may only add them: one base of a
    slotted class may have slots)."""

    __slots__ = ("lease",)
    lease: Lease[Any]

    def __init__(self, lease: Lease[Any]) -> None:
        self.lease = check_lease(lease)

    def held(self, current: bool) -> None:
        """Raise `LeaseLost` unless ``current``: the store matched the fenced lease (it
        changed one row, say). When it did not, the lease lapsed and the message was
        claimed again, or it was settled already."""
        if not current:
            raise LeaseLost(self.lease)

    def renewed(self, expires_at: float) -> Lease[Any]:
        """The lease, its expiry moved to ``expires_at`` (what extend returns)."""
        old = self.lease
        return Lease(old.seq, old.group_id, old.event, old.worker_id, old.attempt, expires_at)


class Operations(Protocol):
    """The builders a backend's operations module offers, by the same names in every
    backend, each checking its arguments as it builds (so bad input never reaches the
    store) and returning the `Operation` that the transport method of the same name runs.

    A backend passes its module itself: ``_ops = _ops`` in its transport classes.
    """

    def Publish(
        self,
        codec: EventCodec[Any],
        group_id: str,
        event: object,
        priority: int,
        /,
    ) -> Operation[Any, Any, int]: ...

    def PublishWith(self, item: Item, window: float, /) -> Operation[Any, Any, int]:
        """A publish with any of a key, a delay or a tenant: ``item`` is checked and
        encoded already (see `EventCodec.encode_item`); ``window`` is the queue's
        ``dedup_window``."""
        ...

    def PublishMany(
        self,
        codec: EventCodec[Any],
        items: Iterable[tuple[str, Any, int] | Message[Any]],
        window: float,
        /,
    ) -> Operation[Any, Any, list[int]]: ...

    def Ack(self, lease: Lease[Any], /) -> Operation[Any, Any, None]: ...

    def Nack(self, lease: Lease[Any], delay: float, /) -> Operation[Any, Any, None]: ...

    def Extend(self, lease: Lease[T], visibility: float, /) -> Operation[Any, Any, Lease[T]]: ...

    def BuryLease(
        self, lease: Lease[Any], reason: str, on_dead: str, /
    ) -> Operation[Any, Any, None]: ...

    def Stats(self) -> Operation[Any, Any, QueueStats]: ...

    def Groups(self, limit: int, /) -> Operation[Any, Any, list[GroupInfo]]: ...

    def DeadLetters(self, limit: int | None, /) -> Operation[Any, Any, list[DeadLetter]]: ...

    def HeldGroups(self) -> Operation[Any, Any, list[HeldGroup]]: ...

    def Requeue(self, seq: int, /) -> Operation[Any, Any, bool]: ...

    def Discard(self, seq: int, /) -> Operation[Any, Any, bool]: ...

    def PurgeGroup(self, group_id: str, /) -> Operation[Any, Any, int]: ...

    # The builders below take arguments that core checked already.

    def Cancel(self, seq: int, /) -> Operation[Any, Any, bool]: ...

    def Pause(self, group_id: str, paused: bool, /) -> Operation[Any, Any, bool]:
        """``pause_group`` (``paused`` True) or ``resume_group``."""
        ...

    def PausedGroups(self) -> Operation[Any, Any, list[str]]: ...

    def Peek(self, group_id: str, limit: int, /) -> Operation[Any, Any, list[QueuedMessage]]: ...

    def SetTenantWeight(self, tenant: str, weight: int, /) -> Operation[Any, Any, None]: ...

    def Tenants(self) -> Operation[Any, Any, list[TenantInfo]]: ...

    # Batches of the operations above and of the transport's claim (see `_batch`), each
    # run in one transaction and, where the backend can, one round trip.

    # (Their arguments are operations this same module built: Any, as each backend's
    # own types of them are narrower than core's.)

    def ClaimMany(self, claim: Any, limit: int, /) -> Operation[Any, Any, list[Claimed]]: ...

    def SettleMany(self, settles: list[Any], /) -> Operation[Any, Any, list[LeaseLost]]: ...

    def AckAndClaim(self, ack: Any, claim: Any, /) -> Operation[Any, Any, Any]:
        """The ack, then the claim; the claim's value (a `Claimed` when it leased)."""
        ...


class ReuseLast(Generic[P, T]):
    """Calls ``build`` (an operation's class, say) and keeps what it returned while the
    next call passes the very same objects again.

    A worker claims with the same arguments every time, usually the very same objects
    (literals, or values set once), so a transport can keep the checked `Operation` of
    its last ``claim`` instead of building and checking it anew. Identity, not equality,
    so that no argument escapes its checks: ``True == 1``, but only the int is a
    priority. A call with keyword arguments is built anew and not kept. The last value is
    swapped in one assignment, so threads may share one; ``build`` must return values
    that are safe to share too (an operation that holds only its checked arguments).
    """

    __slots__ = ("_build", "_last")

    def __init__(self, build: Callable[P, T]) -> None:
        self._build = build
        self._last: tuple[tuple[object, ...], T] | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        last = self._last
        if kwargs:
            return self._build(*args, **kwargs)
        if last is not None and len(args) == len(last[0]) and all(map(is_, args, last[0])):
            return last[1]
        value = self._build(*args, **kwargs)
        self._last = (args, value)
        return value


class Closing:
    """``with obj:`` closes ``obj`` at the end: `__enter__` returns it, `__exit__` calls
    its ``close()``."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        self.close()


class AsyncClosing:
    """`Closing` for ``async with``: `__aexit__` awaits ``close()``."""

    __slots__ = ()

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        await self.close()


def publishing(
    ops: Operations,
    codec: EventCodec[E],
    group_id: str,
    event: E,
    priority: int,
    key: str | None,
    delay: float,
    hold: bool,
    tenant: str | None,
    window: float,
) -> Operation[Any, Any, int]:
    """A publish's operation: the backend's plain one, which costs what it did before
    keys, delays and tenants, unless one of them is given; then ``PublishWith``, the
    arguments checked here for every backend. The group id is checked here as one
    published to (`check_group_id`), whichever it is: a backend's ``Publish`` checks it
    as any group id."""
    if key is None and no_options(delay, hold, tenant):
        return ops.Publish(codec, check_group_id(group_id, publish=True), event, priority)
    return ops.PublishWith(
        codec.encode_item(group_id, event, priority, key, delay, hold, tenant), window
    )


def settles_of(
    ops: Operations, items: Iterable[Settlement[object]], on_dead: str
) -> list[Operation[Any, Any, None]]:
    """The single operations of ``settle_many``'s items, every one built and checked
    before any runs."""
    settles = []
    for item in items:
        if not isinstance(item, Settlement):
            raise TypeError(f"settle_many takes Settlement values, not {item!r}")
        settles.append(settle_op(ops, item, on_dead))
    return settles


def decoded(codec: EventCodec[E], claimed: list[Claimed], before: list[Lease[E]]) -> list[Lease[E]]:
    """``before`` and the leases of ``claimed``, their events decoded. One that does not
    decode raises its `EventDecodeError`, the others' leases on it as ``others``, so that
    none is left without a holder, and the errors of any other that did not decode as
    ``undecodable``."""
    leases, failed = list(before), None
    for one in claimed:
        try:
            leases.append(one.lease(codec))
        except EventDecodeError as error:
            failed = failed or error
            if failed is not error:
                failed.others.append(error.lease)
                failed.undecodable.append(error)
    if failed is not None:
        failed.others[:0] = leases
        raise failed
    return leases


def lost_reason(lease: Lease[Any], head: list[QueuedMessage]) -> LostReason:
    """Why ``lease`` is no longer current, from its group's ``head`` (what ``peek(group,
    1)`` shows just after): see `LeaseLost`. A dead letter that was requeued is back at
    its group's head with the deliveries it had, so a lease from before its burial is
    "released" (then "redelivered"), as after a nack."""
    first = head[0] if head else None
    if first is None or first.seq != lease.seq or first.attempts < lease.attempt:
        return "gone"
    if first.attempts > lease.attempt:
        return "redelivered"
    if first.state == "parked":
        return "parked"
    return "released" if first.state == "ready" else "foreign"


def with_reasons(
    lost: list[LeaseLost], heads: dict[str, list[QueuedMessage] | None]
) -> list[LeaseLost]:
    """``lost``, each given its reason from its group's head in ``heads`` (None: the
    look failed, and the reason stays unknown)."""
    for error in lost:
        head = heads[error.lease.group_id]
        if head is not None:
            error.reason = lost_reason(error.lease, head)
    return lost


def claim_args(limit: int, wait: float) -> tuple[int, float]:
    return check_count(limit, "limit"), check_wait(wait)


class Writes(Generic[E]):
    """The calls that write and may run inside a transaction: ``publish``,
    ``publish_many``, ``ack``, ``nack`` and ``bury``, over ``_run(op)``. `TransportBase`
    runs them in transactions of its own; `Within` in the caller's."""

    _ops: Operations
    _codec: EventCodec[E]
    _on_dead: str
    # How long the queue remembers an idempotency key: its `dedup_window` option.
    _dedup_window: float = DEDUP_WINDOW

    def _run(self, op: Operation[Any, Any, T]) -> T:
        """Run ``op`` and return its value."""
        raise NotImplementedError

    def publish(
        self,
        group_id: str,
        event: E,
        priority: int = 0,
        *,
        key: str | None = None,
        delay: float = 0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        return self._run(
            publishing(
                self._ops,
                self._codec,
                group_id,
                event,
                priority,
                key,
                delay,
                hold,
                tenant,
                self._dedup_window,
            )
        )

    def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]:
        return self._run(self._ops.PublishMany(self._codec, items, self._dedup_window))

    def ack(self, lease: Lease[object]) -> None:
        self._settle(self._ops.Ack(lease))

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._settle(self._ops.Nack(lease, delay))

    def bury(self, lease: Lease[object], reason: str) -> None:
        self._settle(self._ops.BuryLease(lease, reason, self._on_dead))

    def settle_many(self, items: Iterable[Settlement[object]]) -> list[LeaseLost]:
        settles = settles_of(self._ops, items, self._on_dead)
        return self._explained(self._run(self._ops.SettleMany(settles))) if settles else []

    def ack_many(self, leases: Iterable[Lease[object]]) -> list[LeaseLost]:
        acks = [self._ops.Ack(lease) for lease in leases]
        return self._explained(self._run(self._ops.SettleMany(acks))) if acks else []

    def _settle(self, op: Operation[Any, Any, T]) -> T:
        """``op``'s value; a `LeaseLost` it raises is raised with its reason."""
        try:
            return self._run(op)
        except LeaseLost as lost:
            self._explained([lost])
            raise

    def _explained(self, lost: list[LeaseLost]) -> list[LeaseLost]:
        """``lost``, each given its reason from its group's head as it is now: one look
        a group, made only when a lease is lost (`with_reasons`)."""
        groups = dict.fromkeys(error.lease.group_id for error in lost)
        return with_reasons(lost, {group: self._head(group) for group in groups})

    def _head(self, group_id: str) -> list[QueuedMessage] | None:
        """``peek(group_id, 1)``; None if it fails."""
        try:
            return self._run(self._ops.Peek(group_id, 1))
        except TransportError:
            return None


class Joined(Protocol):
    """What a backend's ``_join(conn)`` returns: runs an operation's statements on the
    caller's connection, inside the caller's open transaction, and never commits or
    rolls back."""

    def __call__(self, op: Operation[Any, Any, T], /) -> T: ...


class AsyncJoined(Protocol):
    """`Joined` for the async twin."""

    async def __call__(self, op: Operation[Any, Any, T], /) -> T: ...


class Within(Writes[E]):
    """A transport's writing calls run inside a transaction of the caller's, on the
    caller's connection (``transport.within(conn)``): ``publish``, ``publish_many``,
    ``ack``, ``nack`` and ``bury``, each exactly as on the transport, except that
    nothing is committed or rolled back. When the caller commits, they take effect
    together with the caller's own writes, and waiting claims are woken then; when it
    rolls back, nothing happened (a lease that was acked is still current). An ack on a
    lease that is no longer current raises `LeaseLost` at once, before the caller
    commits. Which connections and isolation levels a backend accepts is on its page."""

    __slots__ = ("_codec", "_dedup_window", "_joined", "_on_dead", "_ops")

    def __init__(
        self, ops: Operations, codec: EventCodec[E], on_dead: str, window: float, joined: Joined
    ) -> None:
        self._ops, self._codec, self._on_dead, self._joined = ops, codec, on_dead, joined
        self._dedup_window = window

    def _run(self, op: Operation[Any, Any, T]) -> T:
        return self._joined(op)


def cannot_join(transport: object) -> TransportError:
    """The error of a backend that cannot run its statements in a caller's transaction."""
    return TransportError(
        f"{transport!r} cannot join a transaction of yours: its store has no transactions "
        "that another connection can share; see the docs' 'Exactly once' page for the "
        "outbox pattern"
    )


class TransportBase(Writes[E], Closing):
    """A sync transport's public methods, over the backend's `Operations` and runner.

    A subclass sets ``_ops`` (its operations), ``_codec`` (the `EventCodec` of its
    event type) and ``_on_dead`` (its ``on_dead`` option), implements ``_run(op)``, which
    runs one `Operation` in a transaction of its own and returns its value, and writes
    ``claim`` and ``close``. It then satisfies `Transport` and `TransportAdmin`, whose
    docstrings are the contract. A backend whose store can run statements in a caller's
    transaction implements ``_join(conn)`` too (see `Within`); otherwise ``within``
    refuses with a `TransportError`.
    """

    def within(self, conn: object) -> Within[E]:
        """This transport's writing calls, inside ``conn``'s open transaction (`Within`)."""
        return Within(self._ops, self._codec, self._on_dead, self._dedup_window, self._join(conn))

    def _join(self, conn: object) -> Joined:
        """A runner of operations on ``conn`` (see `Joined`), after checking that ``conn``
        is a connection to this transport's store that its statements can run in."""
        raise cannot_join(self)

    def _claim_op(
        self, worker_id: str, visibility: float, min_priority: int
    ) -> Operation[Any, Any, Any]:
        """The checked operation of one ``claim`` that does not wait."""
        raise NotImplementedError

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        raise NotImplementedError

    def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[Lease[E]]:
        limit, wait = claim_args(limit, wait)
        claim = self._claim_op(worker_id, visibility, min_priority)
        leases = decoded(self._codec, self._run(self._ops.ClaimMany(claim, limit)), [])
        if leases or not wait:
            return leases
        first = self.claim(worker_id, visibility, min_priority, wait)
        if first is None or limit == 1:
            return [] if first is None else [first]
        try:
            rest = self._run(self._ops.ClaimMany(claim, limit - 1))
        except TransportError:
            return [first]  # not lost to a failed fill: the fault shows at the next call
        return decoded(self._codec, rest, [first])

    def ack_and_claim(
        self,
        lease: Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> Lease[E] | None:
        wait = check_wait(wait)
        op = self._ops.AckAndClaim(
            self._ops.Ack(lease), self._claim_op(worker_id, visibility, min_priority)
        )
        claimed = self._settle(op)
        if isinstance(claimed, Claimed):
            return claimed.lease(self._codec)
        return self.claim(worker_id, visibility, min_priority, wait) if wait else None

    def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return self._settle(self._ops.Extend(lease, visibility))

    def stats(self) -> QueueStats:
        return self._run(self._ops.Stats())

    def groups(self, limit: int = 10) -> list[GroupInfo]:
        return self._run(self._ops.Groups(limit))

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        return self._run(self._ops.DeadLetters(limit))

    def held_groups(self) -> list[HeldGroup]:
        return self._run(self._ops.HeldGroups())

    def requeue(self, seq: int) -> bool:
        return self._run(self._ops.Requeue(seq))

    def discard(self, seq: int) -> bool:
        return self._run(self._ops.Discard(seq))

    def purge_group(self, group_id: str) -> int:
        return self._run(self._ops.PurgeGroup(group_id))

    def cancel(self, seq: int) -> bool:
        return self._run(self._ops.Cancel(check_seq(seq)))

    def pause_group(self, group_id: str) -> bool:
        return self._run(self._ops.Pause(check_group_id(group_id), True))

    def resume_group(self, group_id: str) -> bool:
        return self._run(self._ops.Pause(check_group_id(group_id), False))

    def paused_groups(self) -> list[str]:
        return self._run(self._ops.PausedGroups())

    def peek(self, group_id: str, limit: int = 10) -> list[QueuedMessage]:
        return self._run(self._ops.Peek(check_group_id(group_id), check_limit(limit)))

    def set_tenant_weight(self, tenant: str, weight: int) -> None:
        self._run(self._ops.SetTenantWeight(check_tenant(tenant), check_weight(weight)))

    def tenants(self) -> list[TenantInfo]:
        return self._run(self._ops.Tenants())


class AsyncWrites(Generic[E]):
    """`Writes` as coroutines, over an awaitable ``_run(op)``."""

    _ops: Operations
    _codec: EventCodec[E]
    _on_dead: str
    # How long the queue remembers an idempotency key: its `dedup_window` option.
    _dedup_window: float = DEDUP_WINDOW

    async def _run(self, op: Operation[Any, Any, T]) -> T:
        """Run ``op`` and return its value."""
        raise NotImplementedError

    async def publish(
        self,
        group_id: str,
        event: E,
        priority: int = 0,
        *,
        key: str | None = None,
        delay: float = 0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        return await self._run(
            publishing(
                self._ops,
                self._codec,
                group_id,
                event,
                priority,
                key,
                delay,
                hold,
                tenant,
                self._dedup_window,
            )
        )

    async def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]:
        return await self._run(self._ops.PublishMany(self._codec, items, self._dedup_window))

    async def ack(self, lease: Lease[object]) -> None:
        await self._settle(self._run(self._ops.Ack(lease)))

    async def nack(self, lease: Lease[object], delay: float = 0) -> None:
        await self._settle(self._run(self._ops.Nack(lease, delay)))

    async def bury(self, lease: Lease[object], reason: str) -> None:
        await self._settle(self._run(self._ops.BuryLease(lease, reason, self._on_dead)))

    async def settle_many(self, items: Iterable[Settlement[object]]) -> list[LeaseLost]:
        settles = settles_of(self._ops, items, self._on_dead)
        if not settles:
            return []
        return await self._explained(await self._run(self._ops.SettleMany(settles)))

    async def ack_many(self, leases: Iterable[Lease[object]]) -> list[LeaseLost]:
        acks = [self._ops.Ack(lease) for lease in leases]
        return await self._explained(await self._run(self._ops.SettleMany(acks))) if acks else []

    async def _settle(self, call: Awaitable[T]) -> T:
        """`Writes._settle`, for the call that runs the operation (``_run``, or a
        guarded run of a claim's)."""
        try:
            return await call
        except LeaseLost as lost:
            await self._explained([lost])
            raise

    async def _explained(self, lost: list[LeaseLost]) -> list[LeaseLost]:
        """`Writes._explained`."""
        groups = dict.fromkeys(error.lease.group_id for error in lost)
        return with_reasons(lost, {group: await self._head(group) for group in groups})

    async def _head(self, group_id: str) -> list[QueuedMessage] | None:
        """`Writes._head`."""
        try:
            return await self._run(self._ops.Peek(group_id, 1))
        except TransportError:
            return None


class AsyncWithin(AsyncWrites[E]):
    """`Within` for the async twin: ``await transport.within(conn).ack(lease)``."""

    __slots__ = ("_codec", "_dedup_window", "_joined", "_on_dead", "_ops")

    def __init__(
        self,
        ops: Operations,
        codec: EventCodec[E],
        on_dead: str,
        window: float,
        joined: AsyncJoined,
    ) -> None:
        self._ops, self._codec, self._on_dead, self._joined = ops, codec, on_dead, joined
        self._dedup_window = window

    async def _run(self, op: Operation[Any, Any, T]) -> T:
        return await self._joined(op)


def _as_claimed(lease: Lease[Any]) -> Claimed:
    """What a give-back needs of ``lease``: its fence (the event is not read)."""
    return Claimed(lease.seq, lease.group_id, "", lease.worker_id, lease.attempt, lease.expires_at)


class AsyncTransportBase(AsyncWrites[E], AsyncClosing):
    """`TransportBase` for the async twin: the same methods as coroutines, over an
    awaitable ``_run(op)``; it then satisfies `AsyncTransport` and `AsyncTransportAdmin`.
    """

    def within(self, conn: object) -> AsyncWithin[E]:
        """This transport's writing calls, inside ``conn``'s open transaction."""
        return AsyncWithin(
            self._ops, self._codec, self._on_dead, self._dedup_window, self._join(conn)
        )

    def _join(self, conn: object) -> AsyncJoined:
        """`TransportBase._join` for the async twin's connections."""
        raise cannot_join(self)

    def _claim_op(
        self, worker_id: str, visibility: float, min_priority: int
    ) -> Operation[Any, Any, Any]:
        """The checked operation of one ``claim`` that does not wait."""
        raise NotImplementedError

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        raise NotImplementedError

    def _giving_back(self) -> GiveBack[Any]:
        """The backend's `GiveBack`, under which its own claims run: ``claim_many`` and
        ``ack_and_claim`` run under it too, so that what they leased is given back if the
        caller is cancelled meanwhile (its give-back takes a `Claimed`)."""
        raise NotImplementedError

    async def _leasing(self, op: Operation[Any, Any, T], *held: Lease[Any]) -> T:
        """``op``'s value, the `Claimed` in it given back (and those of ``held``, leases
        the call took before) if the caller is cancelled meanwhile."""

        def leased(value: T) -> list[Claimed]:
            items = value if isinstance(value, list) else [value]
            return [*map(_as_claimed, held), *(c for c in items if isinstance(c, Claimed))]

        return await self._giving_back().guard(self._run(op), leased)

    async def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[Lease[E]]:
        limit, wait = claim_args(limit, wait)
        claim = self._claim_op(worker_id, visibility, min_priority)
        leases = decoded(self._codec, await self._leasing(self._ops.ClaimMany(claim, limit)), [])
        if leases or not wait:
            return leases
        first = await self.claim(worker_id, visibility, min_priority, wait)
        if first is None or limit == 1:
            return [] if first is None else [first]
        try:
            rest = await self._leasing(self._ops.ClaimMany(claim, limit - 1), first)
        except TransportError:
            return [first]  # not lost to a failed fill: the fault shows at the next call
        return decoded(self._codec, rest, [first])

    async def ack_and_claim(
        self,
        lease: Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> Lease[E] | None:
        wait = check_wait(wait)
        op = self._ops.AckAndClaim(
            self._ops.Ack(lease), self._claim_op(worker_id, visibility, min_priority)
        )
        claimed = await self._settle(self._leasing(op))
        if isinstance(claimed, Claimed):
            return claimed.lease(self._codec)
        return await self.claim(worker_id, visibility, min_priority, wait) if wait else None

    async def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return await self._settle(self._run(self._ops.Extend(lease, visibility)))

    async def stats(self) -> QueueStats:
        return await self._run(self._ops.Stats())

    async def groups(self, limit: int = 10) -> list[GroupInfo]:
        return await self._run(self._ops.Groups(limit))

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        return await self._run(self._ops.DeadLetters(limit))

    async def held_groups(self) -> list[HeldGroup]:
        return await self._run(self._ops.HeldGroups())

    async def requeue(self, seq: int) -> bool:
        return await self._run(self._ops.Requeue(seq))

    async def discard(self, seq: int) -> bool:
        return await self._run(self._ops.Discard(seq))

    async def purge_group(self, group_id: str) -> int:
        return await self._run(self._ops.PurgeGroup(group_id))

    async def cancel(self, seq: int) -> bool:
        return await self._run(self._ops.Cancel(check_seq(seq)))

    async def pause_group(self, group_id: str) -> bool:
        return await self._run(self._ops.Pause(check_group_id(group_id), True))

    async def resume_group(self, group_id: str) -> bool:
        return await self._run(self._ops.Pause(check_group_id(group_id), False))

    async def paused_groups(self) -> list[str]:
        return await self._run(self._ops.PausedGroups())

    async def peek(self, group_id: str, limit: int = 10) -> list[QueuedMessage]:
        return await self._run(self._ops.Peek(check_group_id(group_id), check_limit(limit)))

    async def set_tenant_weight(self, tenant: str, weight: int) -> None:
        await self._run(self._ops.SetTenantWeight(check_tenant(tenant), check_weight(weight)))

    async def tenants(self) -> list[TenantInfo]:
        return await self._run(self._ops.Tenants())
