"""The admin calls cost at most a chunk of items a script: with chunks made tiny, every
answer that spans several scripts is checked against what the queue holds, the
conformance suite's admin scenarios pass in chunks of one, the counters that stats reads
are checked by the invariant script (and a drifted one is caught), and a claim frees at
most `SWEEP` lapsed leases."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from conformance._suites import opener
from transports_core import (
    Event,
    LeaseLost,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_core.conformance import CAPABILITIES, PARALLEL_CLAIMS, WITHIN, ManualClock
from transports_core.conformance._admin import AdminScenarios
from transports_redis import AsyncRedisTransport, RedisTransport
from transports_redis import _ops as ops
from transports_redis import _scripts as scripts

from .server import fresh_queue, private_server, with_queue


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(ops, "CHUNK", 3)
    return 3


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def manual(queue_url: str, clock: ManualClock) -> Iterator[RedisTransport[Event]]:
    transport = open_transport(queue_url, clock=clock, on_dead="hold")
    assert isinstance(transport, RedisTransport)
    yield transport
    transport.close()


class TestAdminInChunksOfOne(AdminScenarios):
    """The suite's admin scenarios, every admin answer read one item a script."""

    capabilities = CAPABILITIES - {PARALLEL_CLAIMS, WITHIN}  # as conformance/test_redis.py

    @pytest.fixture(autouse=True)
    def _one_at_a_time(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(ops, "CHUNK", 1)

    @pytest.fixture
    def transport_url(self) -> Iterator[str]:
        with fresh_queue("chunk") as (url, queue):
            yield with_queue(url, queue)

    @pytest.fixture
    def make_transport(self, transport_url: str, clock: ManualClock) -> object:
        return opener(transport_url, clock)


def _scripts_run(raw: redis.Redis) -> int:
    stats = raw.info("commandstats")
    calls = [stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("fcall", "evalsha")]
    return int(sum(calls))


@pytest.fixture
def alone(clock: ManualClock) -> Iterator[tuple[RedisTransport[Event], redis.Redis]]:
    """A transport on a private server, and a plain client on it: the server's count of
    scripts run is this test's alone (other runs share the local server)."""
    with private_server() as server:
        transport = open_transport(with_queue(server.url, "chunks"), clock=clock, on_dead="hold")
        assert isinstance(transport, RedisTransport)
        raw = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            yield transport, raw
        finally:
            raw.close()
            transport.close()


def test_answers_that_span_many_chunks_are_whole(
    tiny_chunks: int, alone: tuple[RedisTransport[Event], redis.Redis], clock: ManualClock
) -> None:
    manual, raw = alone
    admin: TransportAdmin = manual
    # More groups than Redis keeps in a compact hash (512 on the shared server), which it
    # scans in one go whatever the count asked.
    depths = {f"g{g:03}": 1 + (g * 7) % 11 for g in range(700)}
    for n in range(11):
        manual.publish_many([(g, Event(n=n), int(g[-1]) % 2) for g, d in depths.items() if n < d])
    leased = [manual.claim("w", 60) for _ in range(5)]
    for _ in range(4):
        lease = manual.claim("w", 60)
        assert lease is not None
        manual.nack(lease, 30)
    buried = manual.claim("w", 60)
    assert buried is not None
    manual.bury(buried, "bad")  # on_dead=hold: it holds its group

    shown = {g: d - (g == buried.group_id) for g, d in depths.items()}
    before = _scripts_run(raw)
    got = admin.groups(limit=12)
    assert _scripts_run(raw) - before > 100  # 700 groups, about three a script
    deepest = sorted(shown.values(), reverse=True)[:12]
    assert [g.depth for g in got] == deepest
    assert [g.head_seq for g in got if g.depth == deepest[-1]] == sorted(
        g.head_seq for g in got if g.depth == deepest[-1]
    )  # ties: oldest head first
    every = admin.groups(limit=1000)
    assert {g.group_id: g.depth for g in every} == shown
    states = sorted(g.state for g in every if g.state != "ready")
    assert states == ["held"] + ["in_flight"] * 5 + ["parked"] * 4
    total = sum(depths.values())
    stats = admin.stats()
    assert (stats.in_flight, stats.parked, stats.dead) == (5, 4, 1)
    assert stats.ready == total - 5 - 4 - 1
    assert [p.priority for p in stats.by_priority] == [0, 1]
    assert admin.held_groups()[0].seq == buried.seq

    # The group counts are those groups() shows, read three items a script too.
    held_busy = int(shown[buried.group_id] > 0)
    assert (stats.ready_groups, stats.busy_groups) == (700 - 10, 9 + held_busy)
    assert stats.oldest_ready_age is not None

    # The leases and parks end: stats counts them ready, though no claim has freed them
    # yet, reading those nine entries of busy three a script, after the one script that
    # moves due delayed messages into their groups (none here). The fourth finds the end
    # of busy and goes on through the paused and held groups to the age of priority 0's
    # oldest ready message; the fifth finds priority 1's.
    clock.advance(61)
    before = _scripts_run(raw)
    lapsed = admin.stats()
    assert _scripts_run(raw) - before == 1 + 5
    assert (lapsed.in_flight, lapsed.parked, lapsed.ready) == (0, 0, total - 1)
    assert (lapsed.ready_groups, lapsed.busy_groups) == (700 - 1, held_busy)
    assert lapsed.oldest_ready_age is not None
    assert lapsed.oldest_ready_age > 61
    assert all(lease is not None for lease in leased)
    assert manual.check() == []


def test_dead_letters_page_through_chunks_and_purge_goes_step_by_step(
    tiny_chunks: int, manual: RedisTransport[Event], queue_url: str, clock: ManualClock
) -> None:
    admin: TransportAdmin = manual
    seqs = [manual.publish("deep", Event(n=n)) for n in range(20)]
    with open_transport(queue_url, clock=clock, on_dead="release") as releasing:
        for _ in range(7):  # each buried head lets the group go on
            lease = releasing.claim("w", 60)
            assert lease is not None
            releasing.bury(lease, "bad")
    held_seq = manual.publish("held", Event(n=0))
    lease = manual.claim("w", 60, min_priority=0)
    while lease is not None and lease.group_id != "held":
        manual.nack(lease)
        lease = manual.claim("w", 60)
    assert lease is not None
    manual.bury(lease, "holds")
    assert [d.seq for d in admin.dead_letters()] == [*seqs[:7], held_seq]  # three pages
    assert [d.seq for d in admin.dead_letters(limit=5)] == seqs[:5]
    assert [(h.group_id, h.seq, h.waiting) for h in admin.held_groups()] == [("held", held_seq, 0)]
    assert admin.stats().dead == 8
    assert manual.check() == []
    assert admin.purge_group("deep") == 13 + 7  # a dozen scripts, three items each
    assert [d.seq for d in admin.dead_letters()] == [held_seq]
    assert [g.group_id for g in admin.groups()] == ["held"]
    assert manual.check() == []
    assert admin.purge_group("held") == 1
    assert (admin.dead_letters(), admin.groups(), admin.held_groups()) == ([], [], [])
    assert manual.check() == []


def test_purge_takes_a_leased_head_and_leaves_what_comes_after_it_began(
    tiny_chunks: int, manual: RedisTransport[Event]
) -> None:
    for n in range(10):
        manual.publish("g", Event(n=n))
    lease = manual.claim("w", 60)
    assert lease is not None
    assert manual.purge_group("g") == 10
    with pytest.raises(LeaseLost):
        manual.ack(lease)
    assert manual.stats().ready == 0
    assert manual.check() == []


def test_async_admin_calls_go_through_chunks_too(tiny_chunks: int, queue_url: str) -> None:
    async def main() -> None:
        async with open_async_transport(queue_url) as transport:
            assert isinstance(transport, AsyncRedisTransport)
            await transport.publish_many([(f"g{g}", Event(n=g), 0) for g in range(600)])
            for g in range(0, 200, 50):
                await transport.publish(f"g{g}", Event(n=-g))
            got = await transport.groups(limit=4)
            assert [(g.group_id, g.depth) for g in got] == [
                ("g0", 2), ("g50", 2), ("g100", 2), ("g150", 2),
            ]  # fmt: skip
            assert (await transport.stats()).ready == 604
            assert await transport.purge_group("g50") == 2
            assert await transport.check() == []

    asyncio.run(main())


def test_the_invariant_script_catches_a_drifted_counter(
    queue: Transport[Event], raw: redis.Redis, server_queue: tuple[str, str]
) -> None:
    assert isinstance(queue, RedisTransport)
    queue.publish("g", Event(n=1))
    assert queue.check() == []
    counters = f"dt:{{{server_queue[1]}}}:n"
    raw.hincrby(counters, "m0", 1)
    assert queue.check() == ["counter m0 is 2, the structures say 1"]
    raw.hincrby(counters, "m0", -1)


def test_a_claim_frees_at_most_sweep_lapsed_leases(
    monkeypatch: pytest.MonkeyPatch, manual: RedisTransport[Event], clock: ManualClock
) -> None:
    monkeypatch.setattr(scripts, "SWEEP", 2)
    for g in range(6):
        manual.publish(f"g{g}", Event(n=g))
    leases = [manual.claim("w", 10) for _ in range(6)]
    assert all(lease is not None for lease in leases)
    clock.advance(11)
    again = [manual.claim("w2", 10) for _ in range(6)]  # each frees two, takes one
    assert sorted(lease.group_id for lease in again if lease is not None) == [
        f"g{g}" for g in range(6)
    ]
    assert manual.stats().in_flight == 6
    assert manual.check() == []
