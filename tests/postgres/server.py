"""Where the PostgreSQL tests find their server (see `tests._services` for the order:
``TRANSPORTS_POSTGRES_URL``, the local server at `LOCAL_URL`, testcontainers, else skip, or
fail under ``CI=true``), and a schema of their own on it.
Used by ``tests/postgres``, ``tests/worker`` and ``conformance/``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from tests import _services

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str) -> str | None:
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip()[:200]
    return None


def _start_container(image: str) -> tuple[str, Callable[[], None]]:
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found,unused-ignore]

    container = PostgresContainer(image, driver=None).start()
    return str(container.get_connection_url()), container.stop


SERVICE = _services.Service("PostgreSQL", "postgres:15", LOCAL_URL, _answers, _start_container)
# The server's URL, or skip (fail under CI) when none answers.
server_url = SERVICE.url


def with_schema(url: str, schema: str, **query: object) -> str:
    return _services.with_query(url, schema=schema, **query)


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
