"""The backlog's age and group counts in `stats` (issue 32), on real files driven by the
injected clock: when each kind of message became ready, which heads are left out, how
groups split into ready and busy, per priority, on both twins, inside a caller's
transaction, and on a file upgraded from schema version 6."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from transports_core import (
    AsyncTransportAdmin,
    Event,
    Message,
    QueueStats,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteOptions, SqliteTransport, migrate
from transports_sqlite import _sql as sql

from ._support import query
from .conftest import OpenDb

# The clock moves 1 us at each reading, so an age is a few us more than the clock moved.
MARGIN = 1e-3


def age(seconds: float) -> Any:
    return pytest.approx(seconds, abs=MARGIN)


def stats(transport: SqliteTransport[Any]) -> QueueStats:
    """`stats`, checked against `groups`: ready and busy groups are those it lists with
    messages, the ready ones those it shows ready and not paused; per priority and in
    total."""
    got = transport.stats()
    listed = [g for g in transport.groups(limit=1_000_000) if g.depth >= 1]
    for p in got.by_priority:
        mine = [g for g in listed if g.priority == p.priority]
        ready = [g for g in mine if g.state == "ready" and not g.paused]
        assert (p.ready_groups, p.busy_groups) == (len(ready), len(mine) - len(ready)), p
    assert got.ready_groups + got.busy_groups == len(listed)
    assert {g.priority for g in listed} <= {p.priority for p in got.by_priority}
    for p in got.by_priority:
        assert (p.oldest_ready_age is None) == (p.ready == 0), p
    return got


def by_priority(got: QueueStats) -> dict[int, tuple[int, float | None, int, int]]:
    """Each priority's ready count, age, ready groups and busy groups."""
    return {
        p.priority: (p.ready, p.oldest_ready_age, p.ready_groups, p.busy_groups)
        for p in got.by_priority
    }


def test_an_empty_queue_has_no_age_and_no_groups(transport: SqliteTransport[Any]) -> None:
    got = stats(transport)
    assert (got.oldest_ready_age, got.ready_groups, got.busy_groups) == (None, 0, 0)


