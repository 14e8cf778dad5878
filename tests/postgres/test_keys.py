"""Idempotency keys on PostgreSQL: a repeated key is a `Duplicate` of the original seq and
stores nothing, for as long as the window lasts and whatever became of the original; racing
processes store one message per key; a store at the schema version before keys is upgraded
when opened, and keeps its messages."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from transports_core import (
    Duplicate,
    Event,
    Message,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_core.conformance import ManualClock
from transports_postgres import _sql as sql

from . import _workers

WINDOW = 60.0


def _count(raw: psycopg.Connection[Any], schema: str, table: str) -> int:
    row = raw.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()
    assert row is not None
    return int(row[0])


def _keys(transport: object) -> int:
    assert isinstance(transport, TransportAdmin)
    return transport.stats().keys


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def keyed(queue_url: str, clock: ManualClock) -> Any:
    with open_transport(queue_url, clock=clock, dedup_window=WINDOW) as transport:
        yield transport


def test_a_repeated_key_returns_the_original_seq_and_stores_nothing(
    keyed: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    first = keyed.publish("g", Event(n=1), key="order-1")
    again = keyed.publish("g", Event(n=2), key="order-1")
    assert not isinstance(first, Duplicate)
    assert isinstance(again, Duplicate)
    assert again == first
    assert _count(raw, schema, "messages") == 1
    lease = keyed.claim("w", 30)
    assert lease is not None
    assert lease.event.n == 1
    assert _keys(keyed) == 1


def test_a_key_stays_used_after_its_message_is_acked_and_its_group_gone(
    keyed: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    first = keyed.publish("g", Event(n=1), key="k")
    lease = keyed.claim("w", 30)
    assert lease is not None
    keyed.ack(lease)
    assert _count(raw, schema, "groups") == 0
    again = keyed.publish("g", Event(n=2), key="k")
    assert (again, isinstance(again, Duplicate)) == (first, True)
    # The duplicate left no empty group behind it: nothing to claim, nothing counted.
    assert _count(raw, schema, "groups") == 0
    assert keyed.claim("w", 30) is None


def test_after_the_window_the_key_publishes_anew_and_points_at_the_new_message(
    keyed: Transport[Event], clock: ManualClock
) -> None:
    first = keyed.publish("g", Event(n=1), key="k")
    clock.advance(WINDOW - 1)
    assert isinstance(keyed.publish("g", Event(n=2), key="k"), Duplicate)
    clock.advance(1)
    second = keyed.publish("g", Event(n=3), key="k")
    assert not isinstance(second, Duplicate)
    assert second > first
    assert keyed.publish("g", Event(n=4), key="k") == second
    assert [m.event.n for m in _drain(keyed)] == [1, 3]


def test_the_same_key_in_another_group_is_a_new_message(keyed: Transport[Event]) -> None:
    a = keyed.publish("a", Event(n=1), key="k")
    b = keyed.publish("b", Event(n=2), key="k")
    assert not isinstance(b, Duplicate)
    assert b != a
    assert _keys(keyed) == 2


def test_a_batch_stores_the_first_of_a_repeated_key_and_reports_the_rest(
    keyed: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    earlier = keyed.publish("g", Event(n=0), key="old")
    seqs = keyed.publish_many(
        [
            Message("g", Event(n=1), key="a"),
            ("g", Event(n=2), 0),
            Message("g", Event(n=3), key="a"),
            Message("h", Event(n=4), key="a"),
            Message("g", Event(n=5), key="old"),
            Message("g", Event(n=6), key="old"),
            Message("fresh", Event(n=7), key="old"),
        ]
    )
    dup = [isinstance(s, Duplicate) for s in seqs]
    assert dup == [False, False, True, False, True, True, False]
    assert seqs[2] == seqs[0]
    assert seqs[4] == seqs[5] == earlier
    assert len(set(seqs)) == 5
    assert _count(raw, schema, "messages") == 5
    # Each group counts what it stored, and its head is its first stored message.
    groups = raw.execute(
        f'SELECT g.group_id, g.depth, g.head_seq, (SELECT count(*) FROM "{schema}".messages m '
        f'WHERE m.group_id = g.group_id), (SELECT min(seq) FROM "{schema}".messages m '
        f'WHERE m.group_id = g.group_id) FROM "{schema}".groups g'
    ).fetchall()
    assert sorted((g, depth, head) for g, depth, head, _, _ in groups) == sorted(
        (g, count, first) for g, _, _, count, first in groups
    )
    assert len(groups) == 3
    assert [(m.group_id, m.event.n) for m in _drain(keyed)] == [
        ("g", 0),
        ("h", 4),
        ("fresh", 7),
        ("g", 1),
        ("g", 2),
    ]


def test_a_batch_of_duplicates_only_leaves_no_group_behind(
    keyed: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    seq = keyed.publish("g", Event(n=1), key="k")
    _drain(keyed)
    again = keyed.publish_many(
        [Message("g", Event(n=2), key="k"), Message("g", Event(n=3), key="k")]
    )
    assert again == [seq, seq]
    assert all(isinstance(s, Duplicate) for s in again)
    assert _count(raw, schema, "groups") == 0


def test_expired_keys_are_forgotten_a_few_per_keyed_publish(
    keyed: Transport[Event], clock: ManualClock, raw: psycopg.Connection[Any], schema: str
) -> None:
    keyed.publish_many([Message("g", Event(n=i), key=f"k{i}") for i in range(20)])
    assert _keys(keyed) == 20
    clock.advance(WINDOW)
    assert _keys(keyed) == 0  # expired rows are not counted, though still there
    assert _count(raw, schema, "keys") == 20
    keyed.publish("g", Event(n=99), key="new")
    assert _count(raw, schema, "keys") == 20 - sql.FORGET_BATCH + 1
    keyed.publish("g", Event(n=99))  # a plain publish forgets nothing
    assert _count(raw, schema, "keys") == 20 - sql.FORGET_BATCH + 1
    assert _keys(keyed) == 1


def test_a_bad_key_rejects_the_call_before_anything_is_written(
    keyed: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    with pytest.raises(ValueError, match="key"):
        keyed.publish("g", Event(n=1), key="")
    with pytest.raises(TypeError, match="key"):
        keyed.publish("g", Event(n=1), key=7)  # type: ignore[arg-type]  # the check is the point
    with pytest.raises(ValueError, match=r"items\[1\]"):
        keyed.publish_many(
            [Message("g", Event(n=1), key="a"), Message("g", Event(n=2), key="x" * 256)]
        )
    assert _count(raw, schema, "messages") == 0
    assert _count(raw, schema, "keys") == 0


@pytest.mark.parametrize("window", ["0", "-1", "nan", "soon"])
def test_dedup_window_must_be_positive_seconds(queue_url: str, window: str) -> None:
    with pytest.raises(ValueError, match="dedup_window"):
        open_transport(f"{queue_url}&dedup_window={window}")


def test_the_async_twin_deduplicates_alike(queue_url: str) -> None:
    async def main() -> list[int]:
        async with open_async_transport(f"{queue_url}&dedup_window=5") as queue:
            one = await queue.publish("g", Event(n=1), key="k")
            two = await queue.publish("g", Event(n=2), key="k")
            many = await queue.publish_many(
                [Message("g", Event(n=3), key="k"), Message("g", Event(n=4), key="j")]
            )
            return [one, two, *many]

    seqs = asyncio.run(main())
    assert [isinstance(s, Duplicate) for s in seqs] == [False, True, True, False]
    assert seqs[0] == seqs[1] == seqs[2]


@pytest.mark.parametrize("batch", [0, 10], ids=["publish", "publish_many"])
def test_eight_processes_publishing_the_same_100_keys_store_100(
    queue: Transport[Event],
    queue_url: str,
    raw: psycopg.Connection[Any],
    schema: str,
    tmp_path: Path,
    batch: int,
) -> None:
    keys, processes = 100, 8
    start = tmp_path / "start"
    outs = [tmp_path / f"p{i}" for i in range(processes)]
    spawn = multiprocessing.get_context("spawn")
    # Half the processes publish one by one, half in batches (or all one by one).
    children = [
        spawn.Process(
            target=_workers.publish_keys,
            args=(queue_url, keys, 4, batch if i % 2 else 0, str(start), str(out)),
        )
        for i, out in enumerate(outs)
    ]
    for child in children:
        child.start()
    start.touch()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    seqs: dict[int, set[int]] = {}
    stored = 0
    for out in outs:
        for line in out.read_text().splitlines():
            i, seq, duplicate = map(int, line.split())
            seqs.setdefault(i, set()).add(seq)
            stored += 1 - duplicate
    assert stored == keys, "each key stored once, by exactly one process"
    assert all(len(found) == 1 for found in seqs.values()), "every process saw one seq per key"
    assert _count(raw, schema, "messages") == keys
    assert {m.event.n for m in _drain(queue)} == set(range(keys))


def _drain(transport: Transport[Event]) -> list[Any]:
    leases = []
    while (lease := transport.claim("drain", 30)) is not None:
        leases.append(lease)
        transport.ack(lease)
    return leases


def test_a_batch_after_the_window_stores_its_expired_keys_anew(
    keyed: Transport[Event], clock: ManualClock, raw: psycopg.Connection[Any], schema: str
) -> None:
    first = keyed.publish_many([Message("g", Event(n=i), key=f"k{i}") for i in range(3)])
    _drain(keyed)
    clock.advance(WINDOW)
    # One key expired, one new, in a group the batch creates again: the first try finds
    # a known key, stores nothing, and the batch is stored by the second.
    again = keyed.publish_many([Message("g", Event(n=10), key="k0"), Message("g", Event(n=11))])
    assert not any(isinstance(s, Duplicate) for s in again)
    assert min(again) > max(first)
    assert _count(raw, schema, "messages") == 2
    assert raw.execute(f'SELECT depth FROM "{schema}".groups').fetchall() == [(2,)]
    assert [m.event.n for m in _drain(keyed)] == [10, 11]
    assert isinstance(keyed.publish("g", Event(n=12), key="k0"), Duplicate)
