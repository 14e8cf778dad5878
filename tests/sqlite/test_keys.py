"""Idempotency keys on SQLite, both twins: a repeated key in its group stores nothing and
answers the original seq as a `Duplicate`, for as long as the queue's ``dedup_window``
(on the injected clock); racing processes store one message per key; and a queue at the
version 3 schema gains the keys table when opened, and one at version 4 has it rebuilt in
its new order, each keeping its messages (and keys)."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from transports_core import Duplicate, Event, Message, open_async_transport, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import AsyncSqliteTransport
from transports_sqlite import _sql as sql

from . import _workers
from ._support import message_count, query

WINDOW = 60.0


def _open(db: Path, clock: ManualClock) -> Any:
    # migrate=auto: the tests of older files open them as they were opened before
    # `transports migrate` (a plain URL refuses them: tests/sqlite/test_files.py).
    return open_transport(f"sqlite:///{db}?dedup_window={WINDOW}&migrate=auto", clock=clock)


def test_a_repeated_key_returns_the_original_seq_and_stores_nothing(
    db_path: Path, clock: ManualClock
) -> None:
    with _open(db_path, clock) as t:
        first = t.publish("g", Event(n=1), key="order-7")
        again = t.publish("g", Event(n=2), key="order-7")
        assert not isinstance(first, Duplicate)
        assert isinstance(again, Duplicate)
        assert again == first
        assert message_count(db_path) == 1
        lease = t.claim("w", 30)
        assert lease is not None
        assert lease.event == Event(n=1)
        assert t.stats().keys == 1


def test_a_key_stays_a_duplicate_after_its_message_is_acked(
    db_path: Path, clock: ManualClock
) -> None:
    with _open(db_path, clock) as t:
        first = t.publish("g", Event(), key="k")
        lease = t.claim("w", 30)
        assert lease is not None
        t.ack(lease)
        clock.advance(WINDOW - 1)
        assert t.publish("g", Event(), key="k") == Duplicate(first)
        assert message_count(db_path) == 0


def test_after_the_window_the_key_publishes_a_new_message(
    db_path: Path, clock: ManualClock
) -> None:
    with _open(db_path, clock) as t:
        first = t.publish("g", Event(n=1), key="k")
        clock.advance(WINDOW)
        second = t.publish("g", Event(n=2), key="k")
        assert not isinstance(second, Duplicate)
        assert second > first
        # The key now points at the new message.
        assert t.publish("g", Event(n=3), key="k") == Duplicate(second)
        assert message_count(db_path) == 2


def test_expired_keys_are_forgotten_a_few_at_a_time(db_path: Path, clock: ManualClock) -> None:
    with _open(db_path, clock) as t:
        for n in range(30):
            t.publish("g", Event(), key=f"old{n}")
            clock.advance(0.001)
        clock.advance(WINDOW)
        t.publish("g", Event(), key="new")
        assert t.stats().keys == 30 + 1 - sql.FORGET_PER_PUBLISH


def test_another_groups_same_key_is_a_new_message(db_path: Path, clock: ManualClock) -> None:
    with _open(db_path, clock) as t:
        a = t.publish("a", Event(), key="k")
        b = t.publish("b", Event(), key="k")
        assert not isinstance(b, Duplicate)
        assert b != a
        assert message_count(db_path) == 2


def test_a_batch_stores_the_first_of_a_repeated_key_only(db_path: Path, clock: ManualClock) -> None:
    with _open(db_path, clock) as t:
        before = t.publish("g", Event(n=0), key="seen")
        seqs = t.publish_many(
            [
                Message("g", Event(n=1), key="x"),
                ("g", Event(n=2), 0),
                Message("g", Event(n=3), key="seen"),
                Message("g", Event(n=4), key="x"),
                Message("h", Event(n=5), key="x"),
            ]
        )
        x, plain, seen, x_again, other = seqs
        assert [isinstance(s, Duplicate) for s in seqs] == [False, False, True, True, False]
        assert (seen, x_again) == (before, x)
        assert x < plain < other
        stored = query(db_path, "SELECT seq, json_extract(event, '$.n') FROM messages ORDER BY seq")
        assert stored == [(before, 0), (x, 1), (plain, 2), (other, 5)]
        assert t.stats().keys == 3


def test_keys_behind_a_live_one_in_a_batch_point_to_their_stored_messages(
    db_path: Path, clock: ManualClock
) -> None:
    # The batch is first numbered as if no key were live: "seen" makes every later
    # item's seq one less, and the keys remembered for them must follow.
    with _open(db_path, clock) as t:
        before = t.publish("g", Event(n=0), key="seen")
        items = [Message(f"g{i}", Event(n=i), key=f"k{i}") for i in range(4)]
        seqs = t.publish_many([items[0], Message("g", Event(n=9), key="seen"), *items[1:]])
        assert seqs[1] == Duplicate(before)
        fresh = [seqs[0], *seqs[2:]]
        assert fresh == list(range(before + 1, before + 5))
        assert dict(query(db_path, "SELECT key, seq FROM keys")) == {
            "seen": before,
            **{f"k{i}": seq for i, seq in enumerate(fresh)},
        }
        assert t.publish_many(items) == [Duplicate(seq) for seq in fresh]
        stored = query(db_path, "SELECT seq, json_extract(event, '$.n') FROM messages")
        assert sorted(stored) == [(before, 0), *((seq, i) for i, seq in enumerate(fresh))]


def test_a_batch_with_a_bad_item_stores_nothing_not_even_keys(
    db_path: Path, clock: ManualClock
) -> None:
    with _open(db_path, clock) as t:
        with pytest.raises(ValueError, match=r"items\[1\]"):
            t.publish_many([Message("g", Event(), key="k"), Message("g", Event(), key="")])
        assert t.stats().keys == 0
        assert not isinstance(t.publish("g", Event(), key="k"), Duplicate)


@pytest.mark.parametrize("window", ["0", "-1", "nan", "soon"])
def test_dedup_window_must_be_positive_seconds(db_path: Path, window: str) -> None:
    with pytest.raises(ValueError, match="dedup_window"):
        open_transport(f"sqlite:///{db_path}?dedup_window={window}")


def test_the_async_twin_deduplicates_alike(db_path: Path, clock: ManualClock) -> None:
    async def main() -> list[int]:
        url = f"sqlite:///{db_path}?dedup_window={WINDOW}"
        async with open_async_transport(url, clock=clock) as t:
            first = await t.publish("g", Event(), key="k")
            again = await t.publish("g", Event(), key="k")
            batch = await t.publish_many([Message("g", Event(), key="k"), ("g", Event(), 0)])
            clock.advance(WINDOW)
            later = await t.publish("g", Event(), key="k")
            assert isinstance(t, AsyncSqliteTransport)
            assert (await t.stats()).keys == 1
            return [first, again, *batch, later]

    first, again, dup, plain, later = asyncio.run(main())
    assert again == Duplicate(first)
    assert dup == Duplicate(first)
    assert isinstance(again, Duplicate)
    assert isinstance(dup, Duplicate)
    assert not isinstance(later, Duplicate)
    assert first < plain < later
    assert message_count(db_path) == 3


def test_processes_racing_on_the_same_keys_store_one_message_each(tmp_path: Path) -> None:
    db, processes, keys = tmp_path / "queue.db", 8, 100
    with open_transport(f"sqlite:///{db}"):
        pass
    ctx = multiprocessing.get_context("spawn")
    ready, go, seqs = ctx.Queue(), ctx.Event(), ctx.Queue()
    children = [
        ctx.Process(target=_workers.publish_keys, args=(str(db), keys, ready, go, seqs))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            ready.get(timeout=60)
        go.set()
        answers = [dict(seqs.get(timeout=120)) for _ in children]
        for child in children:
            child.join(timeout=60)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()
    assert [child.exitcode for child in children] == [0] * processes
    assert message_count(db) == keys
    stored = dict(query(db, "SELECT key, seq FROM keys"))
    # Every process was told the one seq stored under each key.
    assert all(answer == stored for answer in answers)


# A publish as version 3 wrote it (its view had no `now`).
_V3_PUBLISH = """
INSERT INTO publish (seq, group_id, priority, event)
VALUES ((SELECT max(last, coalesce((SELECT max(seq) FROM messages), 0)) FROM seqs) + 1, ?, ?, ?)
"""


def _v3_queue(path: Path) -> None:
    """A queue made by the previous schema: version 3's DDL, with two messages."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in sql._SCHEMA_V3:
            conn.execute(statement.sql)
        conn.execute(f"PRAGMA application_id = {sql.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 3")
        for n in (1, 2):
            conn.execute(_V3_PUBLISH, ("g", 0, f'{{"n": {n}}}'))


