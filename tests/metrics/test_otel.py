"""The same metrics through OpenTelemetry: read back with the SDK's in-memory reader, and
harmless on the API's no-op providers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from transports_core import Event, Lease, LeaseLost, open_transport
from transports_worker import Bury, Context, Delivery, OpenTelemetryHooks, QueueBacklog, Worker
from transports_worker._metrics import METRICS
from transports_worker.testing import Recorder, RunningWorker

Points = dict[str, dict[frozenset[tuple[str, object]], object]]


def handle(event: Event, ctx: Context[Event]) -> None:
    if event.kind == "bury":
        raise Bury("unwanted")


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        for n in range(5):
            store.publish(f"g{n}", Event(kind="ack"), priority=1)
        for _ in range(2):
            store.publish("b", Event(kind="bury"), priority=1)
        for _ in range(3):
            store.publish("waiting", Event(kind="wait"), priority=0)
    return url


@pytest.fixture
def backlog(url: str) -> Iterator[QueueBacklog]:
    backlog = QueueBacklog(url, groups=1, cache=0)
    yield backlog
    backlog.close()


def _work(url: str, hooks: OpenTelemetryHooks) -> None:
    recorder = Recorder()
    worker = Worker(url, handle, min_priority=1, hooks=[hooks, recorder], handle_signals=False)
    running = RunningWorker(worker)
    recorder.wait_settled(7)
    assert running.stop() == 0


def test_the_sdk_reads_the_runtime_and_backlog_metrics(url: str, backlog: QueueBacklog) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="needs opentelemetry-sdk")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    _work(url, OpenTelemetryHooks(meter_provider=provider, backlog=backlog))
    points: Points = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = getattr(point, "count", None)
                    key = frozenset((point.attributes or {}).items())
                    points.setdefault(metric.name, {})[key] = value
    provider.shutdown()

    def read(name: str, **attributes: object) -> object:
        return points[name].get(frozenset(attributes.items()))

    catalogue = {spec.otel for spec in METRICS}
    assert set(points) <= catalogue
    # Only counters this run may never add to have no point: nothing was renewed here.
    assert catalogue - set(points) <= {
        "transports.worker.lost",
        "transports.worker.renewals",
        "transports.worker.renewal_failures",
        "transports.worker.empty_claims",
    }
    assert read("transports.worker.deliveries", **{"transports.outcome": "acked"}) == 5
    assert read("transports.worker.deliveries", **{"transports.outcome": "buried"}) == 2
    assert read("transports.worker.duration", **{"transports.outcome": "acked"}) == 5
    assert read("transports.worker.claimed") == 7
    assert read("transports.worker.in_flight") == 0
    assert read("transports.queue.up") == 1
    assert read("transports.queue.messages", **{"transports.state": "ready"}) == 3
    assert read("transports.queue.messages", **{"transports.state": "dead"}) == 2
    by_priority = {"transports.priority": 1, "transports.state": "dead"}
    assert read("transports.queue.priority_messages", **by_priority) == 2
    assert read("transports.queue.held_groups") == 0
    age = read("transports.queue.oldest_ready_age")
    assert isinstance(age, float), age
    assert age > 0
    # Each gauge reads its own sample here (cache=0): the two ages are a moment apart.
    aged = read("transports.queue.priority_oldest_ready_age", **{"transports.priority": 0})
    assert aged == pytest.approx(age, abs=1.0)
    assert read("transports.queue.groups", **{"transports.state": "ready"}) == 1
    assert read("transports.queue.groups", **{"transports.state": "busy"}) == 0
    waiting = {"transports.priority": 0, "transports.state": "ready"}
    assert read("transports.queue.priority_groups", **waiting) == 1
    assert read("transports.queue.keys") == 0
    assert points["transports.queue.group_depth"] == {
        frozenset({("transports.group_id", "waiting")}): 3
    }


def test_on_the_api_no_op_providers_the_hooks_work_and_report_nothing(
    url: str, backlog: QueueBacklog
) -> None:
    # No provider given, none set: the API's own no-op (proxy) providers.
    _work(url, OpenTelemetryHooks(backlog=backlog))
    with open_transport(url) as store:
        assert store.claim("check", 1.0, min_priority=1) is None, "not all work was done"


def test_a_lost_lease_is_counted_under_its_reason() -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="needs opentelemetry-sdk")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    hooks = OpenTelemetryHooks(meter_provider=provider)
    lease = Lease(1, "g", Event(), "w", 1, 0.0)
    for error in (LeaseLost(lease, "redelivered"), LeaseLost(lease), RuntimeError("?")):
        hooks.lost(Delivery.of(lease), error)
    data = reader.get_metrics_data()
    assert data is not None
    counted = {
        dict(point.attributes or {})["transports.reason"]: getattr(point, "value", None)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "transports.worker.lost"
        for point in metric.data.data_points
    }
    provider.shutdown()
    assert counted == {"redelivered": 1, "unknown": 2}
