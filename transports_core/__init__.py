"""durable-transports core: the transport interface, its models and errors, and the
registry that opens a backend by URL. Knows nothing of any particular backend."""

from __future__ import annotations

from ._admin import (
    AsyncTransportAdmin,
    DeadLetter,
    GroupInfo,
    GroupState,
    HeldGroup,
    MessageState,
    PriorityStats,
    QueuedMessage,
    QueueStats,
    TenantInfo,
    TransportAdmin,
)
from ._base import AsyncWithin, Within
from ._errors import (
    EventDecodeError,
    LeaseLost,
    LostReason,
    OutcomeUnknown,
    RequeueRefused,
    TransportError,
    UnknownBackend,
    Unsupported,
)
from ._models import Duplicate, Event, Lease, Message, Settlement
from ._protocol import AsyncTransport, Transport
from ._registry import (
    ENTRY_POINT_GROUP,
    Backend,
    Migration,
    known_schemes,
    migrate,
    open_async_transport,
    open_transport,
    redact_url,
    register_backend,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AsyncTransport",
    "AsyncTransportAdmin",
    "AsyncWithin",
    "Backend",
    "DeadLetter",
    "Duplicate",
    "Event",
    "EventDecodeError",
    "GroupInfo",
    "GroupState",
    "HeldGroup",
    "Lease",
    "LeaseLost",
    "LostReason",
    "Message",
    "MessageState",
    "Migration",
    "OutcomeUnknown",
    "PriorityStats",
    "QueueStats",
    "QueuedMessage",
    "RequeueRefused",
    "Settlement",
    "TenantInfo",
    "Transport",
    "TransportAdmin",
    "TransportError",
    "UnknownBackend",
    "Unsupported",
    "Within",
    "known_schemes",
    "migrate",
    "open_async_transport",
    "open_transport",
    "redact_url",
    "register_backend",
]
