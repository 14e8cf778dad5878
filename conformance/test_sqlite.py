"""The conformance suite against the SQLite backends of this repo: a file, ``:memory:``,
and the async twin on a file."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from transports_core import Transport, open_async_transport, open_transport
from transports_core.conformance import (
    ADMIN,
    CLOCK,
    DURABLE,
    MULTI_HANDLE,
    MULTIPROCESS,
    AsyncTransportFactory,
    AsyncTransportSuite,
    BlockingTransport,
    ManualClock,
    Portal,
    TransportFactory,
    TransportSuite,
)


class TestSqliteFile(TransportSuite):
    capabilities = frozenset({ADMIN, CLOCK, DURABLE, MULTI_HANDLE, MULTIPROCESS})

    @pytest.fixture
    def transport_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'queue.db'}"

    @pytest.fixture
    def make_transport(self, transport_url: str, clock: ManualClock) -> TransportFactory:
        return lambda **options: open_transport(transport_url, clock=clock, **options)

    @pytest.fixture
    def make_store(self, tmp_path: Path, clock: ManualClock) -> Callable[[], TransportFactory]:
        stores = itertools.count()

        def store() -> TransportFactory:
            url = f"sqlite:///{tmp_path / f'model-{next(stores)}.db'}"
            return lambda **options: open_transport(url, clock=clock, **options)

        return store


class TestSqliteMemory(TransportSuite):
    # One in-memory database per connection: every "handle" is the one transport, which
    # is neither durable nor reachable from another process.
    capabilities = frozenset({ADMIN, CLOCK})

    @pytest.fixture
    def make_transport(self, clock: ManualClock) -> Iterator[TransportFactory]:
        with open_transport("sqlite:///:memory:", clock=clock) as shared:

            def factory(**options: object) -> Transport[Any]:
                # Options ask for a handle of their own: a database of its own, here.
                if options:
                    return open_transport("sqlite:///:memory:", clock=clock, **options)
                return shared

            yield factory


class TestAsyncSqliteFile(AsyncTransportSuite):
    capabilities = frozenset({ADMIN, CLOCK, DURABLE, MULTI_HANDLE, MULTIPROCESS})

    @pytest.fixture
    def transport_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'queue.db'}"

    @pytest.fixture
    def make_async_transport(self, transport_url: str, clock: ManualClock) -> AsyncTransportFactory:
        return lambda **options: open_async_transport(transport_url, clock=clock, **options)

    @pytest.fixture
    def make_store(
        self, tmp_path: Path, clock: ManualClock, _conformance_portal: Portal
    ) -> Callable[[], TransportFactory]:
        stores = itertools.count()

        def store() -> TransportFactory:
            url = f"sqlite:///{tmp_path / f'model-{next(stores)}.db'}"

            def factory(**options: object) -> Transport[Any]:
                opened = _conformance_portal.call(
                    lambda: open_async_transport(url, clock=clock, **options)
                )
                return BlockingTransport(_conformance_portal, opened)

            return factory

        return store
