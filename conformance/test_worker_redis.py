"""The runtime suite (`transports_worker.testing.WorkerSuite`) on the Redis backend,
through both twins, each test on a queue of its own. No outage fixture: making a shared
server briefly unavailable (CLIENT PAUSE) would stall every other test using it, so the
two transient-failure scenarios skip here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.redis.server import fresh_queue, with_queue
from transports_core import AsyncTransport, Transport, open_async_transport, open_transport
from transports_worker.testing import AsyncTransportFactory, TransportFactory, WorkerSuite


class TestWorkerRedis(WorkerSuite):
    @pytest.fixture
    def queue_url(self) -> Iterator[str]:
        with fresh_queue("work") as (url, queue):
            yield with_queue(url, queue)

    @pytest.fixture
    def make_transport(self, queue_url: str) -> TransportFactory:
        def make(**options: Any) -> Transport[Any]:
            return open_transport(queue_url, **options)

        return make

    @pytest.fixture
    def make_async_transport(self, queue_url: str) -> AsyncTransportFactory:
        def make(**options: Any) -> AsyncTransport[Any]:
            return open_async_transport(queue_url, **options)

        return make
