"""Fixtures for the PostgreSQL tests: a schema of their own on the server (see `server`)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from transports_core import Event, Transport, open_transport

from .server import fresh_schema, with_schema


@pytest.fixture
def schema_url() -> Iterator[tuple[str, str]]:
    """(server URL, schema name): the schema is dropped when the test ends."""
    with fresh_schema("tp") as pair:
        yield pair


@pytest.fixture
def queue_url(schema_url: tuple[str, str]) -> str:
    url, schema = schema_url
    return with_schema(url, schema, pool_min_size=0, pool_max_size=4)


@pytest.fixture
def queue(queue_url: str) -> Iterator[Transport[Event]]:
    with open_transport(queue_url) as transport:
        yield transport


@pytest.fixture
def raw(schema_url: tuple[str, str]) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain connection to the server, outside any transport (autocommit)."""
    with psycopg.connect(schema_url[0], autocommit=True) as conn:
        yield conn
