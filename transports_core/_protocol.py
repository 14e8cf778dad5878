"""The interface every transport implements, and the contract written once.

Imports only ``_models``; knows nothing of any backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from ._models import Lease

try:
    from typing import Self
except ImportError:  # Python 3.10
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
    * **Priority floor.** ``claim(min_priority=p)`` only serves groups whose priority is at
      least ``p``; priority filters, it does not reorder. A group's priority is set by the
      publish that creates it; once the group drains, the next publish sets it afresh.
    * **Fencing.** ``ack``, ``nack`` and ``extend`` act only on the current lease: same
      ``seq``, ``worker_id`` and ``attempt``, not yet acked or nacked. Otherwise they raise
      `LeaseLost` and change nothing. A lease that lapsed but was not re-claimed is still
      current.
    * **Bad arguments** raise ``ValueError`` or ``TypeError`` naming the value, before
      anything is written.
    """

    def publish(self, group_id: str, event: E, priority: int = 0) -> int:
        """Append ``event`` to ``group_id``; return its sequence number.

        ``priority`` (0-4) applies only when this publish creates the group.
        """
        ...

    def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        """Publish ``(group_id, event, priority)`` triples atomically; return their seqs
        in order. A bad item rejects the whole batch before anything is written."""
        ...

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease[E] | None:
        """Lease the next deliverable message for ``visibility`` seconds, or return None.

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

    async def publish(self, group_id: str, event: E, priority: int = 0) -> int: ...

    async def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]: ...

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Lease[E] | None: ...

    async def ack(self, lease: Lease[object]) -> None: ...

    async def nack(self, lease: Lease[object], delay: float = 0) -> None: ...

    async def extend(self, lease: Lease[E], visibility: float) -> Lease[E]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...
