"""`within(conn)`: publish, ack, nack and bury inside a transaction of the caller's, on its
own psycopg connection, against the real server."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from transports_core import (
    Duplicate,
    Event,
    LeaseLost,
    Message,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_postgres import AsyncPostgresTransport, PostgresTransport

from . import _within_workers

Conn = psycopg.Connection[Any]
Queue = PostgresTransport[Event]


def _open(url: str) -> Queue:
    transport = open_transport(url)
    assert isinstance(transport, PostgresTransport)
    return transport


@pytest.fixture
def queue(queue_url: str) -> Iterator[Queue]:
    with _open(queue_url) as transport:
        yield transport


@pytest.fixture
def server(schema_url: tuple[str, str]) -> str:
    return schema_url[0]


@pytest.fixture
def conn(server: str) -> Iterator[Conn]:
    """The caller's connection: psycopg's default, not autocommit."""
    with psycopg.connect(server) as connection:
        yield connection


def _stats(queue: Queue) -> tuple[int, int, int]:
    stats = queue.stats()
    return stats.ready, stats.in_flight, stats.keys


def _server_now(raw: Conn) -> float:
    row = raw.execute("SELECT date_part('epoch', clock_timestamp())").fetchone()
    assert row is not None
    return float(row[0])


def test_rollback_leaves_nothing_and_the_acked_lease_current(queue: Queue, conn: Conn) -> None:
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    within = queue.within(conn)
    assert within.publish("h", Event(n=2)) > lease.seq
    within.ack(lease)
    conn.rollback()
    assert _stats(queue) == (0, 1, 0)
    queue.extend(lease, 60)  # still current
    queue.ack(lease)
    assert _stats(queue) == (0, 0, 0)


def test_commit_publishes_once_and_acks(queue: Queue, conn: Conn) -> None:
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    conn.execute("SELECT 1")  # the caller's own statements, in the same transaction
    within = queue.within(conn)
    seq = within.publish("g", Event(n=2))
    within.ack(lease)
    assert _stats(queue) == (0, 1, 0)  # nothing seen before the commit
    conn.commit()
    assert _stats(queue) == (1, 0, 0)
    nxt = queue.claim("w", 60)
    assert nxt is not None
    assert (nxt.seq, nxt.event) == (seq, Event(n=2))
    with pytest.raises(LeaseLost):
        queue.ack(lease)


def test_commit_wakes_a_claim_blocked_in_another_process_only_then(
    queue: Queue, queue_url: str, conn: Conn, raw: Conn, schema: str, tmp_path: Path
) -> None:
    out = tmp_path / "claimed"
    child = multiprocessing.get_context("spawn").Process(
        target=_within_workers.claim_once, args=(queue_url, str(out))
    )
    child.start()
    try:
        deadline = time.monotonic() + 30
        while raw.execute(f'SELECT count(*) FROM "{schema}".waiters').fetchone() != (1,):
            assert time.monotonic() < deadline, "the child's claim never blocked"
            time.sleep(0.01)
        seq = queue.within(conn).publish("g", Event(n=1))
        # Uncommitted: the blocked claim neither sees it nor is woken by it.
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            assert not out.exists(), "woken before the commit"
            time.sleep(0.01)
        committing = time.monotonic()
        conn.commit()
        child.join(10)
        assert child.exitcode == 0
        claimed, at = out.read_text().split()
        assert int(claimed) == seq
        # Woken by the commit's notification, not by its once-a-second look.
        assert committing <= float(at) < committing + 0.5
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def test_ack_after_takeover_raises_lease_lost_and_leaves_the_transaction_usable(
    queue_url: str, conn: Conn, server: str, schema: str
) -> None:
    with _open(queue_url) as queue, _open(queue_url) as other:
        queue.publish("g", Event(n=1))
        stale = queue.claim("w1", 0.2)
        assert stale is not None
        deadline = time.monotonic() + 10
        while (current := other.claim("w2", 60)) is None:
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.02)
        conn.execute(f'CREATE TABLE "{schema}".mine (n int)')
        within = queue.within(conn)
        with pytest.raises(LeaseLost):
            within.ack(stale)
        with pytest.raises(LeaseLost):
            within.nack(stale)
        with pytest.raises(LeaseLost):
            within.bury(stale, "no")
        # The caller's transaction goes on: its own writes, and the writes within.
        conn.execute(f'INSERT INTO "{schema}".mine VALUES (1)')
        within.publish("h", Event(n=2))
        conn.commit()
        assert conn.execute(f'SELECT n FROM "{schema}".mine').fetchall() == [(1,)]
        assert _stats(queue) == (1, 1, 0)
        other.ack(current)  # the new lease was untouched


def test_a_stale_ack_inside_says_why_and_leaves_the_callers_transaction_as_it_was(
    queue: Queue, conn: Conn, schema: str
) -> None:
    # Core looks at a lost lease's group to say why, inside the caller's transaction
    # too, where it sees the caller's own writes. Outside, a PostgreSQL admin read first
    # moves due delayed messages into their groups; inside, it may not change anything.
    queue.publish("d", Event(n=0), delay=0.2)
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    queue.ack(lease)
    time.sleep(0.3)  # the delayed message is due (its 0.2 s, and a margin)
    timers = f'SELECT count(*) FROM "{schema}".timers'
    assert conn.execute(timers).fetchone() == (1,)
    with pytest.raises(LeaseLost) as lost:
        queue.within(conn).ack(lease)
    assert lost.value.reason == "gone"
    assert conn.execute(timers).fetchone() == (1,), "the failed call left a change"
    conn.rollback()


def test_an_open_ack_keeps_the_message_from_other_workers_past_its_lease(
    queue: Queue, queue_url: str, conn: Conn, raw: Conn
) -> None:
    queue.publish("g", Event(n=1))
    lease = queue.claim("w1", 0.5)
    assert lease is not None
    queue.within(conn).ack(lease)
    with open_transport(queue_url) as other:
        # Until well past the lease's end, on the server's clock: never claimable.
        while _server_now(raw) < lease.expires_at + 0.5:
            assert other.claim("w2", 60) is None
            time.sleep(0.02)
        conn.commit()
        assert other.claim("w2", 60) is None
        assert _stats(queue) == (0, 0, 0)


def test_nack_and_bury_inside(queue: Queue, conn: Conn) -> None:
    queue.publish("g", Event(n=1))
    queue.publish("h", Event(n=2))
    first, second = queue.claim("w", 60), queue.claim("w", 60)
    assert first is not None
    assert second is not None
    within = queue.within(conn)
    within.nack(first)
    within.bury(second, "poison")
    assert _stats(queue) == (0, 2, 0)
    conn.commit()
    assert [d.seq for d in queue.dead_letters()] == [second.seq]
    again = queue.claim("w", 60)
    assert again is not None
    assert (again.seq, again.attempt) == (first.seq, 2)


def test_keys_inside(queue: Queue, conn: Conn) -> None:
    within = queue.within(conn)
    seq = within.publish("g", Event(n=1), key="k")
    assert not isinstance(seq, Duplicate)
    assert isinstance(within.publish("g", Event(n=2), key="k"), Duplicate)
    conn.rollback()
    assert _stats(queue) == (0, 0, 0)  # no message, no key
    fresh = queue.within(conn).publish("g", Event(n=3), key="k")
    assert not isinstance(fresh, Duplicate)
    batch = queue.within(conn).publish_many([("g", Event(n=4), 0)])
    conn.commit()
    again = queue.publish("g", Event(n=5), key="k")
    assert isinstance(again, Duplicate)
    assert int(again) == fresh
    assert _stats(queue) == (2, 0, 1)
    assert batch[0] > fresh


def test_the_callers_row_factory_and_autocommit_transaction(queue: Queue, server: str) -> None:
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    with psycopg.connect(server, autocommit=True, row_factory=dict_row) as conn:
        with conn.transaction():
            within = queue.within(conn)
            within.ack(lease)
            seq = within.publish_many([("g", Event(n=2), 0), ("h", Event(n=3), 0)])
        assert _stats(queue) == (2, 0, 0)
    nxt = queue.claim("w", 60)
    assert nxt is not None
    assert nxt.seq == seq[0]


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_snapshot_levels_publish_and_ack(
    queue: Queue, queue_url: str, server: str, level: str
) -> None:
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    with psycopg.connect(server, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            within = queue.within(conn)
            within.ack(lease)
            within.publish("g", Event(n=2))
        assert _stats(queue) == (1, 0, 0)
        # A lease taken, or extended, after the caller's snapshot: a serialization failure
        # that says to run the transaction again, never a false LeaseLost; nothing changed.
        for extended in (False, True):
            with conn.transaction():
                conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                conn.execute("SELECT 1")  # the snapshot
                taken = queue.claim("w", 60)
                assert taken is not None
                if extended:
                    taken = queue.extend(taken, 60)
                with pytest.raises(TransportError, match="run it again") as caught:
                    queue.within(conn).ack(taken)
                assert not isinstance(caught.value, LeaseLost)
            assert _stats(queue) == (0, 1, 0)
            queue.nack(taken)


def test_lease_commit_async_leaves_the_callers_synchronous_commit(
    queue_url: str, conn: Conn
) -> None:
    with _open(queue_url + "&lease_commit=async") as queue:
        queue.publish("g", Event(n=1))
        lease = queue.claim("w", 60)
        assert lease is not None
        queue.within(conn).nack(lease)
        assert conn.execute("SELECT current_setting('synchronous_commit')").fetchone() == ("on",)
        conn.commit()


def test_refusals_write_nothing(queue: Queue, server: str, conn: Conn) -> None:
    async def an_async_connection() -> None:
        async with await psycopg.AsyncConnection.connect(server) as aconn:
            with pytest.raises(TypeError, match="async twin"):
                queue.within(aconn)

    asyncio.run(an_async_connection())
    with pytest.raises(TypeError, match=r"psycopg\.Connection"):
        queue.within(object())
    with psycopg.connect(server, autocommit=True) as auto:
        with pytest.raises(ValueError, match="autocommit"):
            queue.within(auto)
        within = None
        with auto.transaction():
            within = queue.within(auto)
        with pytest.raises(ValueError, match="autocommit"):
            within.publish("g", Event(n=1))  # its transaction is over
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1/0")
    with pytest.raises(ValueError, match="failed"):
        queue.within(conn)
    conn.rollback()
    other_db = psycopg.conninfo.make_conninfo(server, dbname="postgres")
    with (
        psycopg.connect(other_db) as elsewhere,
        pytest.raises(ValueError, match="database 'postgres'"),
    ):
        queue.within(elsewhere).publish("g", Event(n=1))
    assert _stats(queue) == (0, 0, 0)


def test_the_async_twin(queue_url: str, server: str) -> None:
    async def scenario() -> None:
        opened = open_async_transport(queue_url)
        assert isinstance(opened, AsyncPostgresTransport)
        async with opened as queue:
            await queue.publish("g", Event(n=1))
            lease = await queue.claim("w", 60)
            assert lease is not None
            async with await psycopg.AsyncConnection.connect(server) as conn:
                within = queue.within(conn)
                await within.ack(lease)
                await within.publish("g", Event(n=2), key="k")
                await conn.rollback()
                assert (await queue.stats()).in_flight == 1
                await queue.extend(lease, 60)  # still current
                within = queue.within(conn)
                seq = await within.publish("g", Event(n=3), key="k")
                await within.ack(lease)
                await conn.commit()
                assert isinstance(await queue.publish("g", Event(n=4), key="k"), Duplicate)
                with pytest.raises(LeaseLost):
                    await queue.within(conn).ack(lease)
                await conn.execute("SELECT 1")  # still usable
                await conn.rollback()
                with pytest.raises(TypeError, match="sync twin"), psycopg.connect(server) as sync:
                    queue.within(sync)
            nxt = await queue.claim("w", 60)
            assert nxt is not None
            assert nxt.seq == seq

    asyncio.run(scenario())


def test_sigkilled_writer_leaves_its_rows_and_messages_one_to_one(
    queue: Queue, queue_url: str, raw: Conn, schema: str, tmp_path: Path
) -> None:
    """A process inserting its own row and publishing in one transaction, killed at random
    points: after each kill, its committed rows and the queue's messages match."""
    table = f'"{schema}_app".rows'
    raw.execute(f'CREATE SCHEMA "{schema}_app"')
    try:
        raw.execute(f"CREATE TABLE {table} (n bigint PRIMARY KEY)")
        spawn = multiprocessing.get_context("spawn")
        chance = random.Random(os.getpid())
        for run in range(5):
            ready = tmp_path / f"ready{run}"
            child = spawn.Process(
                target=_within_workers.write_and_publish,
                args=(queue_url, table, run * 1_000_000, str(ready)),
            )
            child.start()
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert time.monotonic() < deadline
                assert child.is_alive(), "the writer never wrote"
                time.sleep(0.01)
            time.sleep(chance.uniform(0.0, 0.3))  # a random point in its loop
            assert child.pid is not None
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            rows = {n for (n,) in raw.execute(f"SELECT n FROM {table}").fetchall()}
            events = [
                json.loads(e)["n"]
                for (e,) in raw.execute(f'SELECT event FROM "{schema}".messages').fetchall()
            ]
            assert len(events) == len(set(events)), "a message published twice"
            assert set(events) == rows, f"run {run}: rows and messages differ"
            assert any(n >= run * 1_000_000 for n in rows)
    finally:
        raw.execute(f'DROP SCHEMA "{schema}_app" CASCADE')


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_a_key_stored_after_the_snapshot_asks_to_run_the_transaction_again(
    queue: Queue, server: str, level: str
) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            conn.execute("SELECT 1")  # the snapshot
            # Stored and acked after it: the key stays, its group is gone, so the batch's
            # group lock finds nothing the snapshot cannot see, and only the key's INSERT
            # meets the key.
            seq = queue.publish("g", Event(n=1), key="k")
            lease = queue.claim("w", 60)
            assert lease is not None
            queue.ack(lease)
            batch = [Message("g", Event(n=2), key="k"), Message("h", Event(n=3), key="j")]
            with pytest.raises(TransportError, match="run it again"):
                queue.within(conn).publish_many(batch)
        with conn.transaction():
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            again = queue.within(conn).publish_many(batch)
        assert again[0] == seq
        assert isinstance(again[0], Duplicate)
        assert not isinstance(again[1], Duplicate)
        assert _stats(queue) == (1, 0, 2)
