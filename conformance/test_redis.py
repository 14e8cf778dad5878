"""The conformance suite against the Redis backend of this repo, sync and async. Each test
gets a queue of its own on the server; after the test the read-only invariant script
checks its structures, then its keys are deleted.

"durable" here is the suite's sense: the queue outlives its handles (closing every handle
and opening a new one loses nothing), which holds on any server that is not restarted.
What survives a crash of the server itself is tested on a private AOF server in
``tests/redis/test_durability.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis.server import fresh_queue, with_queue
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

# Declared when the suite knows it (its engineer is adding it now). Not "parallel-claims":
# a script runs alone on the server, so claims serialize and strict round-robin holds.
_LATER = frozenset({"admin"}) & CAPABILITIES
REDIS_CAPABILITIES = frozenset({CLOCK, DURABLE, MULTI_HANDLE, MULTIPROCESS}) | _LATER


class _OwnQueue:
    @pytest.fixture
    def transport_url(self) -> Iterator[str]:
        with fresh_queue("conf") as (url, queue):
            yield with_queue(url, queue)


class TestRedis(_OwnQueue, TransportSuite):
    capabilities = REDIS_CAPABILITIES

    @pytest.fixture
    def make_transport(self, transport_url: str, clock: ManualClock) -> object:
        def factory(**options: object) -> Transport[Event]:
            return open_transport(transport_url, clock=clock, **options)

        return factory


class TestAsyncRedis(_OwnQueue, AsyncTransportSuite):
    capabilities = REDIS_CAPABILITIES

    @pytest.fixture
    def make_async_transport(self, transport_url: str, clock: ManualClock) -> object:
        def factory(**options: object) -> AsyncTransport[Event]:
            return open_async_transport(transport_url, clock=clock, **options)

        return factory
