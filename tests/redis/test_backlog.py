"""The backlog in `stats()` on a real server: the oldest ready message's age and the ready
and busy groups, per priority, read on the injected clock (a `ManualClock` ticks a
microsecond a reading, hence the margins); what the stats walk reads is bounded by the
busy groups, not the backlog; and a queue stored before `rt` and `hg` existed is
upgraded by the first call of a handle of this version."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from transports_core import (
    Event,
    QueueStats,
    Settlement,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_core.conformance import ManualClock
from transports_redis import AsyncRedisTransport, RedisTransport
from transports_redis import _ops as ops
from transports_redis import _scripts as scripts

MARGIN = 1e-3  # the clock's ticks between readings


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def t(queue_url: str, clock: ManualClock) -> Iterator[RedisTransport[Event]]:
    transport = open_transport(queue_url, clock=clock, on_dead="hold")
    assert isinstance(transport, RedisTransport)
    yield transport
    assert transport.check() == []
    transport.close()


def _row(stats: QueueStats, priority: int) -> tuple[float | None, int, int]:
    """The age, ready and busy groups of ``priority``'s row."""
    row = next(p for p in stats.by_priority if p.priority == priority)
    return row.oldest_ready_age, row.ready_groups, row.busy_groups


def _age(stats: QueueStats) -> float:
    assert stats.oldest_ready_age is not None, stats
    return stats.oldest_ready_age


def _matches_groups(admin: TransportAdmin, stats: QueueStats) -> None:
    """Ready and busy groups are what `groups` shows: ready those with state ready, not
    paused; busy the rest of those with messages; per priority too."""
    shown = [g for g in admin.groups(limit=100_000) if g.depth >= 1]
    ready = [g for g in shown if g.state == "ready" and not g.paused]
    assert (stats.ready_groups, stats.busy_groups) == (len(ready), len(shown) - len(ready))
    for row in stats.by_priority:
        here = [g for g in shown if g.priority == row.priority]
        free = [g for g in ready if g.priority == row.priority]
        assert (row.ready_groups, row.busy_groups) == (len(free), len(here) - len(free))


def test_a_leased_head_is_not_aged_and_what_waits_behind_it_is(
    t: RedisTransport[Event], clock: ManualClock
) -> None:
    assert (t.stats().oldest_ready_age, t.stats().ready_groups, t.stats().busy_groups) == (
        None,
        0,
        0,
    )
    t.publish("a", Event(n=1))
    clock.advance(10)
    t.publish("a", Event(n=2))
    t.publish("b", Event(n=1))
    clock.advance(10)
    lease = t.claim("w", 30)
    assert lease is not None
    assert lease.group_id == "a"
    stats = t.stats()
    # a's head, 20 s old, is in flight: the oldest ready ones are 10 s old, one behind it
    assert _age(stats) == pytest.approx(10, abs=MARGIN)
    assert (stats.ready, stats.ready_groups, stats.busy_groups) == (2, 1, 1)
    _matches_groups(t, stats)

    # Parked by a nack: still not ready. Once the park ends, aged from its publish.
    t.nack(lease, 5)
    assert _age(t.stats()) == pytest.approx(10, abs=MARGIN)
    clock.advance(6)
    stats = t.stats()
    assert _age(stats) == pytest.approx(26, abs=MARGIN)
    assert (stats.ready_groups, stats.busy_groups) == (2, 0)  # no claim freed it yet
    _matches_groups(t, stats)

    # A lease that lapses does not make it younger either.
    other, lease = t.claim("w", 30), t.claim("w", 30)  # b's, never claimed, first
    assert other is not None
    assert other.group_id == "b"
    assert lease is not None
    assert lease.seq == 1
    assert _age(t.stats()) == pytest.approx(16, abs=MARGIN)  # a's second, behind it
    clock.advance(31)
    stats = t.stats()
    assert _age(stats) == pytest.approx(57, abs=MARGIN)
    assert (stats.ready_groups, stats.busy_groups) == (2, 0)
    t.ack(lease)  # the lapsed lease is still current: nobody claimed again
    assert _age(t.stats()) == pytest.approx(47, abs=MARGIN)
    t.ack(other)


def test_delayed_messages_age_from_their_due_time(
    t: RedisTransport[Event], clock: ManualClock
) -> None:
    t.publish("apart", Event(n=1), delay=30)
    t.publish("held", Event(n=1), delay=30, hold=True)
    t.publish("behind", Event(n=1))
    t.publish("behind", Event(n=2), delay=20, hold=True)  # chained, not the head
    lease = t.claim("w", 300)
    assert lease is not None
    assert lease.group_id == "behind"
    stats = t.stats()
    assert (stats.ready, stats.delayed, stats.oldest_ready_age) == (0, 3, None)
    # the hold-delayed head holds its group; the one apart makes none yet
    assert (stats.ready_groups, stats.busy_groups) == (0, 2)
    _matches_groups(t, stats)
    clock.advance(25)
    stats = t.stats()
    assert (stats.ready, stats.delayed) == (1, 2)
    assert _age(stats) == pytest.approx(5, abs=MARGIN)
    clock.advance(15)
    stats = t.stats()  # promotes the one apart first, as a claim would
    assert (stats.ready, stats.delayed) == (3, 0)
    assert _age(stats) == pytest.approx(20, abs=MARGIN)
    assert (stats.ready_groups, stats.busy_groups) == (2, 1)
    _matches_groups(t, stats)
    t.ack(lease)


