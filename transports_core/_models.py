"""The values every transport speaks: the default `Event` model, the `Lease`, a `Message`
to publish, a `Settlement` of a batch of settles, and the `Duplicate` seq of a publish
whose key was used already.

Imports nothing from the rest of the package when it is imported, so every other module
may import it; `Settlement` checks its arguments with ``_validate``'s checks, imported when
one is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Duplicate", "Event", "Lease", "Message", "Settlement"]

E_co = TypeVar("E_co", covariant=True)


class Event(BaseModel):
    """The default event type: a pydantic model that accepts any fields.

    Applications normally pass their own model (or a discriminated union of models) as
    ``event_type=`` when opening a transport; this one is for scripts and tests.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    if TYPE_CHECKING:
        # Any field is allowed, so tell type checkers so (pydantic does the work at runtime).
        def __init__(self, **data: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class Lease(Generic[E_co]):
    """A claimed message: the right to process it, until ``expires_at``.

    ``attempt`` counts deliveries of this message (1 on the first) and is the lease's
    fencing token: ``ack``/``nack``/``extend`` succeed only for the current
    ``(seq, worker_id, attempt)``.
    """

    seq: int
    group_id: str
    event: E_co
    worker_id: str
    attempt: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Message(Generic[E_co]):
    """One item of ``publish_many``: what ``publish`` takes as arguments, as a value.

    ``key``, when given, makes the publish idempotent within its group: see `Duplicate`.
    ``delay`` (seconds) keeps the message back until it is due; by default it then joins
    its group's FIFO as if published at that moment, and with ``hold`` it keeps its place
    and holds its group until due (see `Transport.publish`). ``tenant`` names the tenant
    of a group this item creates.
    """

    group_id: str
    event: E_co
    priority: int = 0
    key: str | None = None
    delay: float = 0
    hold: bool = False
    tenant: str | None = None


_ACTIONS = ("ack", "nack", "bury")


@dataclass(frozen=True, slots=True)
class Settlement(Generic[E_co]):
    """One item of ``settle_many``: what to do with a held lease, as ``ack``, ``nack``
    or ``bury`` would: ``Settlement(lease)`` acks, ``Settlement(lease, "nack", delay=5)``
    parks for five seconds, ``Settlement(lease, "bury", reason="bad input")`` makes a
    dead letter. The arguments are checked as those calls check them when it is made,
    whatever the action (a negative ``delay`` is refused on an ack too, a ``reason``
    must be a str), and again before anything of the batch is written."""

    lease: Lease[E_co]
    action: Literal["ack", "nack", "bury"] = "ack"
    delay: float = 0
    reason: str = ""

    def __post_init__(self) -> None:
        from ._validate import check_delay, check_reason  # _validate imports this module

        if self.action not in _ACTIONS:
            raise ValueError(
                f"a settlement's action must be one of {', '.join(_ACTIONS)}, not {self.action!r}"
            )
        check_delay(self.delay)
        if self.action == "bury":
            check_reason(self.reason)
        elif not isinstance(self.reason, str):
            raise TypeError(
                f"a settlement's reason must be a str, not {type(self.reason).__name__}: "
                f"{self.reason!r:.200}"
            )


class Duplicate(int):
    """The seq that ``publish`` (or ``publish_many``, per item) returns when its ``key``
    was used in the same group within the queue's deduplication window: the seq of the
    message first published with that key, whether it is still queued, in flight, acked,
    dead or purged. Nothing was stored. It is an ``int`` like any seq; ask
    ``isinstance(seq, Duplicate)`` (or ``seq.duplicate``) to tell."""

    __slots__ = ()
    duplicate: ClassVar[bool] = True

    def __repr__(self) -> str:
        return f"Duplicate({int(self)})"
