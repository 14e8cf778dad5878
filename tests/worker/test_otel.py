"""The OpenTelemetry hooks, read back through the SDK's in-memory exporter and reader."""

from __future__ import annotations

import pytest

from transports_core import Event, open_transport
from transports_worker import Bury, Context, OpenTelemetryHooks, Worker
from transports_worker.testing import Recorder, RunningWorker

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="needs opentelemetry-sdk")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

PREFIX = "transports.worker."


def handle(event: Event, ctx: Context[Event]) -> None:
    if event.kind == "bury":
        raise Bury("unwanted")
    ctx.sleep(0.5)  # past a third of the visibility: one renewal at least


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], object]]]:
    found: dict[str, list[tuple[dict[str, object], object]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = getattr(point, "count", None)
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return found


def test_one_span_per_delivery_and_metrics_by_outcome(queue_url: str) -> None:
    url = queue_url
    with open_transport(url) as store:
        store.publish("keep", Event(kind="ack"))
        store.publish("drop", Event(kind="bury"))
    exporter = InMemorySpanExporter()
    tracer_provider = sdk_trace.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    recorder = Recorder()
    hooks = OpenTelemetryHooks(tracer_provider=tracer_provider, meter_provider=meter_provider)
    worker = Worker(
        url, handle, visibility=0.6, concurrency=2, hooks=[hooks, recorder], handle_signals=False
    )
    running = RunningWorker(worker)
    recorder.wait_settled(2)
    assert running.stop() == 0

    spans = {}
    for span in exporter.get_finished_spans():
        attributes = dict(span.attributes or {})
        spans[attributes["messaging.message.group_id"]] = (span, attributes)
    assert set(spans) == {"keep", "drop"}
    for group, (span, attributes) in spans.items():
        assert span.name == "transports.deliver"
        assert attributes["transports.attempt"] == 1
        assert attributes["transports.seq"] == (1 if group == "keep" else 2)
        assert attributes["transports.outcome"] == ("acked" if group == "keep" else "buried")
    assert spans["drop"][0].status.status_code is StatusCode.ERROR
    assert spans["keep"][0].status.status_code is not StatusCode.ERROR

    points = _points(reader)
    outcomes = {
        attrs["transports.outcome"]: value for attrs, value in points[PREFIX + "deliveries"]
    }
    assert outcomes == {"acked": 1, "buried": 1}
    assert [value for _, value in points[PREFIX + "in_flight"]] == [0]
    assert [value for _, value in points[PREFIX + "duration"]] == [1, 1]
    (renewals,) = [value for _, value in points[PREFIX + "renewals"]]
    assert isinstance(renewals, int)
    assert renewals >= 1
    meter_provider.shutdown()
    tracer_provider.shutdown()
