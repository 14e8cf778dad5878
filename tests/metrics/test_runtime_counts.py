"""The runtime's counts, made once for both twins: renewals that fail in passing, leases
lost, claims that return nothing, as `PrometheusHooks` counts them on a real SQLite queue
behind handles whose renewals fail on purpose."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, LeaseLost, TransportError, open_async_transport
from transports_core import open_transport as open_sync
from transports_worker import (
    AsyncContext,
    AsyncWorker,
    Context,
    Hooks,
    PrometheusHooks,
    Worker,
)
from transports_worker._metrics import LOST_REASONS
from transports_worker.testing import AsyncFaulty, Faults, Faulty, Recorder, RunningWorker

PATIENCE = 30.0


class Renewals:
    """What the next renewals raise, in turn (then they pass), shared by a worker's
    handles."""

    def __init__(self, *errors: str) -> None:
        self._errors = list(errors)
        self._lock = threading.Lock()
        self.url = ""  # the queue's, for "taken"

    def next(self, lease: Lease[Any]) -> None:
        with self._lock:
            error = self._errors.pop(0) if self._errors else None
        if error == "passing":
            raise TransportError("injected: the renewal did not reach the store")
        if error == "lost":
            raise LeaseLost(lease)
        if error == "taken":
            # Another handle gives the message back and claims it: the renewal then
            # reaches the store, which refuses it, since the message went out again.
            with open_sync(self.url) as other:
                other.nack(lease)
                assert other.claim("thief", PATIENCE) is not None


class FailingRenewals(Faulty):
    def __init__(self, url: str, renewals: Renewals) -> None:
        super().__init__(open_sync(url), Faults())
        self._renewals = renewals

    def extend(self, lease: Lease[Any], visibility: float) -> Lease[Any]:
        self._renewals.next(lease)
        return super().extend(lease, visibility)


class AsyncFailingRenewals(AsyncFaulty):
    def __init__(self, url: str, renewals: Renewals) -> None:
        super().__init__(open_async_transport(url), Faults())
        self._renewals = renewals

    async def extend(self, lease: Lease[Any], visibility: float) -> Lease[Any]:
        self._renewals.next(lease)
        return await super().extend(lease, visibility)


class Idle(Hooks):
    def __init__(self) -> None:
        self.seen = threading.Event()

    def claimed_nothing(self, worker_id: str) -> None:
        self.seen.set()


def handle(event: Event, ctx: Context[Event]) -> None:
    ctx.sleep(1.0)  # a visibility: renewed about three times, unless the lease is lost


async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
    await ctx.sleep(1.0)


def _run(tmp_path: Path, flavour: str, renewals: Renewals) -> tuple[PrometheusHooks, Recorder]:
    url = renewals.url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_sync(url) as store:
        store.publish("g", Event(n=1))
    exporter, recorder, idle = PrometheusHooks(), Recorder(), Idle()
    hooks = [exporter, recorder, idle]
    options: dict[str, Any] = {"visibility": 1.0, "hooks": hooks, "handle_signals": False}
    # Any: the wrappers take any event, where the protocols name the event type.
    source: Any
    worker: Worker[Event] | AsyncWorker[Event]
    if flavour == "sync":
        source = lambda: FailingRenewals(url, renewals)  # noqa: E731
        worker = Worker(source, handle, **options)
    else:
        source = lambda: AsyncFailingRenewals(url, renewals)  # noqa: E731
        worker = AsyncWorker(source, ahandle, **options)
    running = RunningWorker(worker)
    try:
        recorder.wait_settled(1)
        assert idle.seen.wait(PATIENCE), "no empty claim reported"
    finally:
        assert running.stop() == 0
    return exporter, recorder


def _value(exporter: PrometheusHooks, name: str, **labels: str) -> float:
    value = exporter.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_renewal_that_fails_in_passing_counts_as_a_failure_not_a_lost_lease(
    tmp_path: Path, flavour: str
) -> None:
    exporter, recorder = _run(tmp_path, flavour, Renewals("passing"))
    assert recorder.outcomes() == [(1, 1, "acked")]
    assert _value(exporter, "transports_worker_renewal_failures_total") == 1
    assert _value(exporter, "transports_worker_renewals_total") >= 1
    for reason in LOST_REASONS:
        assert _value(exporter, "transports_worker_lost_leases_total", reason=reason) == 0
    assert _value(exporter, "transports_worker_deliveries_total", outcome="acked") == 1
    assert _value(exporter, "transports_worker_claimed_total") == 1
    assert _value(exporter, "transports_worker_empty_claims_total") >= 1
    assert _value(exporter, "transports_worker_in_flight") == 0


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_renewal_that_finds_the_lease_lost_counts_a_lost_lease_only(
    tmp_path: Path, flavour: str
) -> None:
    exporter, recorder = _run(tmp_path, flavour, Renewals("lost"))
    # The keeper made the error itself: no store said why.
    assert _value(exporter, "transports_worker_lost_leases_total", reason="unknown") == 1
    # The store still leases the message until its visibility ends: a later claim may
    # deliver it again before the worker stops, and that delivery is counted too.
    outcomes = [outcome for _, _, outcome in recorder.outcomes()]
    assert outcomes[0] == "lost"
    assert outcomes.count("lost") == 1
    assert _value(exporter, "transports_worker_lost_leases_total", reason="redelivered") == 0
    assert _value(exporter, "transports_worker_renewal_failures_total") == 0
    assert _value(exporter, "transports_worker_deliveries_total", outcome="lost") == 1
    assert _value(exporter, "transports_worker_deliveries_total", outcome="acked") == (
        outcomes.count("acked")
    )
    assert _value(exporter, "transports_worker_in_flight") == 0


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_lease_the_store_gave_to_another_worker_counts_as_lost_by_that_reason(
    tmp_path: Path, flavour: str
) -> None:
    exporter, recorder = _run(tmp_path, flavour, Renewals("taken"))
    assert recorder.outcomes() == [(1, 1, "lost")]  # the thief holds the message since
    lost = {
        reason: _value(exporter, "transports_worker_lost_leases_total", reason=reason)
        for reason in LOST_REASONS
    }
    assert lost == dict.fromkeys(LOST_REASONS, 0) | {"redelivered": 1}
    assert _value(exporter, "transports_worker_renewal_failures_total") == 0
