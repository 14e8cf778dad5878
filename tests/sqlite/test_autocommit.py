"""Operations that write with one statement run it on its own (autocommit), with no
BEGIN/COMMIT round trips; the others run in a transaction. Seen from SQLite itself, through
the connection's trace callback, and from another connection: a write waiting for the
write lock goes through once the holder lets go, and a lease stays fenced."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, LeaseLost
from transports_core._codec import EventCodec
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteTransport, _ops
from transports_sqlite import _sql as sql

from ._support import query, traced
from .conftest import OpenDb


def test_single_statement_writes_send_sqlite_that_statement_only(
    open_db: OpenDb, clock: ManualClock, db_path: Path
) -> None:
    # At synchronous=normal: at full, the lease moves are bracketed (test_durability).
    transport = open_db(synchronous="normal")
    statements = traced(transport)
    transport.publish("g", Event(i=1))
    transport.publish("g", Event(i=2))
    assert [s[:19] for s in statements] == ["INSERT INTO publish"] * 2

    # Nothing has lapsed: the claim is one statement, in a transaction of its own.
    statements.clear()
    lease = transport.claim("w", 30)
    assert lease is not None
    assert [s[:15] for s in statements] == [sql.BEGIN_WRITE, "UPDATE groups S", "COMMIT"]

    for settle in (
        lambda: transport.extend(lease, 60),
        lambda: transport.nack(lease, 5),
    ):
        statements.clear()
        settle()
        assert [s[:13] for s in statements] == ["UPDATE groups"]
    # The park has ended: the first statement claims nothing, and the claim goes on by
    # waking the group.
    clock.advance(6)
    statements.clear()
    lease = transport.claim("w", 30)
    assert lease is not None
    assert statements[0] == sql.BEGIN_WRITE
    assert statements[2].startswith("INSERT INTO promote")  # no timer: moves nothing
    assert statements[3].startswith("UPDATE groups SET busy_until = NULL")
    assert statements[-1] == "COMMIT"
    statements.clear()
    transport.ack(lease)
    assert [s[:20] for s in statements] == ["DELETE FROM messages"]
    assert query(db_path, "SELECT count(*) FROM messages") == [(1,)]


CODEC: EventCodec[Event] = EventCodec(Event)


@pytest.mark.parametrize(
    ("op", "begin"),
    [
        (lambda lease: _ops.Publish(CODEC, "g", Event(), 0), None),
        (lambda lease: _ops.Ack(lease), None),
        (lambda lease: _ops.Nack(lease, 0), None),
        (lambda lease: _ops.Nack(lease, 3), None),
        (lambda lease: _ops.Extend(lease, 3), None),
        (lambda lease: _ops.PublishMany(CODEC, [("g", Event(), 0)]), sql.BEGIN_WRITE),
        (lambda lease: _ops.Claim("w", 3, 0), sql.BEGIN_WRITE),
        (lambda lease: _ops.Requeue(1), sql.BEGIN_WRITE),
        (lambda lease: _ops.Stats(), sql.BEGIN_READ),
    ],
)
def test_each_operation_declares_how_it_runs(op: Any, begin: str | None) -> None:
    assert op(Lease(1, "g", Event(), "w", 1, 0.0)).begin == begin


def test_autocommit_write_waits_for_the_write_lock_and_then_goes_through(
    transport: SqliteTransport[Any], db_path: Path
) -> None:
    transport.publish("g", Event(i=0))
    lease = transport.claim("w", 30)
    assert lease is not None
    with closing(sqlite3.connect(db_path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        other.execute(
            sql.PUBLISH.sql,
            sql.PUBLISH.bind({"group_id": "h", "priority": 0, "event": "{}", "now": 0.0}),
        ).fetchall()
        done = threading.Event()
        errors: list[BaseException] = []

        def settle() -> None:
            try:
                transport.ack(lease)
                transport.publish("g", Event(i=1))
            except BaseException as exc:  # reported to the test thread
                errors.append(exc)
            done.set()

        worker = threading.Thread(target=settle)
        worker.start()
        # The writes cannot finish while `other` holds the write lock (busy_timeout 5 s).
        assert not done.wait(0.2)
        other.execute("COMMIT")
        worker.join(10)
    assert errors == []
    assert query(db_path, "SELECT group_id, event FROM messages ORDER BY seq") == [
        ("h", "{}"),
        ("g", '{"i":1}'),
    ]
    with pytest.raises(LeaseLost):
        transport.ack(lease)
