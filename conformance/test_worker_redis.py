"""The runtime suite (`transports_worker.testing.WorkerSuite`) on the Redis backend,
through both twins, each test on a queue of its own.

The passing outage: a private ``redis-server`` (its own directory and port) frozen with
SIGSTOP for the block's length and resumed with SIGCONT, the way a stalled host or a
long fork pause looks to a client; the worker's handles give up on a silent server
after a few tens of milliseconds (``socket_timeout``). The shared server cannot be
frozen without stalling every other test using it, so only the tests that ask for the
outage run on a private server; the rest run on the shared one.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.redis.server import PrivateServer, fresh_queue, private_server, with_queue
from transports_core import AsyncTransport, Transport, open_async_transport, open_transport
from transports_worker.testing import (
    AsyncTransportFactory,
    QuickHandles,
    TransportFactory,
    WorkerSuite,
)

QUICK = {"socket_timeout": "0.03", "connect_timeout": "0.03"}


class RedisOutage(QuickHandles):
    """Freezes a private server: every call in flight or sent meanwhile gets no answer."""

    def __init__(self, server: PrivateServer, url: str) -> None:
        super().__init__(url, **QUICK)
        self.server = server

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        process = self.server.process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(process.pid, signal.SIGCONT)


class TestWorkerRedis(WorkerSuite):
    @pytest.fixture
    def private(self, request: pytest.FixtureRequest) -> Iterator[PrivateServer | None]:
        if "outage" not in request.fixturenames:
            yield None
            return
        with private_server() as server:
            yield server

    @pytest.fixture
    def queue_url(self, private: PrivateServer | None) -> Iterator[str]:
        if private is not None:
            # Deleted with the server's directory; nobody else uses this server.
            yield with_queue(private.url, "work")
            return
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

    @pytest.fixture
    def outage(self, private: PrivateServer | None, queue_url: str) -> RedisOutage:
        assert private is not None
        return RedisOutage(private, queue_url)