def test_an_in_flight_head_is_left_out_and_the_message_behind_it_counts(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("g", Event(n=1))
    clock.advance(10)
    transport.publish("g", Event(n=2))
    clock.advance(5)
    assert by_priority(stats(transport)) == {0: (2, age(15), 1, 0)}
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    assert by_priority(stats(transport)) == {0: (1, age(5), 0, 1)}
    transport.ack(lease)
    clock.advance(1)
    assert by_priority(stats(transport)) == {0: (1, age(6), 1, 0)}


def test_a_lapsed_lease_a_nack_and_an_ended_park_do_not_restart_the_age(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("g", Event(n=1))
    lease = transport.claim("w", visibility=10)
    assert lease is not None
    clock.advance(20)  # the lease lapses: the head is ready again, aged from its publish
    assert by_priority(stats(transport)) == {0: (1, age(20), 1, 0)}
    lease = transport.claim("w", visibility=10)
    assert lease is not None
    transport.nack(lease)
    assert stats(transport).oldest_ready_age == age(20)
    lease = transport.claim("w", visibility=10)
    assert lease is not None
    transport.nack(lease, delay=30)  # parked: left out, its group busy
    got = stats(transport)
    assert (got.ready, got.parked, got.oldest_ready_age, got.busy_groups) == (0, 1, None, 1)
    clock.advance(31)
    assert by_priority(stats(transport)) == {0: (1, age(51), 1, 0)}


def test_a_delayed_message_is_aged_from_its_due_time_before_and_after_promotion(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("g", Event(n=1), delay=10)
    got = stats(transport)
    assert (got.ready, got.delayed, got.oldest_ready_age) == (0, 1, None)
    # Nothing shows the group before the timer is promoted: it is neither ready nor busy.
    assert (got.ready_groups, got.busy_groups) == (0, 0)
    clock.advance(15)
    transport.publish("p", Event(n=3), delay=15)
    assert transport.pause_group("p") is True
    clock.advance(15)
    # Due but not promoted yet: counted ready and aged from their due time, and their
    # groups counted as their promotion will open them (a paused one busy), although
    # `groups` lists neither until then.
    got = transport.stats()
    assert transport.groups() == []
    assert by_priority(got) == {0: (2, age(20), 1, 1)}
    transport.publish("g", Event(n=2))  # promotes g's due timer ahead of itself
    transport.publish("p", Event(n=4))
    clock.advance(1)
    assert by_priority(stats(transport)) == {0: (4, age(21), 1, 1)}


def test_a_hold_message_parks_its_group_until_due_then_ages_from_then(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("h", Event(n=1), delay=10, hold=True)
    transport.publish("h", Event(n=2))  # behind the hold: ready, aged from its publish
    clock.advance(4)
    got = stats(transport)
    assert (got.ready, got.delayed) == (1, 1)
    assert by_priority(got) == {0: (1, age(4), 0, 1)}
    clock.advance(10)  # the hold came due 4 s ago; the message behind it is 14 s old
    assert by_priority(stats(transport)) == {0: (2, age(14), 1, 0)}
    # A hold=True message behind a ready head: not ready, nor aged, until due.
    transport.publish("k", Event(n=3))
    transport.publish("k", Event(n=4), delay=100, hold=True)
    clock.advance(50)
    got = stats(transport)
    assert (got.ready, got.delayed, got.oldest_ready_age) == (3, 1, age(64))


def test_a_paused_groups_messages_age_and_the_group_is_busy(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("p", Event(n=1))
    transport.publish("q", Event(n=2))
    assert transport.pause_group("p") is True
    clock.advance(8)
    got = stats(transport)
    assert by_priority(got) == {0: (2, age(8), 1, 1)}
    assert got.paused == 1


def test_a_group_held_by_a_dead_letter_is_busy_only_with_messages_behind_it(
    open_db: OpenDb, clock: ManualClock
) -> None:
    transport = open_db(on_dead="hold")
    transport.publish("g", Event(n=1))
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    transport.bury(lease, "bad")
    got = stats(transport)
    assert (got.dead, got.ready, got.oldest_ready_age) == (1, 0, None)
    assert (got.ready_groups, got.busy_groups) == (0, 0)  # nothing behind it: neither
    clock.advance(3)
    transport.publish("g", Event(n=2))
    clock.advance(4)
    assert by_priority(stats(transport)) == {0: (1, age(4), 0, 1)}


def test_a_requeued_dead_letter_is_aged_from_its_requeue(
    open_db: OpenDb, clock: ManualClock
) -> None:
    transport = open_db()  # on_dead="release": the group goes on without it
    first = transport.publish("g", Event(n=1))
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    transport.bury(lease, "bad")
    clock.advance(50)
    transport.publish("g", Event(n=2))
    clock.advance(50)
    assert transport.requeue(first) is True
    clock.advance(7)
    # The requeued head is 7 s ready; the message behind it, published first, 57 s.
    assert by_priority(stats(transport)) == {0: (2, age(57), 1, 0)}
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    assert lease.seq == first
    assert by_priority(stats(transport)) == {0: (1, age(57), 0, 1)}
    transport.ack(lease)
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    transport.ack(lease)
    # Alone in its group, a requeued dead letter's age starts at its requeue.
    again = transport.publish("h", Event(n=3))
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    transport.bury(lease, "bad")
    clock.advance(100)
    assert transport.requeue(again) is True
    clock.advance(2)
    assert by_priority(stats(transport)) == {0: (1, age(2), 1, 0)}


def test_a_requeued_held_dead_letter_is_aged_from_its_requeue(
    open_db: OpenDb, clock: ManualClock
) -> None:
    transport = open_db(on_dead="hold")
    seq = transport.publish("g", Event(n=1))
    lease = transport.claim("w", visibility=30)
    assert lease is not None
    transport.bury(lease, "bad")
    clock.advance(100)
    assert transport.requeue(seq) is True
    clock.advance(2)
    assert by_priority(stats(transport)) == {0: (1, age(2), 1, 0)}


def test_ages_and_groups_are_split_by_the_groups_priority(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("a", Event(n=1), priority=0)
    clock.advance(10)
    transport.publish("b", Event(n=2), priority=3)
    clock.advance(10)
    # Published at 4 into a group of priority 0: it counts, and ages, under 0.
    transport.publish("a", Event(n=3), priority=4)
    clock.advance(10)
    got = stats(transport)
    assert by_priority(got) == {0: (2, age(30), 1, 0), 3: (1, age(20), 1, 0)}
    assert (got.oldest_ready_age, got.ready_groups, got.busy_groups) == (age(30), 2, 0)
    lease = transport.claim("w", visibility=30, min_priority=3)
    assert lease is not None
    assert lease.group_id == "b"
    assert by_priority(stats(transport)) == {0: (2, age(30), 1, 0), 3: (0, None, 0, 1)}


def test_a_batch_a_keyed_publish_and_a_tenants_publish_are_stamped_with_their_time(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("a", Event(n=0), priority=2)
    clock.advance(10)
    transport.publish_many(
        [("a", Event(n=1), 0), ("b", Event(n=2), 1), Message("c", Event(n=3), key="k")]
    )
    clock.advance(10)
    transport.publish("d", Event(n=4), priority=1, key="k")
    transport.publish("e", Event(n=5), priority=4, tenant="t")
    clock.advance(5)
    # a's batch message joins a at priority 2, behind a's first message (25 s).
    assert by_priority(stats(transport)) == {
        0: (1, age(15), 1, 0),
        1: (2, age(15), 2, 0),
        2: (2, age(25), 1, 0),
        4: (1, age(5), 1, 0),
    }


def test_a_publish_in_the_callers_transaction_is_stamped_with_the_transports_clock(
    db_path: Path, transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    with closing(sqlite3.connect(db_path)) as conn:
        within = transport.within(conn)
        within.publish("g", Event(n=1))
        within.publish_many([("h", Event(n=2), 1)])
        clock.advance(30)  # the caller commits later: the messages were ready at publish
        conn.commit()
    clock.advance(3)
    assert by_priority(stats(transport)) == {0: (1, age(33), 1, 0), 1: (1, age(33), 1, 0)}


def test_the_async_twin_reports_the_same(db_path: Path, clock: ManualClock) -> None:
    async def run() -> QueueStats:
        async with open_async_transport(f"sqlite:///{db_path}", clock=clock) as queue:
            await queue.publish("g", Event(n=1))
            await queue.publish("g", Event(n=2))
            clock.advance(9)
            assert await queue.claim("w", 30) is not None
            assert isinstance(queue, AsyncTransportAdmin)
            return await queue.stats()

    got = asyncio.run(run())
    assert by_priority(got) == {0: (1, age(9), 0, 1)}


def test_stats_walk_the_ready_index_and_seek_the_groups(
    db_path: Path, transport: SqliteTransport[Any]
) -> None:
    statement = sql.OLDEST_READY
    explained = f"EXPLAIN QUERY PLAN {statement.sql}"
    plan = [row[3] for row in query(db_path, explained, statement.positional((1,)))]
    assert any(
        "SEARCH m USING INDEX messages_by_ready (group_priority=? AND ready_at<?)" in line
        for line in plan
    ), plan
    assert any("SEARCH g USING PRIMARY KEY (group_id=?)" in line for line in plan), plan
    assert not [line for line in plan if "TEMP B-TREE" in line or line == "SCAN m"], plan


# --- a file of schema version 6, upgraded when opened ----------------------------------------

_V6_PUBLISH = """
INSERT INTO publish (seq, group_id, priority, event, now)
VALUES ((SELECT max(last, coalesce((SELECT max(seq) FROM messages), 0)) FROM seqs) + 1,
        ?, ?, ?, ?)
"""


def _v6_queue(path: Path, now: float) -> None:
    """A queue made by version 6: two messages in g (priority 0), one in h (priority 2),
    and in k (priority 1) a hold=True message due at ``now + 50``, parking its group."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in (*sql._SCHEMA_V3, *sql._KEYS_SCHEMA, *sql._V6):
            conn.execute(statement.sql)
        conn.execute(f"PRAGMA application_id = {sql.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 6")
        for group, priority, n in [("g", 0, 1), ("g", 0, 2), ("h", 2, 3)]:
            conn.execute(_V6_PUBLISH, (group, priority, f'{{"n": {n}}}', now - 500))
        conn.execute(
            "INSERT INTO messages (seq, group_id, priority, event, due) VALUES (4, 'k', 1, ?, ?)",
            ('{"n": 4}', now + 50),
        )
        conn.execute(
            "INSERT INTO groups (group_id, priority, head_seq, tail_seq, locked_by,"
            " lock_expiry, busy_until) VALUES ('k', 1, 4, 4, ?, ?, ?)",
            (sql.PARKED, now + 50, now + 50),
        )


def test_a_version_6_queue_is_upgraded_and_its_messages_age_from_the_upgrade(
    db_path: Path, open_db: OpenDb, clock: ManualClock
) -> None:
    _v6_queue(db_path, clock.now())
    upgraded_at = clock.now()
    transport = open_db(migrate="auto")
    assert query(db_path, "PRAGMA user_version") == [(sql.SCHEMA_VERSION,)]
    clock.advance(20)
    # Published 500 s before the upgrade, but the file did not know: aged from the upgrade.
    got = stats(transport)
    assert by_priority(got) == {0: (2, age(20), 1, 0), 1: (0, None, 0, 1), 2: (1, age(20), 1, 0)}
    assert got.delayed == 1
    clock.advance(40)  # k's hold came due 10 s ago: aged from its due time
    assert by_priority(stats(transport))[1] == (1, age(10), 1, 0)
    stamped = query(db_path, "SELECT seq, ready_at, group_priority FROM messages ORDER BY seq")
    assert stamped == [
        (1, pytest.approx(upgraded_at, abs=MARGIN), 0),
        (2, pytest.approx(upgraded_at, abs=MARGIN), 0),
        (3, pytest.approx(upgraded_at, abs=MARGIN), 2),
        (4, upgraded_at + 50, 1),
    ]
    # It goes on as any queue: the upgraded triggers stamp what comes next.
    transport.publish("g", Event(n=5))
    lease = transport.claim("w", 30, min_priority=2)
    assert lease is not None
    assert lease.group_id == "h"
    clock.advance(1)
    assert by_priority(stats(transport))[0] == (3, age(61), 1, 0)


def test_a_queue_upgraded_from_version_6_has_the_schema_of_a_new_one(
    db_path: Path, tmp_path: Path, open_db: OpenDb, clock: ManualClock
) -> None:
    _v6_queue(db_path, clock.now())
    open_db(migrate="auto").close()
    fresh = tmp_path / "fresh.db"
    SqliteTransport[Event](SqliteOptions(str(fresh))).close()
    schema = "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
    assert query(db_path, schema) == query(fresh, schema)


def test_the_upgrade_script_stamps_rows_with_sqlites_own_clock() -> None:
    # What `transports migrate --sql` prints: no bound value left in it.
    texts = [sql.script(statement) for statement in sql.UPGRADES[6]]
    assert not [text for text in texts if ":now" in text]
    assert any("julianday('now')" in text for text in texts)
    with pytest.raises(KeyError):
        sql.script(sql.Statement("SELECT :other", ("other",)))


def test_an_older_queue_is_refused_on_open_unless_migrate_auto_and_left_as_it_was(
    db_path: Path, open_db: OpenDb, clock: ManualClock
) -> None:
    _v6_queue(db_path, clock.now())
    before = db_path.read_bytes()
    for options in ({}, {"migrate": "create"}, {"migrate": "never"}):
        with pytest.raises(TransportError) as refused:
            open_db(**options)
        assert str(refused.value) == (
            f"{db_path} has queue schema version 6, and this version of durable-transports "
            f"needs version {sql.SCHEMA_VERSION}; opening upgrades it only with ?migrate=auto "
            f"in the URL: run `transports migrate sqlite:///{db_path}` (`transports migrate "
            "--sql` prints the statements for review)"
        )
    assert db_path.read_bytes() == before
    assert query(db_path, "PRAGMA user_version") == [(6,)]
    migrated = migrate(f"sqlite:///{db_path}")
    assert (migrated.found, migrated.version, migrated.applied) == ("old", 6, True)
    assert query(db_path, "PRAGMA user_version") == [(sql.SCHEMA_VERSION,)]
    assert stats(open_db()).ready == 3


def test_migrate_never_refuses_a_file_without_a_queue_and_creates_none(
    tmp_path: Path, clock: ManualClock
) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(TransportError, match="has no queue yet and this URL says migrate=never"):
        open_transport(f"sqlite:///{missing}?migrate=never", clock=clock)
    assert not missing.exists()
    with pytest.raises(ValueError, match="migrate must be one of create, auto, never, got 'x'"):
        open_transport(f"sqlite:///{missing}?migrate=x", clock=clock)
    assert not missing.exists()