def test_paused_groups_are_busy_and_their_messages_still_age(
    t: RedisTransport[Event], clock: ManualClock
) -> None:
    t.publish("p", Event(n=1))
    t.publish("q", Event(n=1))
    lease = t.claim("w", 10)
    assert lease is not None
    assert lease.group_id == "p"
    t.publish("p", Event(n=2))
    assert t.pause_group("p")
    assert t.pause_group("q")
    assert t.pause_group("empty")
    clock.advance(5)
    stats = t.stats()
    assert (stats.ready, stats.ready_groups, stats.busy_groups, stats.paused) == (2, 0, 2, 3)
    assert _age(stats) == pytest.approx(5, abs=MARGIN)
    _matches_groups(t, stats)
    clock.advance(10)  # p's lease lapses: its head counts as ready, its group stays busy
    stats = t.stats()
    assert (stats.ready, stats.ready_groups, stats.busy_groups) == (3, 0, 2)
    assert _age(stats) == pytest.approx(15, abs=MARGIN)
    _matches_groups(t, stats)
    assert t.resume_group("q")
    stats = t.stats()
    assert (stats.ready_groups, stats.busy_groups) == (1, 1)
    _matches_groups(t, stats)


def test_a_held_group_is_busy_only_with_messages_behind_and_a_requeue_ages_from_then(
    t: RedisTransport[Event], clock: ManualClock
) -> None:
    t.publish("x", Event(n=1))
    t.publish("y", Event(n=1))
    clock.advance(1)
    t.publish("x", Event(n=2))
    for _ in range(2):
        lease = t.claim("w", 60)
        assert lease is not None
        t.bury(lease, "bad")  # on_dead=hold: x is held with one behind, y with none
    clock.advance(9)
    stats = t.stats()
    assert (stats.ready, stats.dead, stats.ready_groups, stats.busy_groups) == (1, 2, 0, 1)
    assert _age(stats) == pytest.approx(9, abs=MARGIN)
    _matches_groups(t, stats)

    dead = {d.group_id: d.seq for d in t.dead_letters()}
    assert t.requeue(dead["y"])
    clock.advance(2)
    stats = t.stats()
    assert (stats.ready, stats.ready_groups, stats.busy_groups) == (2, 1, 1)
    assert _age(stats) == pytest.approx(11, abs=MARGIN)  # x's second, not y's requeued
    t.purge_group("x")
    stats = t.stats()
    assert _age(stats) == pytest.approx(2, abs=MARGIN)  # y's, from its requeue
    assert (stats.ready_groups, stats.busy_groups) == (1, 0)
    _matches_groups(t, stats)


def test_ages_and_groups_are_split_by_the_groups_priority(
    t: RedisTransport[Event], clock: ManualClock
) -> None:
    t.publish("low", Event(n=1), 0)
    clock.advance(30)
    t.publish("high", Event(n=1), 3)
    t.publish("low", Event(n=2), 3)  # counts under low's priority, 0
    clock.advance(10)
    t.publish("high2", Event(n=1), 3)
    lease = t.claim("w", 60, min_priority=3)
    assert lease is not None
    assert lease.group_id == "high"
    stats = t.stats()
    low, high = _row(stats, 0), _row(stats, 3)
    assert low[0] == pytest.approx(40, abs=MARGIN)
    assert high[0] == pytest.approx(0, abs=MARGIN)
    assert (low[1:], high[1:]) == ((1, 0), (1, 1))
    assert _age(stats) == pytest.approx(40, abs=MARGIN)
    assert (stats.ready_groups, stats.busy_groups) == (2, 1)
    _matches_groups(t, stats)
    t.cancel(1)  # low's head: its second, 10 s old, is the oldest at priority 0
    assert _row(t.stats(), 0)[0] == pytest.approx(10, abs=MARGIN)
    # A tenant's ready groups are counted apart from the ready sets (in `tc`).
    t.publish("shop", Event(n=1), 3, tenant="acme")
    t.publish("shop2", Event(n=1), 1, tenant="acme")
    stats = t.stats()
    assert (_row(stats, 1)[1:], _row(stats, 3)[1:]) == ((1, 0), (2, 1))
    _matches_groups(t, stats)
    t.ack(lease)


def test_the_age_is_on_the_servers_clock(queue_url: str) -> None:
    with open_transport(queue_url) as transport:
        assert isinstance(transport, RedisTransport)
        before = time.time()
        transport.publish_many([("g", Event(n=1), 0), ("h", Event(n=2), 1)])
        stats = transport.stats()
        elapsed = time.time() - before
        # the server and this process read one host's clock
        assert 0 <= _age(stats) <= elapsed + 0.05
        assert (stats.ready_groups, stats.busy_groups) == (2, 0)


