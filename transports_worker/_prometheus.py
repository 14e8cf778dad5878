"""`PrometheusHooks`: the runtime's metrics in prometheus_client instruments, and the
queue's backlog (a `QueueBacklog`, read when scraped), served in the Prometheus text
format by `PrometheusHooks.serve`. Every metric is one of `_metrics.METRICS`.

Imports prometheus_client, behind the ``metrics`` extra; nothing here is imported until
`PrometheusHooks` is asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Final

from ._hooks import Delivery, Hooks
from ._metrics import (
    DURATION_BUCKETS,
    LOST_REASONS,
    METRICS,
    OUTCOMES,
    BacklogSample,
    MetricSpec,
    QueueBacklog,
    lost_reason,
)
from ._outcomes import Outcome

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without it
    raise ImportError(
        "PrometheusHooks needs prometheus_client: pip install 'durable-transports[metrics]'"
    ) from exc

__all__ = ["PrometheusHooks"]

SPECS: Final = {spec.name: spec for spec in METRICS}


def _spec(name: str) -> MetricSpec:
    return SPECS[name]


class _BacklogCollector(Collector):
    """The backlog's gauges, built from a `QueueBacklog` sample at each collection."""

    def __init__(self, backlog: QueueBacklog) -> None:
        self._backlog = backlog

    def describe(self) -> Iterable[GaugeMetricFamily]:
        # Without this, registering would collect, and so read the store.
        return list(self._families(None))

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families(self._backlog.sample()))

    def _families(self, sample: BacklogSample | None) -> Iterator[GaugeMetricFamily]:
        def family(name: str) -> GaugeMetricFamily:
            spec = _spec(name)
            return GaugeMetricFamily(name, spec.help, labels=spec.labels or None)

        up = family("transports_queue_up")
        messages = family("transports_queue_messages")
        by_priority = family("transports_queue_priority_messages")
        keys = family("transports_queue_keys")
        held = family("transports_queue_held_groups")
        depth = family("transports_queue_group_depth")
        age = family("transports_queue_oldest_ready_age_seconds")
        age_by_priority = family("transports_queue_priority_oldest_ready_age_seconds")
        groups = family("transports_queue_groups")
        groups_by_priority = family("transports_queue_priority_groups")
        if sample is not None:
            up.add_metric([], 1.0 if sample.ok else 0.0)
            for state, count in sample.totals.items():
                messages.add_metric([state], count)
            for (priority, state), count in sorted(sample.by_priority.items()):
                by_priority.add_metric([str(priority), state], count)
            if sample.ok:
                age.add_metric([], sample.oldest_ready_age or 0.0)
            for priority, seconds in sorted(sample.age_by_priority.items()):
                age_by_priority.add_metric([str(priority)], seconds)
            for state, count in sample.groups.items():
                groups.add_metric([state], count)
            for (priority, state), count in sorted(sample.groups_by_priority.items()):
                groups_by_priority.add_metric([str(priority), state], count)
            if sample.keys is not None:
                keys.add_metric([], sample.keys)
            if sample.held_groups is not None:
                held.add_metric([], sample.held_groups)
            for group_id, count in sample.deepest:
                depth.add_metric([group_id], count)
        yield from (up, messages, by_priority, keys, held, depth)
        yield from (age, age_by_priority, groups, groups_by_priority)


class PrometheusHooks(Hooks):
    """Hooks that count the runtime's work in prometheus_client metrics on ``registry``
    (a registry of their own unless given), and, with ``backlog``, report the queue's
    backlog on the same registry, read when scraped. See docs/metrics.md for the list."""

    def __init__(
        self, registry: CollectorRegistry | None = None, backlog: QueueBacklog | None = None
    ) -> None:
        self.registry = on = CollectorRegistry() if registry is None else registry

        def counter(name: str) -> Counter:
            spec = _spec(name)
            return Counter(spec.base, spec.help, spec.labels, registry=on)

        self._deliveries = counter("transports_worker_deliveries_total")
        spec = _spec("transports_worker_handler_duration_seconds")
        self._duration = Histogram(
            spec.name, spec.help, spec.labels, buckets=DURATION_BUCKETS, registry=on
        )
        spec = _spec("transports_worker_in_flight")
        self._in_flight = Gauge(spec.name, spec.help, registry=on)
        self._claimed = counter("transports_worker_claimed_total")
        self._empty = counter("transports_worker_empty_claims_total")
        self._lost = counter("transports_worker_lost_leases_total")
        self._renewals = counter("transports_worker_renewals_total")
        self._renewal_failures = counter("transports_worker_renewal_failures_total")
        # Every outcome from the start, at zero: a rate over a series that appears only
        # with its first event misses that event.
        self._by_outcome = {
            outcome: (self._deliveries.labels(outcome), self._duration.labels(outcome))
            for outcome in OUTCOMES
        }
        self._lost_by = {reason: self._lost.labels(reason) for reason in LOST_REASONS}
        if backlog is not None:
            self.registry.register(_BacklogCollector(backlog))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def started(self, delivery: Delivery) -> None:
        self._claimed.inc()
        self._in_flight.inc()

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        self._in_flight.dec()
        deliveries, duration = self._by_outcome[outcome]
        deliveries.inc()
        duration.observe(seconds)

    def renewed(self, delivery: Delivery) -> None:
        self._renewals.inc()

    def renewal_failed(self, delivery: Delivery, error: BaseException) -> None:
        self._renewal_failures.inc()

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        self._lost_by[lost_reason(error)].inc()

    def claimed_nothing(self, worker_id: str) -> None:
        self._empty.inc()

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve the registry over HTTP (any path; ``/metrics`` by convention) on a
        daemon thread; return the port (``port`` 0 picks a free one)."""
        if self._server is not None:
            raise RuntimeError("already serving")
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
