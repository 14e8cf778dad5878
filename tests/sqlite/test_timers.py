"""Delayed messages, pauses and tenants as SQLite stores them (schema 6): a queue at
version 5 is upgraded in place when opened and keeps its messages and keys; a promoted
message may sit behind a later seq in its chain, and seqs are still never reused, and
cancel and purge still find every message of such a chain; the async twin publishes and
claims delayed messages as the sync one does."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from transports_core import Duplicate, Event, open_async_transport, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import _sql as sql

from ._support import query

WINDOW = 60.0

# A publish as versions 3 to 5 wrote it (their view had no `now`).
_V5_PUBLISH = """
INSERT INTO publish (seq, group_id, priority, event)
VALUES ((SELECT max(last, coalesce((SELECT max(seq) FROM messages), 0)) FROM seqs) + 1, ?, ?, ?)
"""
# A keyed publish as version 5 wrote it: the same statement as today's.
_V5_PUBLISH_KEYED = sql.PUBLISH_KEYED.sql


def _open(db: Path, clock: ManualClock) -> Any:
    # migrate=auto: the tests of older files open them as they were opened before
    # `transports migrate` (a plain URL refuses them: tests/sqlite/test_files.py).
    return open_transport(f"sqlite:///{db}?dedup_window={WINDOW}&migrate=auto", clock=clock)


def _drain(t: Any) -> list[int]:
    got = []
    while (lease := t.claim("w", 30)) is not None:
        got.append(lease.event.n)
        t.ack(lease)
    return got


def _v5_queue(path: Path, clock: ManualClock) -> None:
    """A queue made by version 5: its DDL (version 3's and the keys'), two plain messages
    in group g, one keyed, and one plain message in group h."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in (*sql._SCHEMA_V3, *sql._KEYS_SCHEMA):
            conn.execute(statement.sql)
        conn.execute(f"PRAGMA application_id = {sql.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 5")
        for n in (1, 2):
            conn.execute(_V5_PUBLISH, ("g", 0, f'{{"n": {n}}}'))
        now = clock()
        keyed = ("g", 0, '{"n": 3}', "k", now, now + WINDOW)
        conn.execute(_V5_PUBLISH_KEYED, sql.PUBLISH_KEYED.positional(keyed)).fetchall()
        conn.execute(_V5_PUBLISH, ("h", 2, '{"n": 4}'))


def test_a_version_5_queue_is_upgraded_when_opened_and_keeps_its_messages_and_keys(
    db_path: Path, clock: ManualClock
) -> None:
    _v5_queue(db_path, clock)
    assert query(db_path, "PRAGMA user_version") == [(5,)]
    with _open(db_path, clock) as t:
        assert query(db_path, "PRAGMA user_version") == [(sql.SCHEMA_VERSION,)]
        stats = t.stats()
        assert (stats.ready, stats.keys, stats.delayed, stats.paused) == (4, 1, 0, 0)
        assert t.publish("g", Event(n=5), key="k") == Duplicate(3)
        # The new options work on the upgraded file.
        t.publish("g", Event(n=6), delay=10)
        assert t.pause_group("h") is True
        assert _drain(t) == [1, 2, 3]
        clock.advance(10)
        assert _drain(t) == [6]
        t.resume_group("h")
        assert _drain(t) == [4]
    (index,) = query(db_path, "SELECT sql FROM sqlite_master WHERE name = 'groups_by_turn'")
    assert "paused" in index[0]
    names = {name for (name,) in query(db_path, "SELECT name FROM sqlite_master")}
    assert {
        "timers",
        "paused",
        "tenants",
        "vtime",
        "promote",
        "promote_timer",
        "promote_group",
    } <= names


def test_a_new_file_has_the_same_schema_as_an_upgraded_one(
    db_path: Path, tmp_path: Path, clock: ManualClock
) -> None:
    _v5_queue(db_path, clock)
    with _open(db_path, clock):
        pass
    fresh = tmp_path / "fresh.db"
    with _open(fresh, clock):
        pass
    schema = "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
    assert query(db_path, schema) == query(fresh, schema)