def test_a_version_3_queue_is_upgraded_when_opened_and_keeps_its_messages(
    db_path: Path, clock: ManualClock
) -> None:
    _v3_queue(db_path)
    assert query(db_path, "PRAGMA user_version") == [(3,)]
    with _open(db_path, clock) as t:
        assert query(db_path, "PRAGMA user_version") == [(sql.SCHEMA_VERSION,)]
        assert t.stats().ready == 2
        seq = t.publish("g", Event(n=3), key="k")
        assert t.publish("g", Event(n=4), key="k") == Duplicate(seq)
        got = []
        while (lease := t.claim("w", 30)) is not None:
            got.append(lease.event)
            t.ack(lease)
        assert got == [Event(n=1), Event(n=2), Event(n=3)]
    with _open(db_path, clock) as again:  # opened at the current version: nothing to do
        assert again.stats().keys == 1


# Version 4's `keys`: the same columns as now, ordered by group first.
_V4_KEYS = """
CREATE TABLE keys (
    group_id   TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    expires_at REAL    NOT NULL,
    PRIMARY KEY (group_id, key)
) WITHOUT ROWID
"""


def _v4_queue(path: Path, clock: ManualClock) -> None:
    """A queue made by the previous schema: version 3's DDL and version 4's keys table
    (its index, view and trigger unchanged since), with a plain message and a keyed one."""
    _v3_queue(path)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(_V4_KEYS)
        for statement in sql._KEYS_SCHEMA[1:]:
            conn.execute(statement.sql)
        conn.execute("PRAGMA user_version = 4")
        now = clock()
        row = ("g", 0, '{"n": 3}', "k", now, now + WINDOW)
        conn.execute(sql.PUBLISH_KEYED.sql, sql.PUBLISH_KEYED.positional(row)).fetchall()


