"""Without an injected clock every timestamp is the server's, as double precision; events
are text, byte for byte; the package exports what it documents."""

from __future__ import annotations

from typing import Any

import psycopg

from transports_core import Event, Transport


def test_leases_are_timed_by_the_server_clock(
    queue: Transport[Event], raw: psycopg.Connection[Any]
) -> None:
    queue.publish("g", Event(n=1))
    row = raw.execute("SELECT date_part('epoch', clock_timestamp())").fetchone()
    assert row is not None
    before = row[0]
    lease = queue.claim("w", 100)
    row = raw.execute("SELECT date_part('epoch', clock_timestamp())").fetchone()
    assert row is not None
    after = row[0]
    assert lease is not None
    assert type(lease.expires_at) is float  # not Decimal, as extract() would give
    assert before + 100 <= lease.expires_at <= after + 100
    extended = queue.extend(lease, 200)
    assert type(extended.expires_at) is float
    assert after + 200 <= extended.expires_at


def test_events_are_stored_byte_for_byte(
    queue: Transport[Event], raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    # jsonb would sort the keys and add spaces: stored as text, they stay as encoded.
    seq = queue.publish("g", Event(zeta=1, alpha=[1.50, "é"]))
    row = raw.execute(
        f'SELECT event, pg_typeof(event)::text FROM "{schema_url[1]}".messages WHERE seq = %s',
        (seq,),
    ).fetchone()
    assert row == ('{"zeta":1,"alpha":[1.5,"é"]}', "text")


def test_the_package_exports_what_it_documents() -> None:
    import transports_postgres

    assert transports_postgres.__all__ == sorted(transports_postgres.__all__)
    assert set(transports_postgres.__all__) == {
        "AsyncPostgresTransport",
        "PostgresOptions",
        "PostgresTransport",
        "backend",
        "migrate",
    }
    assert all(hasattr(transports_postgres, name) for name in transports_postgres.__all__)
