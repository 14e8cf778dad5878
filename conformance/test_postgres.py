"""The conformance suite against the PostgreSQL backend of this repo, sync and async, with
every capability. Each test gets a schema of its own on the server, dropped when it ends."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import pytest

from conformance._suites import AsyncUrlSuite, UrlSuite
from tests.postgres.server import fresh_schema, with_schema
from transports_core.conformance import CAPABILITIES


class _OwnSchema:
    capabilities: ClassVar[Iterable[str]] = CAPABILITIES

    @pytest.fixture
    def transport_url(self) -> Iterator[str]:
        # Small pools: several test runs share one server's connections.
        with fresh_schema("conf") as (url, schema):
            yield with_schema(url, schema, pool_min_size=0, pool_max_size=4)


class TestPostgres(_OwnSchema, UrlSuite):
    pass


class TestAsyncPostgres(_OwnSchema, AsyncUrlSuite):
    pass