def test_a_version_4_queue_is_upgraded_when_opened_and_keeps_its_messages_and_keys(
    db_path: Path, clock: ManualClock
) -> None:
    _v4_queue(db_path, clock)
    assert query(db_path, "PRAGMA user_version") == [(4,)]
    (old_pk,) = query(db_path, "SELECT sql FROM sqlite_master WHERE name = 'keys'")
    assert "PRIMARY KEY (group_id, key)" in old_pk[0]
    with _open(db_path, clock) as t:
        assert query(db_path, "PRAGMA user_version") == [(sql.SCHEMA_VERSION,)]
        (new_pk,) = query(db_path, "SELECT sql FROM sqlite_master WHERE name = 'keys'")
        assert "PRIMARY KEY (key, group_id)" in new_pk[0]
        assert t.stats().ready == 3
        assert t.stats().keys == 1
        # The key published before the upgrade is still live, with its seq.
        assert t.publish("g", Event(n=4), key="k") == Duplicate(3)
        assert t.publish_many([Message("g", Event(n=5), key="k")]) == [Duplicate(3)]
        clock.advance(WINDOW)
        fresh = t.publish("g", Event(n=6), key="k")
        assert not isinstance(fresh, Duplicate)
        got = []
        while (lease := t.claim("w", 30)) is not None:
            got.append(lease.event)
            t.ack(lease)
        assert got == [Event(n=1), Event(n=2), Event(n=3), Event(n=6)]
    names = {name for (name,) in query(db_path, "SELECT name FROM sqlite_master")}
    assert "keys_v4" not in names
    assert {"keys", "keys_by_expiry", "publish_keyed", "publish_keyed_message"} <= names
