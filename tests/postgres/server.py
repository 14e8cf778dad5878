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


def group_problems(url: str, schema: str) -> list[str]:
    """What is wrong with a schema's groups, read with a plain connection: each group's
    depth must count its messages and its head must be its first; every message must
    belong to a group that has a row. Empty when all is well."""
    s = f'"{schema}"'
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT coalesce(g.group_id, m.group_id), g.depth, g.head_seq, m.n, m.first "
            f"FROM {s}.groups g FULL JOIN (SELECT group_id, count(*) AS n, min(seq) AS first "
            f"FROM {s}.messages GROUP BY group_id) m ON m.group_id = g.group_id "
            f"WHERE g.group_id IS NULL OR m.group_id IS NULL "
            f"OR g.depth <> m.n OR g.head_seq <> m.first"
        ).fetchall()
    return [
        f"group {group!r}: depth {depth}, head {head}; its messages: {n}, first {first}"
        for group, depth, head, n, first in rows
    ]
