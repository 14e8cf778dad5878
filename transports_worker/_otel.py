"""OpenTelemetry hooks (the ``otel`` extra): one span per delivery, and metrics.

Spans are named ``transports.deliver`` and carry ``messaging.message.group_id``,
``transports.seq``, ``transports.attempt``, ``transports.worker_id`` and, when the
delivery ends, ``transports.outcome``; a failure records the exception and sets an
error status. Metrics (all prefixed ``transports.worker.``): ``duration`` (histogram,
seconds, by outcome), ``deliveries`` (counter, by outcome), ``renewals``, ``lost``
(counters) and ``in_flight`` (up-down counter). Imports opentelemetry-api only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

from ._hooks import Delivery, Hooks
from ._outcomes import Outcome

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "OpenTelemetryHooks needs opentelemetry-api: pip install 'durable-transports[otel]'"
    ) from exc

__all__ = ["OpenTelemetryHooks"]

SCOPE: Final = "transports_worker"
FAILED: Final = frozenset({"failed", "buried", "lost"})


class OpenTelemetryHooks(Hooks):
    """Hooks that report to OpenTelemetry; the global providers unless given."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self._duration = meter.create_histogram(
            "transports.worker.duration", unit="s", description="time from claim to settle"
        )
        self._deliveries = meter.create_counter(
            "transports.worker.deliveries", description="deliveries ended, by outcome"
        )
        self._renewals = meter.create_counter(
            "transports.worker.renewals", description="leases extended by the lease keeper"
        )
        self._lost = meter.create_counter(
            "transports.worker.lost", description="leases lost while their handler ran"
        )
        self._in_flight = meter.create_up_down_counter(
            "transports.worker.in_flight", description="handlers running"
        )
        self._spans: dict[tuple[int, int, str], Span] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(delivery: Delivery) -> tuple[int, int, str]:
        return (delivery.seq, delivery.attempt, delivery.worker_id)

    def started(self, delivery: Delivery) -> None:
        span = self._tracer.start_span(
            "transports.deliver",
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.message.group_id": delivery.group_id,
                "transports.seq": delivery.seq,
                "transports.attempt": delivery.attempt,
                "transports.worker_id": delivery.worker_id,
            },
        )
        with self._lock:
            self._spans[self._key(delivery)] = span
        self._in_flight.add(1)

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        with self._lock:
            span = self._spans.pop(self._key(delivery), None)
        attributes = {"transports.outcome": outcome}
        self._duration.record(seconds, attributes)
        self._deliveries.add(1, attributes)
        if span is None:
            return
        self._in_flight.add(-1)
        span.set_attribute("transports.outcome", outcome)
        if error is not None:
            span.record_exception(error)
        if outcome in FAILED:
            span.set_status(Status(StatusCode.ERROR, f"{outcome}"))
        span.end()

    def renewed(self, delivery: Delivery) -> None:
        self._renewals.add(1)

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        self._lost.add(1)
