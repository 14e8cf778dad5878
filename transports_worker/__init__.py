"""transports_worker: the runtime around a handler, for any transport of this library.

It claims only when a slot is free, keeps each lease renewed while its handler runs,
cancels a handler whose lease is lost, turns the handler's outcome into ``ack``, ``nack``
or ``bury``, and shuts down in two steps (drain within ``grace``, then hand leases back).
Imports only the public contract (``transports_core``); OpenTelemetry only when
`OpenTelemetryHooks` is asked for, prometheus_client only when `PrometheusHooks` is.

>>> from transports_worker import Worker
>>> def handle(event, ctx):
...     print(event, ctx.attempt)
>>> Worker("sqlite:///jobs.db", handle, concurrency=4)  # doctest: +ELLIPSIS
<Worker ...>
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._async import AsyncWorker
from ._common import EXIT_DRAINED, EXIT_HANDED_BACK
from ._context import AsyncContext, Context
from ._hooks import Delivery, Hooks, LoggingHooks
from ._keeper import AsyncLeaseKeeper, LeaseKeeper, async_lease_keeper, lease_keeper
from ._metrics import QueueBacklog
from ._outcomes import Bury, Cancelled, Outcome, Retry, RetryPolicy
from ._sync import Worker

if TYPE_CHECKING:
    from ._otel import OpenTelemetryHooks
    from ._prometheus import PrometheusHooks

__all__ = [
    "EXIT_DRAINED",
    "EXIT_HANDED_BACK",
    "AsyncContext",
    "AsyncLeaseKeeper",
    "AsyncWorker",
    "Bury",
    "Cancelled",
    "Context",
    "Delivery",
    "Hooks",
    "LeaseKeeper",
    "LoggingHooks",
    "OpenTelemetryHooks",
    "Outcome",
    "PrometheusHooks",
    "QueueBacklog",
    "Retry",
    "RetryPolicy",
    "Worker",
    "async_lease_keeper",
    "lease_keeper",
]


def __getattr__(name: str) -> Any:
    # The exporters' hooks import their libraries: only when asked for.
    if name == "OpenTelemetryHooks":
        from ._otel import OpenTelemetryHooks

        return OpenTelemetryHooks
    if name == "PrometheusHooks":
        from ._prometheus import PrometheusHooks

        return PrometheusHooks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
