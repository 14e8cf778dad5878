"""Where the PostgreSQL tests find their server, and a schema of their own on it.

Order: ``TRANSPORTS_POSTGRES_URL``; else the local server at `LOCAL_URL`; else skip with a
message saying how to run them. Under ``CI=true`` an unreachable server fails the run
instead. (testcontainers is left to users' machines: no Docker engine answers here.)
Used by ``tests/postgres`` and ``conformance/test_postgres.py``.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import psycopg
import pytest

from transports_core import redact_url

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/test"
HOW = (
    "set TRANSPORTS_POSTGRES_URL=postgresql://USER@HOST:PORT/DB, or run PostgreSQL on "
    "127.0.0.1:5432 with a database 'test' that user 'postgres' can use"
)


@functools.cache
def _reachable() -> tuple[str | None, str]:
    url = os.environ.get("TRANSPORTS_POSTGRES_URL") or LOCAL_URL
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return None, f"no PostgreSQL at {redact_url(url)} ({str(exc).strip()[:200]}): {HOW}"
    return url, ""


def server_url() -> str:
    """The server's URL (no schema), or skip (fail under CI) when none answers."""
    url, why = _reachable()
    if url is None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return url


def with_schema(url: str, schema: str, **query: object) -> str:
    parts = [f"schema={schema}", *(f"{key}={value}" for key, value in query.items())]
    joiner = "&" if urlsplit(url).query else "?"
    return f"{url}{joiner}{'&'.join(parts)}"


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def fresh_schema(prefix: str = "t") -> Iterator[tuple[str, str]]:
    """A new schema name (not created: the transport creates it) and the server URL;
    dropped at the end whatever happened."""
    url = server_url()
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield url, schema
    finally:
        drop_schema(url, schema)
