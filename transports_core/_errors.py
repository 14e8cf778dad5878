"""Every error the library raises on purpose.

    TransportError               base of every error raised on purpose
    ├── LeaseLost                ack/nack/extend/bury on a lease that is no longer current
    ├── EventDecodeError         a stored event no longer decodes as the event type
    ├── RequeueRefused           requeue of a dead letter whose group a worker holds
    ├── Unsupported              the backend cannot do what was asked (a delayed publish,
    │                            tenants, group control) and says which feature
    ├── OutcomeUnknown           the connection broke before the server said whether a
    │                            change was made (a networked backend)
    └── UnknownBackend           no backend is registered for a URL scheme

Bad arguments are not transport errors: they raise ``ValueError`` or ``TypeError``
(see ``_validate``). Imports only ``_models``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from ._models import Lease

__all__ = [
    "EventDecodeError",
    "LeaseLost",
    "LostReason",
    "OutcomeUnknown",
    "RequeueRefused",
    "TransportError",
    "UnknownBackend",
    "Unsupported",
]


def _restored(kind: type[TransportError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An error as pickled (see `TransportError.__reduce__`), its ``__init__`` not run."""
    error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


class TransportError(Exception):
    """Base class of every error this library raises on purpose.

    Every one survives pickling with its attributes (a `LeaseLost` raised in a process
    pool's worker reaches the caller whole): it is rebuilt from its message and
    attributes, not by calling its ``__init__`` again, whose arguments differ from the
    message that Python's default keeps."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restored, (type(self), self.args, dict(self.__dict__)))


LostReason = Literal["gone", "redelivered", "parked", "released", "foreign"]

_WHY: dict[str, str] = {
    "gone": "its message is gone: acked, buried, cancelled or purged",
    "redelivered": "the lease lapsed and the message was delivered again",
    "parked": "the message was nacked with a delay and is parked",
    "released": "the message was nacked and waits for its next delivery",
    "foreign": "the message is leased under another worker id",
}


class LeaseLost(TransportError):
    """The lease is no longer current: its message was acked, nacked or buried, or
    another claim delivered it again after the lease lapsed. Nothing was changed.

    ``reason`` says which, as the store showed the message just after the call:
    ``"gone"`` (acked, buried, cancelled or purged), ``"redelivered"`` (the lease lapsed
    and a later claim delivered the message again, whatever became of that delivery),
    ``"parked"`` or ``"released"`` (nacked, with or without a delay, and not delivered
    since), ``"foreign"`` (held under the same attempt by another worker id: a lease
    that was not this transport's). None when it is not known: the store could not be
    asked, or a worker's own clock saw the lease run out."""

    def __init__(self, lease: Lease[object], reason: LostReason | None = None) -> None:
        super().__init__(
            f"lease on message {lease.seq} of group {lease.group_id!r} "
            f"(worker {lease.worker_id!r}, attempt {lease.attempt}) is no longer held"
        )
        self.lease = lease
        self.reason = reason

    def __str__(self) -> str:
        text = super().__str__()
        return text if self.reason is None else f"{text}: {_WHY[self.reason]}"


class EventDecodeError(TransportError):
    """A claimed message's stored JSON does not decode as the transport's event type.

    The message *is* leased: ``lease`` (whose ``event`` is the raw JSON text) can be
    passed to ``ack`` to drop it or to ``nack`` to park it. The pydantic error is the
    ``__cause__``. Raised by ``claim_many``, ``others`` holds the batch's other leases
    (those that decoded, and the raw ones of any other that did not), held as well;
    ``undecodable`` holds the errors of those others that did not decode (their leases
    are the raw ones in ``others``), so that a caller can tell them apart.
    """

    def __init__(self, lease: Lease[str], reason: str) -> None:
        super().__init__(
            f"message {lease.seq} of group {lease.group_id!r} does not decode: {reason}"
        )
        self.lease = lease
        self.others: list[Lease[Any]] = []
        self.undecodable: list[EventDecodeError] = []

    @property
    def raw(self) -> str:
        """The stored JSON text, exactly as published."""
        return self.lease.event


class RequeueRefused(TransportError):
    """``requeue(seq)`` found the dead letter, but its group is held: by a worker's lease
    (``holder`` is that worker's id; a lapsed lease nobody re-claimed included) or by
    another dead letter at its head (``holder`` is None, ``held_by`` that letter's seq).
    Nothing was changed: requeue again once the group is settled."""

    def __init__(
        self, seq: int, group_id: str, holder: str | None, held_by: int | None = None
    ) -> None:
        if holder is not None:
            who = f"worker {holder!r} holds a lease"
        else:
            who = f"dead letter {held_by} is held at its head"
        super().__init__(
            f"cannot requeue message {seq}: {who} in its group {group_id!r}; "
            "requeue it once that is settled"
        )
        self.seq = seq
        self.group_id = group_id
        self.holder = holder
        self.held_by = held_by


class Unsupported(TransportError):
    """The backend does not offer ``feature`` (say ``"delayed publish"``): it refuses the
    call before writing anything. Its documentation says which features it offers."""

    def __init__(self, feature: str, backend: str) -> None:
        super().__init__(f"the {backend} backend does not support {feature}")
        self.feature = feature
        self.backend = backend


class OutcomeUnknown(TransportError):
    """The connection to the server broke while a call was in flight, after the request
    may have reached it: the change may or may not have been made. ``operation`` names the
    call. Nothing is retried behind the caller's back; the next call reconnects. A caller
    that retries a publish may store it twice; an ack or nack that is retried may raise
    `LeaseLost` because the first one took effect."""

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"{operation}: the connection was lost, outcome unknown ({reason})")
        self.operation = operation


class UnknownBackend(TransportError, LookupError):
    """No backend is registered for the URL's scheme (or, with ``asynchronous``, the
    backend has no async twin)."""

    def __init__(self, scheme: str, known: Iterable[str], *, asynchronous: bool = False) -> None:
        self.scheme = scheme
        self.known = tuple(sorted(known))
        listed = ", ".join(self.known) or "none"
        if asynchronous:
            message = f"the backend for scheme {scheme!r} has no async transport"
        else:
            message = f"no transport backend for scheme {scheme!r}"
        super().__init__(f"{message}; known schemes: {listed}")