def test_a_promoted_message_behind_a_later_seq_never_lets_a_seq_be_reused(
    db_path: Path, clock: ManualClock
) -> None:
    with _open(db_path, clock) as t:
        first = t.publish("g", Event(n=1))
        delayed = t.publish("g", Event(n=2), delay=5)
        third = t.publish("g", Event(n=3))
        assert first < delayed < third
        clock.advance(5)
        # The claim promotes 2 behind 3: the chain is 1, 3, 2, and 3 (the highest seq)
        # is no longer its group's tail when it leaves.
        assert _drain(t) == [1, 3, 2]
        assert t.publish("g", Event(n=4)) > third


def test_cancel_and_purge_follow_a_chain_whose_seqs_do_not_rise(
    db_path: Path, clock: ManualClock
) -> None:
    with _open(db_path, clock) as t:
        t.publish("g", Event(n=1))
        delayed = t.publish("g", Event(n=2), delay=5)
        third = t.publish("g", Event(n=3))
        clock.advance(5)
        fourth = t.publish("g", Event(n=4))  # promotes 2 first: the chain is 1, 3, 2, 4
        assert [m.seq for m in t.peek("g")][1:] == [third, delayed, fourth]
        assert t.cancel(delayed) is True  # in the middle, behind a higher seq
        assert t.cancel(fourth) is True  # the tail
        assert [m.event for m in t.peek("g")] == ['{"n":1}', '{"n":3}']
        t.publish("g", Event(n=5), delay=5)
        clock.advance(5)
        t.publish("g", Event(n=6))
        assert t.purge_group("g") == 4
        assert query(db_path, "SELECT count(*) FROM messages") == [(0,)]
        assert _drain(t) == []


def test_the_async_twin_delays_pauses_and_weighs_tenants_as_the_sync_one(
    db_path: Path, clock: ManualClock
) -> None:
    async def run() -> tuple[list[int], list[int]]:
        opened: Any = open_async_transport(f"sqlite:///{db_path}", clock=clock)
        async with opened as t:
            await t.publish("a", Event(n=1), delay=5)
            await t.publish("b", Event(n=2), delay=5, hold=True, tenant="x")
            await t.publish("b", Event(n=3))
            await t.pause_group("c")
            await t.publish("c", Event(n=4))
            early = []
            while (lease := await t.claim("w", 30)) is not None:
                early.append(lease.event.n)
                await t.ack(lease)
            clock.advance(5)
            await t.resume_group("c")
            late = []
            while (lease := await t.claim("w", 30)) is not None:
                late.append(lease.event.n)
                await t.ack(lease)
            return early, late

    early, late = asyncio.run(run())
    assert early == []
    assert sorted(late) == [1, 2, 3, 4]
    assert late.index(2) < late.index(3)


def test_a_group_opened_by_a_batch_a_promotion_or_a_requeue_while_paused_is_paused(
    db_path: Path, clock: ManualClock
) -> None:
    opened: Any = open_transport(f"sqlite:///{db_path}", clock=clock, max_attempts=1)
    with opened as t:
        for group in ("batch", "timer", "requeue"):
            t.pause_group(group)
        t.publish_many([("batch", Event(n=1), 0)])
        t.publish("timer", Event(n=2), delay=5)
        clock.advance(5)
        assert t.claim("w", 30) is None  # promoted, into a paused group
        t.resume_group("requeue")
        t.publish("requeue", Event(n=3))
        lease = t.claim("w", 30)
        assert lease is not None
        t.nack(lease)
        assert t.claim("w", 30) is None  # out of attempts: a dead letter, its group gone
        t.pause_group("requeue")
        assert t.requeue(lease.seq) is True  # opens the group again, while paused
        assert t.claim("w", 30) is None
        assert query(db_path, "SELECT group_id FROM groups WHERE paused ORDER BY 1") == [
            ("batch",),
            ("requeue",),
            ("timer",),
        ]
        for group in ("batch", "timer", "requeue"):
            t.resume_group(group)
        assert sorted(_drain(t)) == [1, 2, 3]
