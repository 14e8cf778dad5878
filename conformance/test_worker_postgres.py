"""The runtime suite (`transports_worker.testing.WorkerSuite`) on the PostgreSQL backend,
through both twins, each test in a schema of its own. The passing outage: another
session holds the queue's tables locked, and the worker's sessions give up on a lock
after a few tens of milliseconds (``lock_timeout``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from tests.postgres.server import fresh_schema, with_schema
from transports_core import AsyncTransport, Event, Transport, open_async_transport, open_transport
from transports_worker.testing import (
    AsyncTransportFactory,
    QuickHandles,
    TransportFactory,
    WorkerSuite,
)

QUICK = quote("-c lock_timeout=30")


class PostgresOutage(QuickHandles):
    def __init__(self, server: str, url: str, schema: str) -> None:
        super().__init__(f"{url}&options={QUICK}")
        self.server, self.schema = server, schema

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        with psycopg.connect(self.server) as conn:
            conn.execute(
                f'LOCK TABLE "{self.schema}".messages, "{self.schema}".groups '
                "IN ACCESS EXCLUSIVE MODE"
            )
            yield
            conn.rollback()


class TestWorkerPostgres(WorkerSuite):
    @pytest.fixture
    def schema(self) -> Iterator[tuple[str, str, str]]:
        with fresh_schema("work") as (server, schema):
            # Small pools: several test runs share one server's connections.
            yield server, schema, with_schema(server, schema, pool_min_size=0, pool_max_size=4)

    @pytest.fixture
    def make_transport(self, schema: tuple[str, str, str]) -> TransportFactory:
        def make(**options: Any) -> Transport[Any]:
            return open_transport(schema[2], **options)

        return make

    @pytest.fixture
    def make_async_transport(self, schema: tuple[str, str, str]) -> AsyncTransportFactory:
        def make(**options: Any) -> AsyncTransport[Any]:
            return open_async_transport(schema[2], **options)

        return make

    @pytest.fixture
    def outage(self, schema: tuple[str, str, str], store: Transport[Event]) -> PostgresOutage:
        # ``store`` first: the schema and its tables exist before anyone locks them.
        server, name, url = schema
        return PostgresOutage(server, url, name)
