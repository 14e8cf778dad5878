"""The conformance suite against the PostgreSQL backend of this repo, sync and async, with
every capability. Each test gets a schema of its own on the server, dropped when it ends."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import psycopg
import pytest

from conformance._suites import AsyncSession, AsyncUrlSuite, Session, UrlSuite, opener
from tests.postgres.server import fresh_schema, with_schema
from transports_core import Transport
from transports_core.conformance import (
    CAPABILITIES,
    AsyncJoinFactory,
    JoinFactory,
    ManualClock,
    TransportFactory,
)
from transports_core.conformance._stateful import HYPOTHESIS_MISSING, check_against_model


class _OwnSchema:
    capabilities: ClassVar[Iterable[str]] = CAPABILITIES
    server: str

    @pytest.fixture
    def transport_url(self) -> Iterator[str]:
        # Small pools: several test runs share one server's connections.
        with fresh_schema("conf") as (url, schema):
            self.server = url
            yield with_schema(url, schema, pool_min_size=0, pool_max_size=4)

    @pytest.fixture
    def join_async_session(self, transport_url: str) -> AsyncJoinFactory:
        async def open_session() -> AsyncSession:
            return AsyncSession(await psycopg.AsyncConnection.connect(self.server))

        return open_session


class TestPostgres(_OwnSchema, UrlSuite):
    # Only here: the async suite makes its join_session of join_async_session.
    @pytest.fixture
    def join_session(self, transport_url: str) -> JoinFactory:
        return lambda: Session(psycopg.connect(self.server))


class TestAsyncPostgres(_OwnSchema, AsyncUrlSuite):
    pass


def _connections(url: str, name: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_model_scenario_closes_the_handles_of_each_example() -> None:
    # The examples of one test share its store: handles left open by each one add up
    # to more connections than the server takes ("too many clients already").
    if HYPOTHESIS_MISSING is not None:
        pytest.skip(HYPOTHESIS_MISSING)
    name = f"model-{uuid.uuid4().hex[:12]}"
    kept: list[Transport[Any]] = []
    clock = ManualClock()
    with fresh_schema("conf") as (url, schema):
        open_one = opener(
            with_schema(url, schema, pool_min_size=1, pool_max_size=4, application_name=name),
            clock,
        )

        def store() -> TransportFactory:
            # As the suite's `open` does: the test, not the example, keeps each handle.
            def factory(**options: object) -> Transport[Any]:
                kept.append(open_one(**options))
                return kept[-1]

            return factory

        try:
            check_against_model(store, 2, False, clock, 6, 8, shrink=False, fresh=False)
            # A closed connection leaves pg_stat_activity a moment after the client goes.
            deadline = time.monotonic() + 10
            while (left := _connections(url, name)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert left == 0, f"the model scenario left {left} of {len(kept)} handles open"
        finally:
            for handle in kept:
                handle.close()