def _scripts_sent(transport: RedisTransport[Event], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the scripts ``transport`` runs from now on, in order."""
    sent: list[str] = []
    execute = transport._execute

    def spy(call: ops.ScriptCall) -> object:
        sent.append(call[0].name)
        return execute(call)

    monkeypatch.setattr(transport, "_execute", spy)
    return sent


def test_the_walks_read_busy_groups_not_the_backlog(
    t: RedisTransport[Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = [f"g{g:02}" for g in range(50)]
    t.publish_many([(g, Event(n=n), 0) for n in range(40) for g in groups])
    leases = t.claim_many("w", 60, 50)  # every group's head, the 50 oldest messages
    assert len(leases) == 50
    sent = _scripts_sent(t, monkeypatch)
    stats = t.stats()
    # 2,000 messages: the walk passes 50 leased heads and a few more, in one script
    assert sent == ["promote_due", "stats"]
    assert (stats.ready, stats.in_flight, stats.ready_groups, stats.busy_groups) == (
        1950,
        50,
        0,
        50,
    )
    assert stats.oldest_ready_age is not None
    monkeypatch.setattr(ops, "CHUNK", 20)
    sent.clear()
    assert t.stats().busy_groups == 50
    # busy ends at its first item (no lease lapsed), then the paused and held groups,
    # then the 50 leased heads ahead of the oldest ready message, 20 a script
    assert sent == ["promote_due", "stats", "stats", "stats"]
    t.settle_many([Settlement(lease) for lease in leases])


def _as_stored_before(raw: redis.Redis, queue: str) -> None:
    """The queue as a version before `scripts.VERSION` left it: no rt, no hg, no v."""
    prefix = ops.key_prefix(queue)
    raw.delete(prefix + "rt", prefix + "hg")
    raw.hdel(prefix + "n", "v")


def test_a_queue_stored_before_is_upgraded_by_a_handles_first_call(
    server_queue: tuple[str, str],
    queue_url: str,
    raw: redis.Redis,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = server_queue[1]
    with open_transport(queue_url, clock=clock, on_dead="hold") as old:
        assert isinstance(old, RedisTransport)
        old.publish_many([("deep", Event(n=n), 0) for n in range(9)])  # spans chunks
        old.publish("held", Event(n=1), 2)
        old.publish("held", Event(n=2), 2)
        due = clock.now() + 100
        old.publish("later", Event(n=1), 1, delay=100, hold=True)
        lease = old.claim("w", 60, min_priority=2)
        assert lease is not None
        old.bury(lease, "bad")
        leased = old.claim("w", 60)
        assert leased is not None
        assert leased.group_id == "deep"
        before = old.stats()
        _as_stored_before(raw, queue)
        assert old.check() != []  # what this version's invariants want is missing
    monkeypatch.setattr(ops, "CHUNK", 2)  # the walk resumes mid-chain, mid-scan page
    with open_transport(queue_url, clock=clock, on_dead="hold") as new:
        assert isinstance(new, RedisTransport)
        sent = _scripts_sent(new, monkeypatch)
        assert new.check() == []  # its first call: the upgrade, then the check
        assert sent[0] == "stored_version"
        assert sent.count("upgrade") > 5
        assert sent[-1] == "check"
        clock.advance(7)
        stats = new.stats()
        assert raw.hget(ops.key_prefix(queue) + "n", "v") == str(scripts.VERSION)
        # existing messages count as ready since the upgrade; the rest is as it was
        assert _age(stats) == pytest.approx(7, abs=MARGIN)
        assert (stats.ready, stats.in_flight, stats.delayed, stats.dead) == (
            before.ready,
            before.in_flight,
            before.delayed,
            before.dead,
        )
        assert (stats.ready_groups, stats.busy_groups) == (0, 3)  # leased, held, hold
        _matches_groups(new, stats)
        clock.advance(100)  # the hold-delayed one ages from its due time, not the upgrade
        assert _row(new.stats(), 1)[0] == pytest.approx(clock.now() - due, abs=MARGIN)
    with open_transport(queue_url, clock=clock, on_dead="hold") as again:
        assert isinstance(again, RedisTransport)
        sent = _scripts_sent(again, monkeypatch)
        again.stats()
        assert "upgrade" not in sent
        assert sent[0] == "stored_version"
        again.ack(leased)
        assert again.check() == []


def test_the_async_twin_upgrades_too(
    server_queue: tuple[str, str], queue_url: str, raw: redis.Redis
) -> None:
    with open_transport(queue_url) as old:
        old.publish_many([(f"g{g}", Event(n=g), 0) for g in range(5)])
    _as_stored_before(raw, server_queue[1])

    async def main() -> QueueStats:
        async with open_async_transport(queue_url) as transport:
            assert isinstance(transport, AsyncRedisTransport)
            stats = await transport.stats()
            assert await transport.check() == []
            return stats

    stats = asyncio.run(main())
    assert (stats.ready, stats.ready_groups, stats.oldest_ready_age is not None) == (5, 5, True)
