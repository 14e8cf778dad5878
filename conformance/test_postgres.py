"""The conformance suite against the PostgreSQL backend of this repo, sync and async. Each
test gets a schema of its own on the server, dropped when it ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres.server import fresh_schema, with_schema
from transports_core import AsyncTransport, Event, Transport, open_async_transport, open_transport
from transports_core.conformance import (
    CAPABILITIES,
    CLOCK,
    DURABLE,
    MULTI_HANDLE,
    MULTIPROCESS,
    AsyncTransportSuite,
    ManualClock,
    TransportSuite,
)

# Declared when the suite knows them (its engineer is adding them now).
_LATER = frozenset({"admin", "parallel-claims"}) & CAPABILITIES
POSTGRES_CAPABILITIES = frozenset({CLOCK, DURABLE, MULTI_HANDLE, MULTIPROCESS}) | _LATER


class _OwnSchema:
    @pytest.fixture
    def transport_url(self) -> Iterator[str]:
        # Small pools: several test runs share one server's connections.
        with fresh_schema("conf") as (url, schema):
            yield with_schema(url, schema, pool_min_size=0, pool_max_size=4)


class TestPostgres(_OwnSchema, TransportSuite):
    capabilities = POSTGRES_CAPABILITIES

    @pytest.fixture
    def make_transport(self, transport_url: str, clock: ManualClock) -> object:
        def factory(**options: object) -> Transport[Event]:
            return open_transport(transport_url, clock=clock, **options)

        return factory


class TestAsyncPostgres(_OwnSchema, AsyncTransportSuite):
    capabilities = POSTGRES_CAPABILITIES

    @pytest.fixture
    def make_async_transport(self, transport_url: str, clock: ManualClock) -> object:
        def factory(**options: object) -> AsyncTransport[Event]:
            return open_async_transport(transport_url, clock=clock, **options)

        return factory
