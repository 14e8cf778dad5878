"""The batch calls' scripts on a real server: ``claim_many`` leases what as many
successive claims lease on a twin queue, through delays, tenants, floors, lapsed leases
and burials; each batch call is one FCALL (counted by a MONITOR connection), a larger
one a call per `_ops.BATCH`; ``settle_many`` reports exactly its stale items."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis

from tests._services import scratch_fixture
from transports_core import (
    Event,
    Lease,
    LeaseLost,
    Message,
    QueueStats,
    Settlement,
    open_async_transport,
    open_transport,
)
from transports_redis import AsyncRedisTransport, RedisTransport
from transports_redis import _ops as ops
from transports_redis import _scripts as scripts

from .server import fresh_queue, with_queue

twin_queue = scratch_fixture("twin_queue", lambda: fresh_queue("tw"))


class Clock:
    """Seconds that move a microsecond at each reading, as a real clock would between
    calls (so no two claims of the singles tie), and jump where the test sets them."""

    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        self.at += 1e-6
        return self.at

    def set(self, at: float) -> None:
        self.at = max(self.at, at)


def _ageless(stats: QueueStats) -> QueueStats:
    rows = tuple(replace(p, oldest_ready_age=None) for p in stats.by_priority)
    return replace(stats, oldest_ready_age=None, by_priority=rows)


# Every span of time is a quarter second off the half-second grid the clocks are set on,
# so that the microseconds by which the twins' clocks differ never decide whether a
# lease, a park or a delay has ended.
START = 1_000_000.0
VISIBILITIES = (3.25, 10.25)
DELAYS = (0.0, 2.25, 6.25)
NACK_DELAY = 4.25
STEPS = (1, 1, 2, 5, 9)  # half seconds between rounds


def _shape(lease: Lease[Any]) -> tuple[int, str, int, int, str]:
    return (lease.seq, lease.group_id, lease.event.n, lease.attempt, lease.worker_id)


def _items(rng: random.Random, first: int, count: int) -> list[Message[Event]]:
    """Messages over ten groups of mixed priorities and tenants, some held back by a
    delay that keeps their place (hold), and two groups of messages that wait apart
    for a delay of their group's (so that each joins its group in seq order, which the
    invariant check, and cancel, expect of a chain)."""
    out = []
    for n in range(first, first + count):
        g = rng.randrange(12)
        if g >= 10:
            out.append(Message(f"d{g}", Event(n=n), priority=g % 5, delay=DELAYS[g - 9]))
            continue
        hold = rng.random() < 0.3
        tenant = ("t1", "t2", None, None)[g % 4]
        delay = rng.choice(DELAYS) if hold else 0.0
        out.append(Message(f"g{g}", Event(n=n), g % 5, delay=delay, hold=hold, tenant=tenant))
    return out


def _singles(t: RedisTransport[Event], limit: int, floor: int, vis: float) -> list[Lease[Event]]:
    got = []
    for _ in range(limit):
        lease = t.claim("w", vis, floor)
        if lease is None:
            break
        got.append(lease)
    return got


def _settle_one(t: RedisTransport[Event], item: Settlement[Event]) -> LeaseLost | None:
    try:
        if item.action == "ack":
            t.ack(item.lease)
        elif item.action == "nack":
            t.nack(item.lease, item.delay)
        else:
            t.bury(item.lease, item.reason or "")
    except LeaseLost as lost:
        return lost
    return None


def _pick(rng: random.Random, lease: Lease[Event]) -> Settlement[Event] | None:
    roll = rng.random()
    if roll < 0.35:
        return Settlement(lease)
    if roll < 0.45:
        return Settlement(lease, "nack")
    if roll < 0.6:
        return Settlement(lease, "nack", NACK_DELAY)
    if roll < 0.65:
        return Settlement(lease, "bury", reason="bad")
    return None  # kept, to lapse or be settled later (maybe once stale)


@pytest.mark.parametrize("batch", [ops.BATCH, 2])
@pytest.mark.parametrize("on_dead", ["release", "hold"])
def test_batches_lease_and_settle_what_single_calls_do_on_a_twin_queue(
    server_queue: tuple[str, str],
    twin_queue: tuple[str, str],
    on_dead: str,
    batch: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ops, "BATCH", batch)  # 2: every batch spans several scripts
    rng = random.Random(f"{on_dead}-{batch}")
    clocks = Clock(START), Clock(START)
    options: dict[str, Any] = {"max_attempts": 3, "on_dead": on_dead}
    a = open_transport(with_queue(*server_queue), clock=clocks[0], **options)
    b = open_transport(with_queue(*twin_queue), clock=clocks[1], **options)
    assert isinstance(a, RedisTransport)
    assert isinstance(b, RedisTransport)
    with a, b:
        for t in (a, b):
            t.set_tenant_weight("t2", 3)
        held: list[tuple[Lease[Event], Lease[Event]]] = []
        published = 0
        half_seconds = 0
        leased = stale = 0
        for _ in range(60):
            half_seconds += rng.choice(STEPS)
            for clock in clocks:
                clock.set(START + half_seconds / 2)
            if rng.random() < 0.4:
                items = _items(rng, published, rng.randrange(1, 12))
                published += len(items)
                assert a.publish_many(items) == b.publish_many(items)
            limit, floor = rng.randrange(1, 13), rng.choice((0, 0, 0, 1, 2, 3))
            vis = rng.choice(VISIBILITIES)
            if held and rng.random() < 0.2:
                # ack_and_claim against an ack then a claim, a stale lease sometimes
                la, lb = held.pop(rng.randrange(len(held)))
                try:
                    b.ack(lb)
                except LeaseLost:
                    with pytest.raises(LeaseLost):
                        a.ack_and_claim(la, "w", vis, floor)
                    continue
                one_a = a.ack_and_claim(la, "w", vis, floor)
                one_b = b.claim("w", vis, floor)
                assert (one_a and _shape(one_a)) == (one_b and _shape(one_b))
                if one_a and one_b:
                    held.append((one_a, one_b))
                continue
            many = a.claim_many("w", vis, limit, floor)
            singles = _singles(b, limit, floor, vis)
            assert [_shape(x) for x in many] == [_shape(x) for x in singles]
            for x, y in zip(many, singles, strict=True):
                assert x.expires_at == pytest.approx(y.expires_at, abs=1e-3)
            leased += len(many)
            held += zip(many, singles, strict=True)
            # Settle some of what is held: fresh leases and old ones, which may be stale.
            rng.shuffle(held)
            kept, todo = [], []
            for la, lb in held:
                what = _pick(rng, la)
                if what is None:
                    kept.append((la, lb))
                else:
                    todo.append((what, Settlement(lb, what.action, what.delay, what.reason)))
            held = kept
            lost_a = a.settle_many([x for x, _ in todo])
            lost_b = [lost for _, y in todo if (lost := _settle_one(b, y)) is not None]
            assert [_shape(x.lease) for x in lost_a] == [_shape(x.lease) for x in lost_b]
            stale += len(lost_a)
        # The runs really went through lapsed leases, stale settles and burials.
        assert leased > 60
        assert stale > 0
        dead_a, dead_b = a.dead_letters(), b.dead_letters()
        assert [(d.seq, d.reason, d.attempts) for d in dead_a] == [
            (d.seq, d.reason, d.attempts) for d in dead_b
        ]
        assert any("bad" in d.reason for d in dead_a)
        assert any("bad" not in d.reason for d in dead_a)  # out of attempts
        # The ages differ by the microseconds the clocks ticked at each reading (the
        # single calls read theirs more often): the rest is equal.
        stats_a, stats_b = a.stats(), b.stats()
        assert _ageless(stats_a) == _ageless(stats_b)
        ages_a = [p.oldest_ready_age for p in stats_a.by_priority]
        ages_b = [p.oldest_ready_age for p in stats_b.by_priority]
        assert [x is None for x in ages_a] == [x is None for x in ages_b]
        assert [x for x in ages_a if x is not None] == pytest.approx(
            [x for x in ages_b if x is not None], abs=1e-3
        )
        groups_a, groups_b = a.groups(100), b.groups(100)
        assert [(g.group_id, g.depth, g.state) for g in groups_a] == [
            (g.group_id, g.depth, g.state) for g in groups_b
        ]


def _sha_names() -> dict[str, str]:
    """Each script's name, by its digest (EVALSHA) and by its function's name (FCALL)."""
    names = {script.sha: script.name for script in scripts.ALL}
    return names | {scripts.LIBRARY.function(script): script.name for script in scripts.ALL}


def _scripts_sent(url: str, queue: str, calls: Callable[[], object]) -> list[str]:
    """The scripts (by name) that the server saw called on ``queue``'s keys while
    ``calls`` ran, as a MONITOR connection reports them."""
    names = _sha_names()
    marker = f"end-{uuid.uuid4().hex}"
    watcher = redis.Redis.from_url(url, decode_responses=True)
    other = redis.Redis.from_url(url, decode_responses=True)
    try:
        with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]
            calls()
            other.echo(marker)
            seen: list[str] = []
            while True:
                command = monitor.next_command()["command"]
                if marker in command:
                    return seen
                if command.startswith(("EVAL", "FCALL")) and f"dt:{{{queue}}}:" in command:
                    word = command.split()[1]
                    seen.append(names.get(word, word))
    finally:
        watcher.close()
        other.close()


def _messages(groups: int) -> list[Message[Event]]:
    return [Message(f"g{i:03}", Event(n=i)) for i in range(groups)]


EXPECTED = [
    "claim_many",
    "settle_many",
    "settle_many",
    "ack_and_claim",
    *["claim_many"] * 3,  # 250 leases: a call per BATCH of 100
    *["settle_many"] * 3,  # and 251 acks
]


def test_each_batch_call_is_one_script_call(
    server_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, queue = server_queue
    assert ops.BATCH == 100
    with open_transport(with_queue(url, queue)) as t:
        assert isinstance(t, RedisTransport)
        # The calls alone: without core's look at the group of the stale lease, which
        # says why it was lost (lease-lost-says-why in the conformance suite).
        monkeypatch.setattr(t, "_explained", lambda lost: lost)
        t.publish_many(_messages(400))
        # Loads the library first: a server that lacks it answers "Function not found" once.
        warm = t.claim_many("warm", 30, 2)
        t.ack_many(warm[:1])
        t.settle_many([Settlement(warm[1], "nack")])
        got: dict[str, Any] = {}

        def calls() -> None:
            leases = got["first"] = t.claim_many("w", 30, 100)
            got["acked"] = t.ack_many(leases[:60])
            got["settled"] = t.settle_many(
                [Settlement(x, "nack", 5.0) for x in leases[60:99]]
                + [Settlement(leases[0], "bury", reason="again")]  # acked: stale
            )
            got["next"] = t.ack_and_claim(leases[99], "w", 30)
            got["more"] = t.claim_many("w", 30, 250)
            got["rest"] = t.ack_many([*got["more"], got["next"]])

        assert _scripts_sent(url, queue, calls) == EXPECTED
        assert len(got["first"]) == 100
        assert len(got["more"]) == 250
        assert got["acked"] == []
        assert got["rest"] == []
        assert [lost.lease for lost in got["settled"]] == [got["first"][0]]
        assert got["next"] is not None
        # 400 published: 1 + 60 + 1 + 251 acked, 39 parked, 48 left to claim.
        stats = t.stats()
        assert (stats.ready, stats.in_flight, stats.parked) == (48, 0, 39)


def test_the_async_twin_sends_the_same_one_script_per_batch(
    server_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, queue = server_queue

    async def unexplained(lost: list[LeaseLost]) -> list[LeaseLost]:
        return lost

    async def run() -> None:
        t = open_async_transport(with_queue(url, queue))
        assert isinstance(t, AsyncRedisTransport)
        monkeypatch.setattr(t, "_explained", unexplained)  # as in the sync twin's test
        async with t:
            await t.publish_many(_messages(400))
            warm = await t.claim_many("warm", 30, 2)
            await t.ack_many(warm[:1])
            await t.settle_many([Settlement(warm[1], "nack")])
            loop = asyncio.get_running_loop()

            async def calls() -> None:
                leases = await t.claim_many("w", 30, 100)
                await t.ack_many(leases[:60])
                await t.settle_many(
                    [Settlement(x, "nack", 5.0) for x in leases[60:99]]
                    + [Settlement(leases[0], "bury", reason="again")]
                )
                nxt = await t.ack_and_claim(leases[99], "w", 30)
                assert nxt is not None
                more = await t.claim_many("w", 30, 250)
                assert await t.ack_many([*more, nxt]) == []

            def in_loop() -> None:
                asyncio.run_coroutine_threadsafe(calls(), loop).result(30)

            # The monitor blocks on its socket: it runs beside the loop, on a thread.
            assert await asyncio.to_thread(_scripts_sent, url, queue, in_loop) == EXPECTED

    asyncio.run(run())


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


def test_settle_many_reports_exactly_the_stale_items_and_settles_the_others(
    queue_url: str, clock: Clock
) -> None:
    with open_transport(queue_url, clock=clock) as t:
        assert isinstance(t, RedisTransport)
        for n, group in enumerate("aabcdef"):
            t.publish(group, Event(n=n))
        a, b, c, d, e = t.claim_many("w1", 100, 5)
        f = t.claim_many("w1", 10, 5)[0]
        assert [x.group_id for x in (a, b, c, d, e, f)] == list("abcdef")
        t.ack(b)  # settled already
        clock.set(START + 20)  # f's lease lapses and another worker takes it
        f2 = t.claim("w2", 10)
        assert f2 is not None
        assert f2.seq == f.seq
        lost = t.settle_many(
            [
                Settlement(a),
                Settlement(b),  # stale: acked
                Settlement(c, "nack"),
                Settlement(d, "bury", reason="bad"),
                Settlement(a),  # stale: acked by this very batch
                Settlement(e, "nack", 30),
                Settlement(f),  # stale: taken again
            ]
        )
        assert [x.lease for x in lost] == [b, a, f]
        # a went on to its next message, c is ready again, d dead, e parked, f still
        # held by w2; b's group is gone.
        again = t.claim_many("w3", 10, 10)
        assert sorted((x.group_id, x.event.n, x.attempt) for x in again) == [
            ("a", 1, 1),
            ("c", 3, 2),
        ]
        assert [(x.seq, x.reason) for x in t.dead_letters()] == [(d.seq, "buried: bad")]
        t.ack(f2)
        assert t.ack_many(again) == []
        clock.set(START + 60)
        assert [(x.group_id, x.attempt) for x in t.claim_many("w4", 10, 10)] == [("e", 2)]


def test_a_batch_that_frees_a_crowd_of_lapsed_leases_goes_on_in_more_scripts(
    server_queue: tuple[str, str], twin_queue: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scripts, "SWEEP", 3)  # a claim frees at most 3; a batch stops at 3
    clocks = Clock(START), Clock(START)
    a = open_transport(with_queue(*server_queue), clock=clocks[0])
    b = open_transport(with_queue(*twin_queue), clock=clocks[1])
    assert isinstance(a, RedisTransport)
    assert isinstance(b, RedisTransport)
    with a, b:
        for t in (a, b):
            t.publish_many(_messages(30))
        assert [_shape(x) for x in a.claim_many("w", 1.25, 30)] == [
            _shape(x) for x in _singles(b, 30, 0, 1.25)
        ]
        for clock in clocks:
            clock.set(START + 5)  # all 30 leases lapse
        got: list[Lease[Event]] = []
        sent = _scripts_sent(
            server_queue[0], server_queue[1], lambda: got.extend(a.claim_many("w", 1.25, 30))
        )
        assert [_shape(x) for x in got] == [_shape(x) for x in _singles(b, 30, 0, 1.25)]
        assert len(got) == 30
        assert len(sent) >= 10  # each script freed 3 at most
        assert set(sent) == {"claim_many"}
