"""Without an injected clock every timestamp is the server's, as double precision."""

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
