"""`transport.within(conn)`: publish and settle on the caller's own sqlite3 connection,
inside the caller's transaction, on real files; seen from other connections and from
other processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from transports_core import Duplicate, Event, LeaseLost, Message, TransportError, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteTransport

from . import _workers
from ._support import chain_problems, query, snapshot
from .conftest import OpenDb


@pytest.fixture
def conn(db_path: Path, transport: SqliteTransport[Any]) -> Iterator[sqlite3.Connection]:
    """The caller's own connection to the queue's file (sqlite3's defaults: legacy
    transaction control), with a table of the caller's own."""
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TABLE mine (n INTEGER)")
        conn.commit()
        yield conn


def open_transaction(conn: sqlite3.Connection) -> bool:
    """``conn.in_transaction``, read afresh each time (mypy keeps what an assert said)."""
    return conn.in_transaction


def mine(db_path: Path) -> list[int]:
    return [n for (n,) in query(db_path, "SELECT n FROM mine ORDER BY n")]


def test_rollback_leaves_nothing_and_the_acked_lease_current(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    transport.publish("g", Event(n=0))
    lease = transport.claim("w", visibility=60)
    assert lease is not None
    before = snapshot(db_path)
    within = transport.within(conn)

    conn.execute("INSERT INTO mine VALUES (1)")
    within.publish("g", Event(n=1))
    within.publish("h", Event(n=2), key="k")
    within.publish_many([("h", Event(n=3), 0), Message("i", Event(n=4), key="k")])
    within.ack(lease)
    assert conn.in_transaction
    conn.rollback()

    assert snapshot(db_path) == before
    assert query(db_path, "SELECT count(*) FROM keys") == [(0,)]
    assert mine(db_path) == []
    transport.ack(lease)  # still current
    assert transport.claim("w", visibility=60) is None


def test_commit_publishes_once_together_with_the_callers_writes(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    within = transport.within(conn)
    with conn:
        conn.execute("INSERT INTO mine VALUES (1)")
        seq = within.publish("g", Event(n=1))
        # Not visible to anyone else before the commit.
        assert query(db_path, "SELECT count(*) FROM messages") == [(0,)]
    assert mine(db_path) == [1]
    lease = transport.claim("w", visibility=60)
    assert lease is not None
    assert (lease.seq, lease.event) == (seq, Event(n=1))
    assert transport.claim("w2", visibility=60) is None
    assert transport.stats().ready == 0


def test_a_commit_wakes_a_claim_waiting_in_another_process(db_path: Path, open_db: OpenDb) -> None:
    transport = open_db(clock=time.time)  # the child's clock is the real one
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_workers.claim_waiting, args=(str(db_path), 30.0, ready, send))
    child.start()
    try:
        assert ready.get(timeout=60) == "waiting"
        with closing(sqlite3.connect(db_path)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            seq = transport.within(conn).publish("g", Event(n=1))
            # The transaction stays open long enough for a claim that could see the
            # message to take it; none can, as it is not committed.
            assert not receive.poll(0.5), "the claim returned before the commit"
            committing = time.monotonic()
            conn.commit()
        assert receive.poll(10), "the commit did not wake the waiting claim"
        leased, returned = receive.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    assert leased == (seq, {"n": 1})
    assert committing < returned < committing + 10
    assert child.exitcode == 0


def test_ack_after_takeover_raises_lease_lost_and_changes_nothing(
    db_path: Path,
    transport: SqliteTransport[Any],
    conn: sqlite3.Connection,
    clock: ManualClock,
) -> None:
    transport.publish("g", Event(n=1))
    stale = transport.claim("w1", visibility=10)
    assert stale is not None
    clock.advance(11)
    current = transport.claim("w2", visibility=60)
    assert current is not None
    assert current.seq == stale.seq
    before = snapshot(db_path)

    within = transport.within(conn)
    conn.execute("INSERT INTO mine VALUES (1)")
    with pytest.raises(LeaseLost) as lost:
        within.ack(stale)
    assert lost.value.lease == stale
    # The caller's transaction goes on, and commits its own write only.
    assert conn.in_transaction
    conn.commit()
    assert mine(db_path) == [1]
    assert snapshot(db_path) == before
    transport.ack(current)


def test_an_acked_message_stays_locked_until_the_caller_ends_its_transaction(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection, open_db: OpenDb
) -> None:
    transport.publish("g", Event(n=1))
    lease = transport.claim("w1", visibility=60)
    assert lease is not None
    other = open_db(busy_timeout=50)
    transport.within(conn).ack(lease)
    # The lease may lapse meanwhile: no other worker gets in before the caller is done.
    with pytest.raises(TransportError, match="locked"):
        other.claim("w2", visibility=60)
    conn.commit()
    assert other.claim("w2", visibility=60) is None


def test_a_failed_operation_leaves_the_callers_transaction_as_it_was(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    """A batch that fails after some of its statements ran (here on a trigger of the
    caller's, after its groups were written) is undone alone."""
    transport.publish("a", Event(n=0))
    conn.execute(
        "CREATE TEMP TRIGGER refuse BEFORE INSERT ON main.messages WHEN NEW.group_id = 'boom'"
        " BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    within = transport.within(conn)
    with conn:
        conn.execute("INSERT INTO mine VALUES (1)")
        within.publish("a", Event(n=1))
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            within.publish_many([("a", Event(n=2), 0), ("boom", Event(n=3), 0)])
        assert conn.in_transaction
    assert mine(db_path) == [1]
    assert chain_problems(db_path) == []
    assert query(db_path, "SELECT group_id, depth FROM groups") == [("a", 2)]
    assert query(db_path, "SELECT count(*) FROM messages") == [(2,)]


def test_keys_inside_a_transaction(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    within = transport.within(conn)
    first = within.publish("g", Event(n=1), key="k")
    assert not isinstance(first, Duplicate)
    again = within.publish("g", Event(n=2), key="k")
    assert isinstance(again, Duplicate)
    assert again == first
    conn.rollback()
    assert query(db_path, "SELECT count(*) FROM keys") == [(0,)]

    # Rolled back, the key is free: the transport's own publish is not a duplicate.
    seq = transport.publish("g", Event(n=3), key="k")
    assert not isinstance(seq, Duplicate)
    with conn:
        seqs = within.publish_many([Message("g", Event(n=4), key="k"), Message("g", Event(n=5))])
    assert isinstance(seqs[0], Duplicate)
    assert seqs[0] == seq
    assert not isinstance(seqs[1], Duplicate)
    assert transport.stats().keys == 1


def test_nack_and_bury_inside_a_transaction(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    transport.publish("g", Event(n=1))
    transport.publish("h", Event(n=2))
    first = transport.claim("w", visibility=60)
    second = transport.claim("w", visibility=60)
    assert first is not None
    assert second is not None
    within = transport.within(conn)
    with conn:
        within.nack(first)
        within.bury(second, "bad input")
    again = transport.claim("w", visibility=60)
    assert again is not None
    assert (again.seq, again.attempt) == (first.seq, 2)
    assert [d.seq for d in transport.dead_letters()] == [second.seq]


def test_the_callers_row_and_text_factories_stay_the_callers(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    conn.row_factory = lambda cursor, row: {
        d[0]: v for d, v in zip(cursor.description, row, strict=True)
    }
    conn.text_factory = bytes
    within = transport.within(conn)
    with conn:
        seq = within.publish("g", Event(n=1), key="k")
        assert within.publish_many([Message("g", Event(n=2), key="k")]) == [Duplicate(seq)]
    assert conn.execute("SELECT 'x' AS x").fetchone() == {"x": b"x"}


def test_legacy_connection_without_a_transaction_gets_one_opened_by_sqlite3(
    db_path: Path, transport: SqliteTransport[Any], conn: sqlite3.Connection
) -> None:
    assert not open_transaction(conn)
    transport.within(conn).publish("g", Event(n=1))
    assert open_transaction(conn)
    assert query(db_path, "SELECT count(*) FROM messages") == [(0,)]
    conn.commit()
    assert query(db_path, "SELECT count(*) FROM messages") == [(1,)]


def test_autocommit_connection_must_begin_first(
    db_path: Path, transport: SqliteTransport[Any]
) -> None:
    before = snapshot(db_path)
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        within = transport.within(conn)
        with pytest.raises(TransportError, match="BEGIN"):
            within.publish("g", Event(n=1))
        assert snapshot(db_path) == before
        conn.execute("BEGIN")
        within.publish("g", Event(n=1))
        conn.execute("COMMIT")
    assert query(db_path, "SELECT count(*) FROM messages") == [(1,)]


def test_refuses_a_connection_to_another_file(
    tmp_path: Path, db_path: Path, transport: SqliteTransport[Any]
) -> None:
    other = tmp_path / "other.db"
    with (
        closing(sqlite3.connect(other)) as conn,
        pytest.raises(ValueError, match="not to") as refused,
    ):
        transport.within(conn)
    assert str(other) in str(refused.value)
    assert str(db_path) in str(refused.value)


def test_accepts_the_same_file_by_another_path(
    tmp_path: Path, db_path: Path, transport: SqliteTransport[Any]
) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(db_path)
    with closing(sqlite3.connect(link)) as conn, conn:
        transport.within(conn).publish("g", Event(n=1))
    assert query(db_path, "SELECT count(*) FROM messages") == [(1,)]


def test_refuses_memory_on_either_side(db_path: Path, transport: SqliteTransport[Any]) -> None:
    with (
        closing(sqlite3.connect(":memory:")) as conn,
        pytest.raises(ValueError, match="in-memory") as refused,
    ):
        transport.within(conn)
    assert str(db_path) in str(refused.value)
    with closing(sqlite3.connect(db_path)) as conn, open_transport("sqlite:///:memory:") as memory:
        assert isinstance(memory, SqliteTransport)
        with pytest.raises(TransportError, match="cannot join a transaction of yours"):
            memory.within(conn)


def test_refuses_what_is_not_a_sqlite3_connection(transport: SqliteTransport[Any]) -> None:
    with pytest.raises(TypeError, match=r"sqlite3\.Connection"):
        transport.within(object())


def test_refuses_once_closed(db_path: Path, open_db: OpenDb) -> None:
    transport = open_db()
    transport.close()
    with closing(sqlite3.connect(db_path)) as conn, pytest.raises(TransportError, match="closed"):
        transport.within(conn)
