"""OpenTelemetry hooks (the ``otel`` extra): one span per delivery, and metrics.

Spans are named ``transports.deliver`` and carry ``messaging.message.group_id``,
``transports.seq``, ``transports.attempt``, ``transports.worker_id`` and, when the
delivery ends, ``transports.outcome``; a failure records the exception and sets an
error status. Metrics: those of `_metrics.METRICS`, under their OpenTelemetry names
(``transports.worker.deliveries``, ``transports.worker.duration`` ...), the runtime's as
counters, a histogram and an up-down counter, and the backlog of a `QueueBacklog`, if
given, as observable gauges read at each collection. Imports opentelemetry-api only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

from ._hooks import Delivery, Hooks
from ._metrics import METRICS, BacklogSample, QueueBacklog, lost_reason
from ._outcomes import Outcome

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider
    from opentelemetry.trace import Span, TracerProvider

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import Observation
    from opentelemetry.trace import Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "OpenTelemetryHooks needs opentelemetry-api: pip install 'durable-transports[otel]'"
    ) from exc

__all__ = ["OpenTelemetryHooks"]

SCOPE: Final = "transports_worker"
FAILED: Final = frozenset({"failed", "buried", "lost"})
SPECS: Final = {spec.name: spec for spec in METRICS}
Readings = Callable[[BacklogSample], Iterable[tuple[float, dict[str, str | int]]]]

# What each backlog gauge reads from a sample: (value, attributes) pairs.
BACKLOG: Final[dict[str, Readings]] = {
    "transports_queue_up": lambda s: [(1.0 if s.ok else 0.0, {})],
    "transports_queue_messages": lambda s: [
        (count, {"transports.state": state}) for state, count in s.totals.items()
    ],
    "transports_queue_priority_messages": lambda s: [
        (count, {"transports.priority": priority, "transports.state": state})
        for (priority, state), count in sorted(s.by_priority.items())
    ],
    "transports_queue_keys": lambda s: [] if s.keys is None else [(s.keys, {})],
    "transports_queue_held_groups": lambda s: (
        [] if s.held_groups is None else [(s.held_groups, {})]
    ),
    "transports_queue_group_depth": lambda s: [
        (count, {"transports.group_id": group_id}) for group_id, count in s.deepest
    ],
    "transports_queue_oldest_ready_age_seconds": lambda s: (
        [(s.oldest_ready_age or 0.0, {})] if s.ok else []
    ),
    "transports_queue_priority_oldest_ready_age_seconds": lambda s: [
        (seconds, {"transports.priority": priority})
        for priority, seconds in sorted(s.age_by_priority.items())
    ],
    "transports_queue_groups": lambda s: [
        (count, {"transports.state": state}) for state, count in s.groups.items()
    ],
    "transports_queue_priority_groups": lambda s: [
        (count, {"transports.priority": priority, "transports.state": state})
        for (priority, state), count in sorted(s.groups_by_priority.items())
    ],
}


def _observe_backlog(meter: Meter, backlog: QueueBacklog) -> None:
    for name, readings in BACKLOG.items():
        spec = SPECS[name]

        def callback(
            options: CallbackOptions, readings: Readings = readings
        ) -> Iterable[Observation]:
            return [Observation(value, attrs) for value, attrs in readings(backlog.sample())]

        unit = "s" if name.endswith("_seconds") else ""
        meter.create_observable_gauge(
            spec.otel, callbacks=[callback], unit=unit, description=spec.help
        )


class OpenTelemetryHooks(Hooks):
    """Hooks that report to OpenTelemetry; the global providers unless given. With
    ``backlog``, the queue's backlog too, read (at most once per its ``cache``) when the
    meter provider collects."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        backlog: QueueBacklog | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)

        def counter(name: str) -> metrics.Counter:
            spec = SPECS[name]
            return meter.create_counter(spec.otel, description=spec.help)

        spec = SPECS["transports_worker_handler_duration_seconds"]
        self._duration = meter.create_histogram(spec.otel, unit="s", description=spec.help)
        self._deliveries = counter("transports_worker_deliveries_total")
        self._renewals = counter("transports_worker_renewals_total")
        self._renewal_failures = counter("transports_worker_renewal_failures_total")
        self._lost = counter("transports_worker_lost_leases_total")
        self._claimed = counter("transports_worker_claimed_total")
        self._empty = counter("transports_worker_empty_claims_total")
        spec = SPECS["transports_worker_in_flight"]
        self._in_flight = meter.create_up_down_counter(spec.otel, description=spec.help)
        if backlog is not None:
            _observe_backlog(meter, backlog)
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
        self._claimed.add(1)

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

    def renewal_failed(self, delivery: Delivery, error: BaseException) -> None:
        self._renewal_failures.add(1)

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        self._lost.add(1, {"transports.reason": lost_reason(error)})

    def claimed_nothing(self, worker_id: str) -> None:
        self._empty.add(1)
