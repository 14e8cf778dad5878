"""The optional admin interface: what an operator (or the ``transports`` CLI) asks of a
queue besides publish and claim. A backend implements it on its transport class next to
`Transport`; callers check with ``isinstance(t, TransportAdmin)``.

Reads (`stats`, `groups`, `dead_letters`, `held_groups`) never take a lease or write, so
they work on a read-only store where the backend can read one.

Dead letters are part of the contract of every backend that declares the ``admin``
capability, with two options every such backend accepts (in its URL or as keywords):

* ``max_attempts`` (an int >= 1, or None, the default: never): a message delivered that
  many times without an ack is not delivered again; the claim that would deliver it makes
  it a dead letter instead and goes on to the next message.
* ``on_dead``: ``release`` (the default) lets its group go on with its next message;
  ``hold`` blocks the group until the dead letter is requeued or discarded.

`Transport.bury` makes a dead letter at once, under the same ``on_dead`` policy. A dead
letter's ``reason`` says how it died, in words built by `buried_reason` and
`exhausted_reason`, so that every backend says it the same way. Imports nothing from the
rest of the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, runtime_checkable

__all__ = [
    "AsyncTransportAdmin",
    "DeadLetter",
    "GroupInfo",
    "GroupState",
    "HeldGroup",
    "MessageState",
    "PriorityStats",
    "QueueStats",
    "QueuedMessage",
    "TenantInfo",
    "TransportAdmin",
    "buried_reason",
    "dead_letter",
    "exhausted_reason",
    "group_info",
    "held_group",
    "queue_stats",
]

BURIED: Final = "buried: "
EXHAUSTED: Final = "out of attempts: "
LastDelivery = Literal["lapsed", "nacked"]


def buried_reason(reason: str) -> str:
    """The stored reason of a message that `Transport.bury` made a dead letter."""
    return BURIED + reason


def exhausted_reason(deliveries: int, max_attempts: int, last: LastDelivery) -> str:
    """The stored reason of a message that ran out of its ``max_attempts`` deliveries;
    ``last`` says how the last delivery ended: its lease lapsed, or it was nacked."""
    return (
        f"{EXHAUSTED}{deliveries} deliveries without an ack (max_attempts={max_attempts}); "
        f"the last one {last}"
    )

GroupState = Literal["ready", "in_flight", "parked", "held"]


@dataclass(frozen=True, slots=True)
class PriorityStats:
    """Message counts of the groups at one priority.

    ``ready``: queued, neither leased nor parked (a lapsed lease or an elapsed park counts
    as ready; a ready message may still wait behind the head of its group).
    ``in_flight``: leased to a worker whose lease has not lapsed.
    ``parked``: nacked with a delay that has not elapsed.
    ``dead``: dead letters (see `DeadLetter`), by the priority they were published with.
    ``delayed``: published with a delay that has not passed (``hold`` or not); they
    count nowhere else until due.
    ``oldest_ready_age``: seconds (store's clock) since the oldest of the ``ready``
    messages became ready: since it was published, came due (a delayed message), or was
    requeued (a dead letter); a lapsed lease or an ended park does not restart it. None
    when nothing is ready.
    ``ready_groups``: groups whose head a claim could deliver now (ignoring the priority
    floor); ``busy_groups``: the other groups with queued messages, whose head is in
    flight, parked, delayed with ``hold``, or blocked by a dead letter, or that are
    paused. A group counts under its own priority (the first it was published with).
    """

    priority: int
    ready: int
    in_flight: int
    parked: int
    dead: int
    delayed: int = 0
    oldest_ready_age: float | None = None
    ready_groups: int = 0
    busy_groups: int = 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Totals over the whole queue, and the same counts per priority (ascending; only the
    priorities that have messages or dead letters). ``keys``: the idempotency keys the
    queue remembers (some may be past the window and not yet forgotten). ``paused``: the
    groups paused (see `TransportAdmin.pause_group`), with messages or not. The backlog's
    age and group counts are those of `PriorityStats`, over the whole queue."""

    ready: int
    in_flight: int
    parked: int
    dead: int
    by_priority: tuple[PriorityStats, ...]
    keys: int = 0
    delayed: int = 0
    paused: int = 0
    oldest_ready_age: float | None = None
    ready_groups: int = 0
    busy_groups: int = 0


def queue_stats(
    by_priority: Iterable[PriorityStats], keys: int = 0, paused: int = 0
) -> QueueStats:
    """The `QueueStats` of a queue whose counts per priority are ``by_priority``
    (ascending by priority): the totals are their sums, the age their oldest."""
    rows = tuple(by_priority)
    ages = [p.oldest_ready_age for p in rows if p.oldest_ready_age is not None]
    return QueueStats(
        ready=sum(p.ready for p in rows),
        in_flight=sum(p.in_flight for p in rows),
        parked=sum(p.parked for p in rows),
        dead=sum(p.dead for p in rows),
        by_priority=rows,
        keys=keys,
        delayed=sum(p.delayed for p in rows),
        paused=paused,
        oldest_ready_age=max(ages, default=None),
        ready_groups=sum(p.ready_groups for p in rows),
        busy_groups=sum(p.busy_groups for p in rows),
    )


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group with messages, as `TransportAdmin.groups` reports it.

    ``depth``: its queued messages (a dead letter holding it not included).
    ``head_seq``: its oldest message, the next one it delivers.
    ``state``: what its head is doing: ``ready``, ``in_flight`` (leased), ``parked``, or
    ``held`` by a dead letter (``on_dead="hold"``).
    ``busy_until``: when the head's lease or park ends; None when ready or held.
    ``last_claimed_at``: epoch seconds of its last claim; None if never claimed.
    ``paused``: paused by `TransportAdmin.pause_group` (its head delivers nothing more).
    ``tenant``: the tenant it was created with, None for none.
    """

    group_id: str
    priority: int
    depth: int
    head_seq: int
    state: GroupState
    busy_until: float | None
    last_claimed_at: float | None
    paused: bool = False
    tenant: str | None = None


def group_info(
    row: Sequence[Any],
    now: float,
    *,
    parked: str,
    held: float,
    paused: bool = False,
    tenant: str | None = None,
) -> GroupInfo:
    """The `GroupInfo` of a stored group row at ``now``, for a backend that keeps a group's
    head lease as a holder and an expiry: ``row`` is ``(group_id, priority, head_seq,
    last_claimed_at, locked_by, lock_expiry, depth)``. The backend's markers say the rest:
    an expiry of ``held`` is a dead letter holding the group (counted in ``depth``, not in
    the result's); a holder ``parked`` is a nack's delay; any other holder a worker's
    lease. A holder of None, or an expiry before ``now``, is ready; a ``last_claimed_at``
    of 0 or None, never claimed."""
    group_id, priority, head_seq, last_claimed_at, locked_by, lock_expiry, depth = row
    state: GroupState
    if lock_expiry == held:
        state, depth = "held", depth - 1
    elif locked_by is None or lock_expiry < now:
        state = "ready"
    else:
        state = "parked" if locked_by == parked else "in_flight"
    return GroupInfo(
        group_id=group_id,
        priority=priority,
        depth=depth,
        head_seq=head_seq,
        state=state,
        busy_until=lock_expiry if state in ("parked", "in_flight") else None,
        last_claimed_at=last_claimed_at or None,
        paused=paused,
        tenant=tenant,
    )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message taken out of delivery after ``max_attempts`` deliveries without an ack.

    ``event`` is the stored JSON text, exactly as published, so that dead letters of any
    event type can be listed. ``reason`` says how it died (see `buried_reason` and
    `exhausted_reason`). ``held`` is True while it blocks its group (``on_dead="hold"``).
    """

    seq: int
    group_id: str
    priority: int
    event: str
    attempts: int
    reason: str
    dead_at: float
    held: bool


def dead_letter(row: Sequence[Any]) -> DeadLetter:
    """The `DeadLetter` of a stored row ``(seq, group_id, priority, event, attempts,
    reason, dead_at, held)``, ``held`` any truthy value (a database's 1)."""
    seq, group_id, priority, event, attempts, reason, dead_at, held = row
    return DeadLetter(seq, group_id, priority, event, attempts, reason, dead_at, bool(held))


@dataclass(frozen=True, slots=True)
class HeldGroup:
    """A group blocked by its dead letter ``seq`` since ``since`` (epoch seconds), with
    ``waiting`` messages queued behind it."""

    group_id: str
    seq: int
    waiting: int
    since: float


def held_group(row: Sequence[Any]) -> HeldGroup:
    """The `HeldGroup` of a stored row ``(group_id, seq, dead_at, waiting)``: the group,
    its holding dead letter and when it died, and the messages queued behind it."""
    group_id, seq, dead_at, waiting = row
    return HeldGroup(group_id=group_id, seq=seq, waiting=waiting, since=dead_at)


MessageState = Literal["ready", "in_flight", "parked", "queued", "delayed"]


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message of a group as `TransportAdmin.peek` shows it, without claiming it.

    ``event``: the stored JSON text. ``attempts``: its deliveries so far.
    ``state``: ``ready``, ``in_flight`` or ``parked`` for the group's head; ``queued``
    behind it; ``delayed`` while a delayed publish is not due (``hold`` or not).
    ``due_at``: when it may next be delivered (epoch seconds, store's clock): a delayed
    message's due time, a parked head's end of park, an in-flight head's lease expiry;
    None when nothing but its turn keeps it.
    """

    seq: int
    group_id: str
    priority: int
    event: str
    attempts: int
    state: MessageState
    due_at: float | None


@dataclass(frozen=True, slots=True)
class TenantInfo:
    """A tenant as `TransportAdmin.tenants` reports it: its ``weight`` (1 unless set) and
    how many groups with messages it has. ``tenant`` None stands for the groups
    published without one."""

    tenant: str | None
    weight: int
    groups: int


@runtime_checkable
class TransportAdmin(Protocol):
    """Inspecting and repairing a queue, for operators and tools.

    * Reads take no lease and write nothing; each is one consistent snapshot.
    * ``requeue`` puts a dead letter back at the head of its group, in its original place
      (its ``seq`` is kept), with a fresh allowance of ``max_attempts`` deliveries;
      ``Lease.attempt`` keeps counting, so it stays a fencing token. It raises
      `RequeueRefused` if a worker holds a lease in that group (a lease that lapsed but
      was not re-claimed included) or another dead letter holds it: requeue after it
      settles. Any other `TransportError` is a storage failure, not a refusal.
    * ``requeue`` and ``discard`` return False when there is no dead letter ``seq``.
    * ``purge_group`` removes a group's messages, leased ones included (their holders
      get `LeaseLost`), and its dead letters; it returns how many it removed.
    * ``cancel`` removes one message that is not in flight (queued, parked, or delayed)
      and returns whether it did; a message leased to a worker (its lease not lapsed) is
      left alone. A group whose head it removes goes on with its next message.
    * ``pause_group`` stops new deliveries from a group, whether it has messages or not,
      until ``resume_group``; a lease in flight finishes normally. A pause is stored: it
      outlasts the handle, and the group's draining. Both return whether they changed
      anything.
    * ``peek`` lists a group's next messages, in the order it will deliver them: its
      FIFO from the head, then the delayed messages not yet due that do not hold it, by
      due time. It changes nothing.
    * Tenants share claims by weight. Each tenant keeps a *pass* and the queue a
      *virtual time* V, both 0 at first. A claim looks at the tenants that have a group
      it may serve (ready, not paused, at or above its priority floor), takes the one
      whose ``max(pass, V)`` is least (ties: by name, groups without a tenant first),
      sets V to that value and the tenant's pass to it plus ``1 / weight``, and serves
      that tenant's groups round-robin. So while two tenants both have groups to serve,
      their shares of any run of claims are within one claim of their weights' ratio,
      whatever the number of groups each has; a tenant that was idle comes back at V,
      with no backlog of turns to catch up on.
    """

    def stats(self) -> QueueStats:
        """Counts of ready, in-flight, parked, delayed and dead messages, ready and busy
        groups, and the oldest ready message's age, in total and per priority."""
        ...

    def groups(self, limit: int = 10) -> list[GroupInfo]:
        """The ``limit`` groups with the deepest backlog, deepest first (ties: oldest head
        first)."""
        ...

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """Dead letters in ``seq`` order, at most ``limit`` (None: all)."""
        ...

    def held_groups(self) -> list[HeldGroup]:
        """Groups blocked by a dead letter, in ``seq`` order of that dead letter."""
        ...

    def requeue(self, seq: int) -> bool:
        """Return dead letter ``seq`` to the head of its group."""
        ...

    def discard(self, seq: int) -> bool:
        """Delete dead letter ``seq`` for good; a group it held goes on."""
        ...

    def purge_group(self, group_id: str) -> int:
        """Delete every message and dead letter of ``group_id``."""
        ...

    def cancel(self, seq: int) -> bool:
        """Delete message ``seq`` unless it is in flight."""
        ...

    def pause_group(self, group_id: str) -> bool:
        """Deliver nothing more from ``group_id`` until it is resumed."""
        ...

    def resume_group(self, group_id: str) -> bool:
        """Let a paused group deliver again."""
        ...

    def paused_groups(self) -> list[str]:
        """The paused groups, sorted."""
        ...

    def peek(self, group_id: str, limit: int = 10) -> list[QueuedMessage]:
        """The next ``limit`` messages of ``group_id``, without claiming them."""
        ...

    def set_tenant_weight(self, tenant: str, weight: int) -> None:
        """Store ``tenant``'s weight (an int from 1 to 1000; 1 unless set)."""
        ...

    def tenants(self) -> list[TenantInfo]:
        """Tenants with groups or a stored weight, by name (None first)."""
        ...


@runtime_checkable
class AsyncTransportAdmin(Protocol):
    """`TransportAdmin` as coroutines, with the same contract."""

    async def stats(self) -> QueueStats: ...

    async def groups(self, limit: int = 10) -> list[GroupInfo]: ...

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]: ...

    async def held_groups(self) -> list[HeldGroup]: ...

    async def requeue(self, seq: int) -> bool: ...

    async def discard(self, seq: int) -> bool: ...

    async def purge_group(self, group_id: str) -> int: ...

    async def cancel(self, seq: int) -> bool: ...

    async def pause_group(self, group_id: str) -> bool: ...

    async def resume_group(self, group_id: str) -> bool: ...

    async def paused_groups(self) -> list[str]: ...

    async def peek(self, group_id: str, limit: int = 10) -> list[QueuedMessage]: ...

    async def set_tenant_weight(self, tenant: str, weight: int) -> None: ...

    async def tenants(self) -> list[TenantInfo]: ...
