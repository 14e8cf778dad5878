"""At ``synchronous=full`` an operation that only moves a lease (claim, nack, extend)
commits without a flush of its own; everything that adds or removes a message flushes.
Seen from SQLite itself, through the connection's trace callback, and from the level the
connection is left at. (That a power cut then only makes a message due again is an
argument, in `_ops.lease_durability`; no test here can cut the power.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from transports_core import Event, LeaseLost
from transports_sqlite import SqliteTransport

from ._support import traced
from .conftest import OpenDb

NORMAL, FULL = "PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"


def _level(transport: SqliteTransport[Any]) -> int:
    assert transport._engine.conn is not None
    ((level,),) = transport._engine.conn.execute("PRAGMA synchronous").fetchall()
    return int(level)


def test_at_full_lease_moves_commit_at_normal_and_message_writes_flush(
    open_db: OpenDb,
) -> None:
    transport = open_db(synchronous="full", max_attempts=5)
    statements = traced(transport)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("publish", lambda: transport.publish("g", Event(i=1))),
        ("publish_many", lambda: transport.publish_many([("g", Event(i=2), 0)])),
        ("claim", lambda: transport.claim("w", 30)),
    ]
    for name, call in calls:
        statements.clear()
        call()
        bracketed = statements[0] == NORMAL and statements[-1] == FULL
        assert bracketed == (name == "claim"), (name, statements)
        assert _level(transport) == 2, name
    lease = transport.claim("w", 30)  # the next message: g's head is leased, so none
    assert lease is None
    transport.publish("h", Event(i=3))
    lease = transport.claim("w", 30)
    assert lease is not None
    for settle in (lambda: transport.extend(lease, 60), lambda: transport.nack(lease)):
        statements.clear()
        settle()
        assert statements[0] == NORMAL, statements
        assert statements[-1] == FULL, statements
        assert len(statements) == 3, statements  # the one write between them
    lease = transport.claim("w", 30)
    assert lease is not None
    statements.clear()
    transport.ack(lease)
    assert NORMAL not in statements, statements


def test_a_failed_lease_move_puts_the_level_back(open_db: OpenDb) -> None:
    transport = open_db(synchronous="full")
    transport.publish("g", Event(i=1))
    lease = transport.claim("w", 30)
    assert lease is not None
    transport.ack(lease)
    with pytest.raises(LeaseLost):
        transport.nack(lease)
    assert _level(transport) == 2


@pytest.mark.parametrize(("synchronous", "level"), [("normal", 1), ("extra", 3), ("off", 0)])
def test_other_levels_run_every_operation_as_it_is(
    open_db: OpenDb, synchronous: str, level: int
) -> None:
    transport = open_db(synchronous=synchronous)
    transport.publish("g", Event(i=1))
    statements = traced(transport)
    lease = transport.claim("w", 30)
    assert lease is not None
    transport.nack(lease)
    assert not [s for s in statements if s.startswith("PRAGMA")], statements
    assert _level(transport) == level
