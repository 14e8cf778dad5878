"""Every error the library raises on purpose.

    TransportError               base of every error raised on purpose
    ├── LeaseLost                ack/nack/extend on a lease that is no longer current
    ├── EventDecodeError         a stored event no longer decodes as the event type
    └── UnknownBackend           no backend is registered for a URL scheme

Bad arguments are not transport errors: they raise ``ValueError`` or ``TypeError``
(see ``_validate``). Imports only ``_models``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._models import Lease

__all__ = ["EventDecodeError", "LeaseLost", "TransportError", "UnknownBackend"]


class TransportError(Exception):
    """Base class of every error this library raises on purpose."""


class LeaseLost(TransportError):
    """The lease is no longer current: it was acked, nacked, or another worker re-claimed
    the message after it lapsed. Nothing was changed."""

    def __init__(self, lease: Lease[object]) -> None:
        super().__init__(
            f"lease on message {lease.seq} of group {lease.group_id!r} "
            f"(worker {lease.worker_id!r}, attempt {lease.attempt}) is no longer held"
        )
        self.lease = lease


class EventDecodeError(TransportError):
    """A claimed message's stored JSON does not decode as the transport's event type.

    The message *is* leased: ``lease`` (whose ``event`` is the raw JSON text) can be
    passed to ``ack`` to drop it or to ``nack`` to park it. The pydantic error is the
    ``__cause__``.
    """

    def __init__(self, lease: Lease[str], reason: str) -> None:
        super().__init__(
            f"message {lease.seq} of group {lease.group_id!r} does not decode: {reason}"
        )
        self.lease = lease

    @property
    def raw(self) -> str:
        """The stored JSON text, exactly as published."""
        return self.lease.event


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
