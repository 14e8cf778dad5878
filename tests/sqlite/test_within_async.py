"""`AsyncSqliteTransport.within(conn)` on an aiosqlite connection: the same promises as
the sync twin's (tests/sqlite/test_within.py), on real files."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from transports_core import Duplicate, Event, LeaseLost, Message, TransportError
from transports_core.conformance import ManualClock
from transports_sqlite import AsyncSqliteTransport, SqliteOptions

from ._support import query, snapshot

Scenario = Callable[[AsyncSqliteTransport[Any], aiosqlite.Connection], Awaitable[None]]


def run(db: Path, scenario: Scenario, clock: ManualClock | None = None) -> None:
    """Run ``scenario`` with an async transport on ``db`` and an aiosqlite connection of
    the caller's own to it (sqlite3's defaults), which has a table ``mine``."""

    async def main() -> None:
        options = SqliteOptions(str(db), clock=clock or ManualClock(1_000_000.0))
        transport: AsyncSqliteTransport[Any] = AsyncSqliteTransport(options)
        try:
            await transport.stats()  # the queue's schema, before the caller's table
            async with aiosqlite.connect(db) as conn:
                await conn.execute("CREATE TABLE IF NOT EXISTS mine (n INTEGER)")
                await conn.commit()
                await scenario(transport, conn)
        finally:
            await transport.close()

    asyncio.run(main())


def mine(db: Path) -> list[int]:
    return [n for (n,) in query(db, "SELECT n FROM mine ORDER BY n")]


def test_rollback_leaves_nothing_and_the_acked_lease_current(db_path: Path) -> None:
    async def scenario(transport: AsyncSqliteTransport[Any], conn: aiosqlite.Connection) -> None:
        await transport.publish("g", Event(n=0))
        lease = await transport.claim("w", visibility=60)
        assert lease is not None
        before = snapshot(db_path)
        within = transport.within(conn)
        await conn.execute("INSERT INTO mine VALUES (1)")
        await within.publish("g", Event(n=1))
        await within.publish_many([("h", Event(n=2), 0), Message("i", Event(n=3), key="k")])
        await within.ack(lease)
        await conn.rollback()
        assert snapshot(db_path) == before
        assert query(db_path, "SELECT count(*) FROM keys") == [(0,)]
        await transport.ack(lease)  # still current

    run(db_path, scenario)
    assert mine(db_path) == []


def test_commit_publishes_once_together_with_the_callers_writes(db_path: Path) -> None:
    async def scenario(transport: AsyncSqliteTransport[Any], conn: aiosqlite.Connection) -> None:
        within = transport.within(conn)
        await conn.execute("INSERT INTO mine VALUES (1)")
        seq = await within.publish("g", Event(n=1))
        assert query(db_path, "SELECT count(*) FROM messages") == [(0,)]
        await conn.commit()
        lease = await transport.claim("w", visibility=60)
        assert lease is not None
        assert (lease.seq, lease.event) == (seq, Event(n=1))
        assert await transport.claim("w2", visibility=60) is None

    run(db_path, scenario)
    assert mine(db_path) == [1]


def test_a_commit_wakes_a_claim_waiting_on_the_same_transport(db_path: Path) -> None:
    async def scenario(transport: AsyncSqliteTransport[Any], conn: aiosqlite.Connection) -> None:
        await transport.publish("g", Event(n=0))  # opens the file, then empties it
        first = await transport.claim("w", visibility=60)
        assert first is not None
        await transport.ack(first)
        waiting = asyncio.ensure_future(transport.claim("w", visibility=60, wait=30))
        await conn.execute("BEGIN IMMEDIATE")
        seq = await transport.within(conn).publish("g", Event(n=1))
        done, _ = await asyncio.wait((waiting,), timeout=0.3)
        assert not done, "the claim returned before the commit"
        await conn.commit()
        lease = await asyncio.wait_for(waiting, 10)
        assert lease is not None
        assert lease.seq == seq

    run(db_path, scenario, ManualClock())


def test_ack_after_takeover_raises_lease_lost_and_changes_nothing(db_path: Path) -> None:
    clock = ManualClock(1_000_000.0)

    async def scenario(transport: AsyncSqliteTransport[Any], conn: aiosqlite.Connection) -> None:
        await transport.publish("g", Event(n=1))
        stale = await transport.claim("w1", visibility=10)
        assert stale is not None
        clock.advance(11)
        current = await transport.claim("w2", visibility=60)
        assert current is not None
        before = snapshot(db_path)
        await conn.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(LeaseLost):
            await transport.within(conn).ack(stale)
        assert conn.in_transaction
        await conn.commit()
        assert snapshot(db_path) == before
        await transport.ack(current)

    run(db_path, scenario, clock)
    assert mine(db_path) == [1]


def test_keys_inside_a_transaction(db_path: Path) -> None:
    async def scenario(transport: AsyncSqliteTransport[Any], conn: aiosqlite.Connection) -> None:
        within = transport.within(conn)
        first = await within.publish("g", Event(n=1), key="k")
        assert await within.publish("g", Event(n=2), key="k") == Duplicate(first)
        await conn.rollback()
        seq = await transport.publish("g", Event(n=3), key="k")
        assert not isinstance(seq, Duplicate)
        assert await within.publish("g", Event(n=4), key="k") == Duplicate(seq)
        await conn.commit()
        assert (await transport.stats()).keys == 1

    run(db_path, scenario)


def test_a_transport_not_yet_used_sets_its_file_up_first(db_path: Path) -> None:
    async def main() -> None:
        transport: AsyncSqliteTransport[Any] = AsyncSqliteTransport(SqliteOptions(str(db_path)))
        try:
            async with aiosqlite.connect(db_path) as conn:
                seq = await transport.within(conn).publish("g", Event(n=1))
                await conn.commit()
            lease = await transport.claim("w", visibility=60)
            assert lease is not None
            assert lease.seq == seq
        finally:
            await transport.close()

    asyncio.run(main())


def test_refusals(db_path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.db"

    async def scenario(transport: AsyncSqliteTransport[Any], conn: aiosqlite.Connection) -> None:
        with (
            closing(sqlite3.connect(db_path)) as plain,
            pytest.raises(TypeError, match="aiosqlite"),
        ):
            transport.within(plain)
        async with aiosqlite.connect(other) as elsewhere:
            within = transport.within(elsewhere)
            with pytest.raises(ValueError, match="not to the queue's file") as refused:
                await within.publish("g", Event(n=1))
            assert str(other) in str(refused.value)
        async with aiosqlite.connect(db_path, isolation_level=None) as autocommit:
            with pytest.raises(TransportError, match="BEGIN"):
                await transport.within(autocommit).publish("g", Event(n=1))
        assert query(db_path, "SELECT count(*) FROM messages") == [(0,)]
        await transport.close()
        with pytest.raises(TransportError, match="closed"):
            transport.within(conn)

    run(db_path, scenario)
