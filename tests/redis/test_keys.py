"""Idempotency keys on Redis: a key in use within the window stores nothing and returns
the original's seq as a `Duplicate`, whatever became of the original; the window runs on
the injected clock when one is given (else the server's TIME); keys are forgotten a few
at a time by the keyed publishes, and several processes racing on one key store it once."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time

import pytest
import redis

from transports_core import Duplicate, Event, Message, open_async_transport, open_transport
from transports_core.conformance import ManualClock
from transports_redis import AsyncRedisTransport, RedisTransport
from transports_redis._scripts import FORGET

from . import _workers

WINDOW = 60.0


def _open(url: str, clock: ManualClock | None = None, **options: object) -> RedisTransport[Event]:
    options.setdefault("dedup_window", WINDOW)
    if clock is not None:
        options["clock"] = clock
    transport = open_transport(url, **options)
    assert isinstance(transport, RedisTransport)
    return transport


def _seq_counter(raw: redis.Redis, queue: str) -> int:
    return int(raw.get(f"dt:{{{queue}}}:seq") or 0)


def test_a_duplicate_returns_the_original_seq_and_stores_nothing(
    queue_url: str, server_queue: tuple[str, str], raw: redis.Redis
) -> None:
    with _open(queue_url) as q:
        seq = q.publish("g", Event(n=1), key="order-1")
        assert type(seq) is int
        handed_out = _seq_counter(raw, server_queue[1])
        again = q.publish("g", Event(n=2), 3, key="order-1")
        assert isinstance(again, Duplicate)
        assert again == seq
        assert _seq_counter(raw, server_queue[1]) == handed_out
        stats = q.stats()
        assert (stats.ready, stats.keys) == (1, 1)
        lease = q.claim("w", 5)
        assert lease is not None
        assert (lease.seq, lease.event.n) == (seq, 1)
        assert q.claim("w", 5) is None
        q.ack(lease)
        # Acked, still a duplicate; and nothing new to claim.
        assert q.publish("g", Event(n=3), key="order-1") == Duplicate(seq)
        assert q.claim("w", 5) is None
        assert q.check() == []


def test_another_group_s_same_key_is_a_new_message(queue_url: str) -> None:
    with _open(queue_url) as q:
        first = q.publish("g", Event(), key="k")
        other = q.publish("h", Event(), key="k")
        assert type(other) is int
        assert other != first
        # A group whose name runs into the key is another (group, key) pair.
        assert type(q.publish("gk", Event(), key="x")) is int
        assert type(q.publish("g", Event(), key="kx")) is int
        assert q.stats().keys == 4


def test_a_key_is_forgotten_after_the_window_on_the_injected_clock(queue_url: str) -> None:
    clock = ManualClock(1_000_000.0)
    with _open(queue_url, clock) as q:
        seq = q.publish("g", Event(n=1), key="k")
        clock.advance(WINDOW - 1)
        assert q.publish("g", Event(n=2), key="k") == Duplicate(seq)
        clock.advance(1)
        fresh = q.publish("g", Event(n=3), key="k")
        assert type(fresh) is int
        assert fresh > seq
        # The key now points at the new message, for a window from its publish.
        assert q.publish("g", Event(n=4), key="k") == Duplicate(fresh)
        clock.advance(WINDOW - 1)
        assert q.publish("g", Event(n=5), key="k") == Duplicate(fresh)
        assert q.stats().ready == 2
        assert q.check() == []


def test_without_a_clock_the_window_runs_on_the_server_s_time(queue_url: str) -> None:
    window = 0.3
    with _open(queue_url, dedup_window=window) as q:
        began = time.monotonic()
        seq = q.publish("g", Event(), key="k")
        deadline = began + 10
        while isinstance(got := q.publish("g", Event(), key="k"), Duplicate):
            assert got == seq
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert time.monotonic() - began >= window
        assert q.stats().ready == 2


def test_purged_and_discarded_messages_keys_are_still_duplicates(queue_url: str) -> None:
    with _open(queue_url, on_dead="release") as q:
        purged = q.publish("p", Event(), key="k")
        assert q.purge_group("p") == 1
        assert q.publish("p", Event(), key="k") == Duplicate(purged)
        dead = q.publish("d", Event(), key="k")
        lease = q.claim("w", 5)
        assert lease is not None
        assert lease.seq == dead
        q.bury(lease, "poison")
        assert q.publish("d", Event(), key="k") == Duplicate(dead)
        assert q.discard(dead)
        assert q.publish("d", Event(), key="k") == Duplicate(dead)
        stats = q.stats()
        assert (stats.ready, stats.dead, stats.keys) == (0, 0, 2)
        assert q.check() == []


def test_a_batch_stores_the_first_of_a_repeated_key_and_reports_the_rest(
    queue_url: str,
) -> None:
    with _open(queue_url) as q:
        before = q.publish("g", Event(n=0), key="old")
        seqs = q.publish_many(
            [
                Message("g", Event(n=1), key="a"),
                ("g", Event(n=2), 0),
                Message("g", Event(n=3), key="a"),
                Message("h", Event(n=4), key="a"),
                Message("g", Event(n=5), key="old"),
                Message("g", Event(n=6)),
            ]
        )
        assert [type(s) for s in seqs] == [int, int, Duplicate, int, Duplicate, int]
        assert seqs[2] == seqs[0]
        assert seqs[4] == before
        assert seqs[1] == seqs[0] + 1
        assert seqs[3] == seqs[1] + 1
        assert seqs[5] == seqs[3] + 1
        got = []
        while (lease := q.claim("w", 5)) is not None:
            got.append(lease.event.n)
            q.ack(lease)
        assert sorted(got) == [0, 1, 2, 4, 6]
        # A batch of duplicates only stores nothing.
        assert q.publish_many([Message("g", Event(), key="a")] * 3) == [Duplicate(seqs[0])] * 3
        assert q.stats().keys == 3
        assert q.check() == []


def test_a_bad_item_rejects_a_keyed_batch_before_anything_is_written(queue_url: str) -> None:
    with _open(queue_url) as q:
        with pytest.raises(ValueError, match=r"items\[1\]"):
            q.publish_many([Message("g", Event(), key="a"), Message("g", Event(), key="")])
        with pytest.raises(TypeError):
            q.publish("g", Event(), key=5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="key"):
            q.publish("g", Event(), key="x" * 256)
        stats = q.stats()
        assert (stats.ready, stats.keys) == (0, 0)
        assert type(q.publish("g", Event(), key="a")) is int


def test_keyed_publishes_forget_a_few_keys_each(
    queue_url: str, server_queue: tuple[str, str], raw: redis.Redis
) -> None:
    clock = ManualClock(1_000_000.0)
    kx = f"dt:{{{server_queue[1]}}}:kx"
    with _open(queue_url, clock) as q:
        q.publish_many([Message("g", Event(), key=f"k{i}") for i in range(3 * FORGET)])
        assert q.stats().keys == raw.zcard(kx) == 3 * FORGET
        clock.advance(WINDOW)
        # Past their time: not counted, though not removed yet.
        assert q.stats().keys == 0
        assert raw.zcard(kx) == 3 * FORGET
        q.publish("g", Event())  # a plain publish forgets nothing
        assert raw.zcard(kx) == 3 * FORGET
        q.publish("g", Event(), key="new")
        assert raw.zcard(kx) == 2 * FORGET + 1
        q.publish_many([Message("g", Event(), key=f"n{i}") for i in range(2)])
        assert raw.zcard(kx) == 3
        assert q.stats().keys == 3
        assert q.check() == []


def test_eight_processes_publishing_the_same_keys_store_each_once(
    queue_url: str,
) -> None:
    keys = [f"key-{i}" for i in range(100)]
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(8), ctx.Queue()
    children = []
    for n in range(8):
        mine = keys[:]
        random.Random(n).shuffle(mine)
        child = ctx.Process(target=_workers.publish_keys, args=(queue_url, mine, start, out))
        child.start()
        children.append(child)
    results = [out.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    by_key: dict[str, set[int]] = {}
    stored = 0
    for rows in results:
        for key, seq, duplicate in rows:
            by_key.setdefault(key, set()).add(seq)
            stored += not duplicate
    assert stored == 100
    assert all(len(seqs) == 1 for seqs in by_key.values())
    with _open(queue_url) as q:
        stats = q.stats()
        assert (stats.ready, stats.keys) == (100, 100)
        assert q.check() == []


def test_the_async_twin_keeps_keys_alike(queue_url: str) -> None:
    async def main() -> None:
        async with open_async_transport(queue_url, dedup_window=WINDOW) as q:
            assert isinstance(q, AsyncRedisTransport)
            seq = await q.publish("g", Event(), key="k")
            assert await q.publish("g", Event(), key="k") == Duplicate(seq)
            seqs = await q.publish_many(
                [Message("g", Event(), key="k"), Message("g", Event(), key="j")] * 2
            )
            assert seqs == [Duplicate(seq), seqs[1], Duplicate(seq), Duplicate(seqs[1])]
            assert type(seqs[1]) is int
            stats = await q.stats()
            assert (stats.ready, stats.keys) == (2, 2)

    asyncio.run(main())


def test_a_big_keyed_batch_is_looked_up_and_remembered_in_chunks(queue_url: str) -> None:
    # More keys than one call takes (a thousand arguments), some used already.
    with _open(queue_url) as q:
        old = q.publish_many([Message("g", Event(n=i), key=f"k{i}") for i in range(0, 2500, 7)])
        items = [Message("g", Event(n=i), key=f"k{i}") for i in range(2500)]
        seqs = q.publish_many(items)
        for i, seq in enumerate(seqs):
            if i % 7 == 0:
                assert seq == Duplicate(old[i // 7])
            else:
                assert type(seq) is int
        assert q.stats().keys == 2500
        assert q.publish_many(items[1998:2003]) == seqs[1998:2003]
        assert all(isinstance(s, Duplicate) for s in q.publish_many(items[1998:2003]))
        assert q.check() == []
