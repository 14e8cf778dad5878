"""The runtime suite: what `Worker` and `AsyncWorker` promise, as pytest scenarios that
any backend runs from a short test file, beside the conformance suite.

    from transports_worker.testing import WorkerSuite

    class TestWorkerMine(WorkerSuite):
        @pytest.fixture
        def make_transport(self, tmp_path) -> TransportFactory:
            return lambda **options: open_transport(f"mine:///{tmp_path / 'q'}", **options)

        @pytest.fixture
        def make_async_transport(self, tmp_path) -> AsyncTransportFactory:  # optional
            return lambda **options: open_async_transport(f"mine:///{tmp_path / 'q'}", **options)

Each call of a factory opens an independent handle on one store, with real time (the runtime's
leases are real). Every scenario runs with a sync handler on `Worker` and, when
``make_async_transport`` is given, with an async handler on `AsyncWorker`. Scenarios
that need dead letters skip unless the transport is a `TransportAdmin` and ``max_attempts``
is left unset; the transient-failure scenarios need the ``outage`` fixture (see
`Outage`); the fault scenarios wrap the factory's handles in ones that stall or fail in
passing. Leases here are short (about a second) and every wait has a wide margin, so a
slow machine makes the suite slower, not flaky. Imports pytest; the only package of the
runtime that does.

One module per topic: `_leases`, `_shutdown`, `_outcomes`, `_contention` and `_faults`
hold the scenarios, `_support` what they share, and `_suite` the fixtures and
`WorkerSuite`, which composes them.
"""

from __future__ import annotations

from ._faults import AsyncFaulty, Faults, Faulty
from ._suite import WorkerSuite
from ._support import (
    AsyncTransportFactory,
    Outage,
    QuickHandles,
    Recorder,
    RunningWorker,
    TransportFactory,
)

__all__ = [
    "AsyncFaulty",
    "AsyncTransportFactory",
    "Faults",
    "Faulty",
    "Outage",
    "QuickHandles",
    "Recorder",
    "RunningWorker",
    "TransportFactory",
    "WorkerSuite",
]
