"""The interface every transport implements, and the contract written once.

Imports only ``_models`` and ``_errors``; knows nothing of any backend.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from ._errors import LeaseLost
from ._models import Lease, Message, Settlement

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

__all__ = ["AsyncTransport", "Transport"]

E = TypeVar("E")


@runtime_checkable
class Transport(Protocol[E]):
    """A durable store of events, in per-group FIFO order, delivered one group at a time.

    Guarantees, for every implementation:

    * **FIFO per group.** A group's messages are delivered in ``publish`` order.
    * **One at a time.** While a message of a group is leased or parked, no other message
      of that group is delivered.
    * **Leases lapse.** A lease not acked, nacked or extended before ``expires_at`` lapses
      and its message can be claimed again (``attempt`` grows by one).
    * **Round-robin.** ``claim`` serves the ready group whose last claim is oldest; groups
      never claimed come first, in the order of their oldest message. A group that drains
      (its last message acked) is forgotten: when it comes back it counts as never claimed.
      With tenants (see ``publish``), a claim first picks the tenant by weighted
      round-robin among the tenants that have a ready group, then that tenant's group as
      above.
    * **Paused groups** (see `TransportAdmin.pause_group`) deliver nothing until resumed.
    * **Priority floor.** ``claim(min_priority=p)`` only serves groups whose priority is at
      least ``p``; priority filters, it does not reorder. A group's priority is set by the
      publish that creates it; once the group drains, the next publish sets it afresh.
    * **Fencing.** ``ack``, ``nack``, ``extend`` and ``bury`` act only on the current
      lease: same ``seq``, ``worker_id`` and ``attempt``, not yet settled. Otherwise they
      raise `LeaseLost` and change nothing. A lease that lapsed but was not re-claimed is
      still current (across closing and reopening the store too).
    * **Timing.** A lease is claimable again as soon as its ``expires_at`` has passed (no
      grace); a park lasts ``delay`` from the ``nack``, not from the claim.
    * **Seqs** grow and are never handed out twice, even after the newest message is
      acked and the store reopened, so a stale lease never matches a later message.
    * **Worker ids** beginning with ``__`` are reserved for the backends and refused.
    * **Bad arguments** raise ``ValueError`` or ``TypeError`` naming the value, before
      anything is written.
    """

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
        """Append ``event`` to ``group_id``; return its sequence number.

        ``priority`` (0-4) applies only when this publish creates the group.

        With a ``key`` (1-255 characters), the publish is idempotent within its group: if
        the key was used in that group within the queue's deduplication window (the
        ``dedup_window`` option, a day unless set), nothing is stored and the seq of the
        message first published with it is returned as a `Duplicate`, whether that message
        is still queued, in flight, acked, dead or purged. Publishes of one key racing from
        several processes or hosts store exactly one message. A key older than the window
        is forgotten: its next use publishes anew.

        With a ``delay`` (seconds, up to a year), the message is not delivered before it
        is due, on the store's clock. By default it does not hold its group: the group's
        other messages flow on, and when it is due it joins the group's FIFO as if it were
        published at that moment (messages due at the same moment keep seq order). With
        ``hold=True`` it keeps its place in publish order, and once it is the group's head
        it holds the group until it is due, as a parked message does.

        ``tenant`` (1-255 characters) sets the group's tenant when this publish creates
        the group, as ``priority`` does; claims share out among tenants by their weights
        (see `TransportAdmin.set_tenant_weight`). Groups published without a tenant make
        up one tenant of their own, of weight 1.
        """
        ...

    def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]:
        """Publish the items atomically, each a `Message` or a ``(group_id, event,
        priority)`` triple; return their seqs in order, a `Duplicate` for each item whose
        key was used already (by an earlier item of the same batch too). A bad item
        rejects the whole batch before anything is written."""
        ...

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        """Lease the next deliverable message for ``visibility`` seconds, or return None.

        With ``wait == 0`` the call never blocks. With ``wait > 0``, when nothing is
        deliverable it blocks until a message becomes deliverable to it, and returns None
        only once ``wait`` seconds have passed. A message becomes deliverable by a publish
        (from any handle, process or host), an ack or nack that frees its group, a lease
        that lapses, or a park that ends; each of these wakes a blocked claim promptly
        (the backend says how promptly), without the claim polling the store in a busy
        loop. ``close()`` from another thread (or task) wakes a blocked claim at once: it
        returns None and leases nothing. Cancelling an async claim never leaves a lease
        that nobody holds a `Lease` for (beyond one that lapses by itself).

        Raises `EventDecodeError` (carrying the lease) if the message no longer decodes.
        """
        ...

    def ack(self, lease: Lease[object]) -> None:
        """Delete the leased message: it is done."""
        ...

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        """Give the message back: at once (``delay == 0``), or after parking it, with its
        group held, for ``delay`` seconds."""
        ...

    def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        """Renew the lease for ``visibility`` seconds from now; return the renewed lease."""
        ...

    def bury(self, lease: Lease[object], reason: str) -> None:
        """Make the leased message a dead letter now, with ``reason`` stored beside it.

        Fenced exactly like `ack`. What follows for its group is the transport's
        ``on_dead`` policy: ``release`` lets the group go on with its next message,
        ``hold`` blocks the group until the dead letter is requeued or discarded (see
        `TransportAdmin`).
        """
        ...

    def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[Lease[E]]:
        """Lease up to ``limit`` messages, each of a different group, in one call: the
        ones, and in the order, that ``limit`` successive ``claim`` calls would lease
        (round-robin, the priority floor, tenants' turns), fewer when fewer are
        deliverable. With ``wait > 0`` it blocks as ``claim`` does until at least one is,
        then leases the rest of the batch in a second call; if the store fails in that
        call, the lease the wait took is returned alone, not lost (the failure shows at
        the next call).

        A message that does not decode raises `EventDecodeError` carrying it, with the
        batch's other leases in its ``others``."""
        ...

    def settle_many(self, items: Iterable[Settlement[object]]) -> list[LeaseLost]:
        """Settle several leases in one call and one commit, each `Settlement` as its
        ``ack``, ``nack`` or ``bury`` would. Each is fenced by its own lease: those no
        longer current change nothing and come back as `LeaseLost` values (not raised),
        in their order; the others take effect. A bad item rejects the whole batch
        before anything is written."""
        ...

    def ack_many(self, leases: Iterable[Lease[object]]) -> list[LeaseLost]:
        """`settle_many` of acks."""
        ...

    def ack_and_claim(
        self,
        lease: Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> Lease[E] | None:
        """Ack ``lease`` and claim the next message in one call, as ``ack`` then
        ``claim`` would. When the lease is no longer current it raises `LeaseLost` and
        claims nothing. With ``wait > 0`` a claim that finds nothing blocks as ``claim``
        does (the ack has taken effect by then)."""
        ...

    def close(self) -> None:
        """Release the connection. Idempotent."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...


@runtime_checkable
class AsyncTransport(Protocol[E]):
    """`Transport` as coroutines, with the same contract, used with ``async with``."""

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
    ) -> int: ...

    async def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]: ...

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None: ...

    async def ack(self, lease: Lease[object]) -> None: ...

    async def nack(self, lease: Lease[object], delay: float = 0) -> None: ...

    async def extend(self, lease: Lease[E], visibility: float) -> Lease[E]: ...

    async def bury(self, lease: Lease[object], reason: str) -> None: ...

    async def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[Lease[E]]: ...

    async def settle_many(self, items: Iterable[Settlement[object]]) -> list[LeaseLost]: ...

    async def ack_many(self, leases: Iterable[Lease[object]]) -> list[LeaseLost]: ...

    async def ack_and_claim(
        self,
        lease: Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> Lease[E] | None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...
