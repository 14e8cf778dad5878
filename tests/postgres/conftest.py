"""Fixtures for the PostgreSQL tests: a schema of their own on the server (see `server`)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests._services import scratch_fixture

from .server import fresh_schema, with_schema

# (server URL, schema name): the schema is dropped when the test ends.
schema_url = scratch_fixture("schema_url", lambda: fresh_schema("tp"))


@pytest.fixture
def schema(schema_url: tuple[str, str]) -> str:
    """The name of the test's own schema."""
    return schema_url[1]


@pytest.fixture
def queue_url(schema_url: tuple[str, str]) -> str:
    url, schema = schema_url
    return with_schema(url, schema, pool_min_size=0, pool_max_size=4)


@pytest.fixture
def raw(schema_url: tuple[str, str]) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain connection to the server, outside any transport (autocommit)."""
    with psycopg.connect(schema_url[0], autocommit=True) as conn:
        yield conn
