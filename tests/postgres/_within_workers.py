"""What the child processes of the `within` tests run (importable by spawn)."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from transports_core import Event, open_transport
from transports_postgres import PostgresTransport


def claim_once(url: str, out: str) -> None:
    """Claim with a long wait; write the seq leased and the monotonic time it came."""
    with open_transport(url) as transport:
        lease = transport.claim("blocked", 60, wait=30)
        at = time.monotonic()
        Path(out).write_text(f"{None if lease is None else lease.seq} {at!r}\n")


def write_and_publish(url: str, table: str, first: int, ready: str) -> None:
    """For n = first, first + 1, ...: insert n into ``table`` and publish Event(n=n), in
    one transaction of this process's connection, then commit; until killed."""
    server = url.partition("?")[0]
    transport = open_transport(url)
    assert isinstance(transport, PostgresTransport)
    with transport, psycopg.connect(server) as conn:
        n = first
        while True:
            conn.execute(f"INSERT INTO {table} (n) VALUES (%s)", (n,))
            transport.within(conn).publish(f"g{n % 4}", Event(n=n))
            conn.commit()
            if n == first:
                Path(ready).write_text("ready\n")
            n += 1
