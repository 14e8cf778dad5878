"""`WorkerSuite`: the runtime's scenarios (one mixin per topic) and the fixtures they
share: the flavour (sync or async worker), the test's own handle, the recorder, and
``start``, which runs a worker on a thread of its own. The only module that imports
pytest's fixtures machinery beside the scenarios themselves."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar

import pytest

from transports_core import Event, Transport
from transports_worker._async import AsyncWorker
from transports_worker._context import AsyncContext, Context
from transports_worker._sync import Worker

from ._contention import ContentionScenarios
from ._faults import FaultScenarios
from ._leases import LeaseScenarios
from ._outcomes import OutcomeScenarios
from ._shutdown import ShutdownScenarios
from ._support import (
    PATIENCE,
    VISIBILITY,
    AsyncTransportFactory,
    Flavour,
    Outage,
    Recorder,
    RunningWorker,
    Start,
    TransportFactory,
)

__all__ = ["WorkerSuite"]


class WorkerSuite(
    LeaseScenarios,
    ShutdownScenarios,
    OutcomeScenarios,
    ContentionScenarios,
    FaultScenarios,
):
    """Every scenario of the runtime, for one backend. Override ``make_transport`` (and
    ``make_async_transport`` for the async worker; ``outage`` for transient failures)."""

    flavours: ClassVar[tuple[Flavour, ...]] = ("sync", "async")

    @pytest.fixture
    def make_transport(self) -> TransportFactory:
        raise NotImplementedError("override the make_transport fixture")

    @pytest.fixture
    def make_async_transport(self) -> AsyncTransportFactory | None:
        return None

    @pytest.fixture
    def outage(self) -> Outage | None:
        return None

    @pytest.fixture(params=["sync", "async"])
    def flavour(self, request: pytest.FixtureRequest) -> Flavour:
        chosen: Flavour = request.param
        return chosen

    @pytest.fixture
    def store(self, make_transport: TransportFactory) -> Iterator[Transport[Event]]:
        """A handle of the test's own, beside the worker's."""
        with make_transport() as handle:
            yield handle

    @pytest.fixture
    def down(self, outage: Outage | None, store: Transport[Event]) -> Outage:
        """The ``outage`` fixture, for a scenario that needs it, with one message queued."""
        if outage is None:
            pytest.skip("no outage fixture: the backend cannot be made briefly unavailable")
        store.publish("g", Event(n=1))
        return outage

    @pytest.fixture
    def recorder(self) -> Recorder:
        return Recorder()

    @pytest.fixture
    def start(
        self,
        flavour: Flavour,
        make_transport: TransportFactory,
        make_async_transport: AsyncTransportFactory | None,
        recorder: Recorder,
    ) -> Iterator[Start]:
        """``start(sync_handler, async_handler, **options)``: run a worker of the test's
        flavour on its own thread; every worker still running is stopped at the end."""
        if flavour == "async" and make_async_transport is None:
            pytest.skip("no make_async_transport fixture: the async worker is not run")
        started: list[RunningWorker] = []

        def run(
            sync: Callable[[Event, Context[Event]], object],
            asynchronous: Callable[[Event, AsyncContext[Event]], Awaitable[object]],
            source: Any = None,
            **options: Any,
        ) -> RunningWorker:
            options.setdefault("visibility", VISIBILITY)
            options.setdefault("grace", PATIENCE)
            options.setdefault("hooks", [recorder])
            worker: Any
            event_type = options.pop("event_type", Event)
            if flavour == "sync":
                if source is None:
                    source = lambda: make_transport(event_type=event_type)  # noqa: E731
                elif not callable(source):
                    source = source.transport
                worker = Worker(source, sync, handle_signals=False, **options)
            else:
                assert make_async_transport is not None
                if source is None:
                    source = lambda: make_async_transport(event_type=event_type)  # noqa: E731
                elif not callable(source):
                    source = source.async_transport
                worker = AsyncWorker(source, asynchronous, handle_signals=False, **options)
            running = RunningWorker(worker)
            started.append(running)
            return running

        yield run
        for running in started:
            running.worker.stop()
            running.worker.stop()
            with contextlib.suppress(Exception):
                running.join()
