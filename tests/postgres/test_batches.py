"""The PostgreSQL fast paths of the batch calls: ``claim_many`` in one statement and
``ack_many`` in one round trip, against what single calls do.

Twin queues take the same publishes and settles; one is claimed with ``claim_many`` and
acked with ``ack_many``, the other with as many single claims and acks, on the server's
clock, through lapses, burials, pauses, floors, tenants and delayed messages: each round
the two must lease the same messages, in the same order, and report the same stale leases.
Round trips are counted off libpq's trace of the transport's one connection: what the
client really sent to the server, message by message.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.pq import Trace

from transports_core import (
    Event,
    Lease,
    LeaseLost,
    Message,
    QueueStats,
    Settlement,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_postgres import PostgresTransport

from . import _workers
from .server import fresh_schema, with_schema

GROUPS = 24
Shape = tuple[str, int, int, int]


def _shape(leases: list[Lease[Any]]) -> list[Shape]:
    return [(x.group_id, x.seq, x.event.n, x.attempt) for x in leases]


def _singles(t: Transport[Event], worker: str, visibility: float, limit: int, floor: int) -> Any:
    got = []
    for _ in range(limit):
        lease = t.claim(worker, visibility, floor)
        if lease is None:
            break
        got.append(lease)
    return got


@contextmanager
def twin_queues(queue_url: str, **options: Any) -> Iterator[tuple[Transport[Event], ...]]:
    """The test's own queue and a twin in a schema of its own, opened with ``options``."""
    with fresh_schema("tw") as (server, schema):
        twin_url = with_schema(server, schema, pool_min_size=0, pool_max_size=2)
        with (
            open_transport(queue_url, **options) as many,
            open_transport(twin_url, **options) as one,
        ):
            yield many, one


@contextmanager
def sent(transport: Transport[Event]) -> Iterator[Callable[[], Counter[str]]]:
    """What the transport sends from here on, counted by message type of the protocol
    (a `Sync` ends each round trip, a `Bind` runs each statement): each call of the
    function returns the counts since the last. The transport must have one connection
    (pool_max_size=1), traced by libpq."""
    assert isinstance(transport, PostgresTransport)
    with tempfile.TemporaryFile("w+") as trace:
        # The pool's only connection: every call borrows it (private, for the trace only).
        with transport._pool.connection() as conn:
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)

        def counts() -> Counter[str]:
            trace.seek(0)
            lines = trace.read().splitlines()
            trace.seek(0)
            trace.truncate()
            return Counter(line.split()[2] for line in lines if line.split()[:1] == ["F"])

        try:
            yield counts
        finally:
            with transport._pool.connection() as conn:
                conn.pgconn.untrace()


@pytest.fixture
def one_conn(schema_url: tuple[str, str]) -> Iterator[Transport[Event]]:
    url, schema = schema_url
    with open_transport(with_schema(url, schema, pool_min_size=1, pool_max_size=1)) as t:
        yield t


# --- one round trip ----------------------------------------------------------------------


def _unexplained(t: Transport[Event], monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave out core's look at a lost lease's group (a call that says why, made only
    when a lease is lost), so that the counts are the transport's call alone."""
    monkeypatch.setattr(t, "_explained", lambda lost: lost)


def test_a_batch_of_claims_and_one_of_acks_are_one_round_trip_each(
    one_conn: Transport[Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = one_conn
    _unexplained(t, monkeypatch)
    t.publish_many([(f"g{g}", Event(n=g), g % 3) for g in range(150)])
    with sent(t) as counts:
        counts()
        leases = t.claim_many("w", 60, 100)
        claimed = counts()
        assert len(leases) == 100
        assert len({x.group_id for x in leases}) == 100
        assert (claimed["Sync"], claimed["Bind"]) == (1, 1), claimed
        leases[7:8] = []  # one left out; a stale one put in
        t.nack(leases[3])
        stale = leases[3]
        counts()
        lost = t.ack_many(leases)
        acked = counts()
        assert [x.lease for x in lost] == [stale]
        assert (acked["Sync"], acked["Bind"]) == (1, 2), acked  # the locks, then the acks
        rest = t.claim_many("w", 60, 100, min_priority=1)
        assert (counts()["Sync"], len(rest)) == (1, 34)  # 50 free: 17 of 1, 16 of 2, + g3...
        assert all(x.event.n % 3 >= 1 for x in rest)
        t.ack_many(rest)
        counts()
        assert len(t.claim_many("w", 60, 100)) == 17  # the floor 0 ones, and g7 left in flight
        counts()
        # Nothing ready: the statement, then the wake-up a single claim makes (no third).
        assert t.claim_many("w", 60, 100) == []
        assert counts()["Sync"] == 2


def test_ack_and_claim_is_one_round_trip_and_a_stale_lease_claims_nothing(
    one_conn: Transport[Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = one_conn
    _unexplained(t, monkeypatch)
    t.publish_many([(g, Event(n=n), 0) for n in (1, 2) for g in "ab"])
    lease = t.claim("w", 60)
    assert lease is not None
    with sent(t) as counts:
        counts()
        nxt = t.ack_and_claim(lease, "w", 60)
        once = counts()
        assert (once["Sync"], once["Bind"]) == (1, 4), once  # BEGIN, ack, claim, COMMIT
        assert nxt is not None
        assert (lease.group_id, nxt.group_id, nxt.event.n) == ("a", "b", 1)
        # Stale: the same lease again (acked already). LeaseLost, and nothing claimed.
        with pytest.raises(LeaseLost):
            t.ack_and_claim(lease, "w", 60)
        assert counts()["Sync"] == 1
    assert isinstance(t, TransportAdmin)
    assert t.stats().in_flight == 1  # b's head only: the stale call claimed nothing
    left = sorted((x.group_id, x.event.n) for x in t.claim_many("w", 60, 10))
    assert left == [("a", 2)]  # b is in flight; a's next one is still there


def test_batches_that_are_not_distinct_acks_keep_the_generic_path(
    one_conn: Transport[Event],
) -> None:
    t = one_conn
    for g in "abcd":
        t.publish(g, Event(n=1))
        t.publish(g, Event(n=2))
    a, b, c, d = t.claim_many("w", 60, 4)
    with sent(t) as counts:
        # The same lease twice: acked once, stale the second time, in order.
        lost = t.ack_many([a, b, a])
        assert [x.lease for x in lost] == [a]
        assert counts()["Sync"] > 1  # BEGIN and the acks, then the COMMIT
        lost = t.settle_many([Settlement(c), Settlement(d, "nack"), Settlement(b)])
        assert [x.lease for x in lost] == [b]
        assert counts()["Sync"] > 1
    got = sorted((x.group_id, x.event.n, x.attempt) for x in t.claim_many("w", 60, 10))
    assert got == [("a", 2, 1), ("b", 2, 1), ("c", 2, 1), ("d", 1, 2)]


# --- twins ------------------------------------------------------------------------------


def _round(
    rng: random.Random,
    twins: tuple[Transport[Event], Transport[Event]],
    held: tuple[list[Lease[Event]], list[Lease[Event]]],
    counter: Iterator[int],
    variant: str,
) -> None:
    many, one = twins
    items: list[Message[Event]] = []
    for _ in range(rng.randrange(1, 30)):
        g = rng.randrange(GROUPS)
        delay = 0.05 if variant == "timers" and rng.random() < 0.3 else 0
        tenant = f"t{g % 3}" if variant == "tenants" and g % 4 else None
        items.append(Message(f"g{g}", Event(n=next(counter)), g % 4, delay=delay, tenant=tenant))
    for t in twins:
        t.publish_many(items)
    if variant == "pauses" and rng.random() < 0.5:
        group, pause = f"g{rng.randrange(GROUPS)}", rng.random() < 0.6
        for t in twins:
            assert isinstance(t, TransportAdmin)
            (t.pause_group if pause else t.resume_group)(group)
    if variant == "timers":
        time.sleep(0.1)  # the delayed ones are due on both
    limit, floor = rng.choice([1, 2, 5, 9, 30, 100]), rng.choice([0, 0, 0, 1, 2, 3])
    visibility = 0.4 if rng.random() < 0.25 else 60.0
    got_many = many.claim_many("w", visibility, limit, floor)
    got_one = _singles(one, "w", visibility, limit, floor)
    assert _shape(got_many) == _shape(got_one), (variant, limit, floor)
    held[0].extend(got_many)
    held[1].extend(got_one)
    # Settle a random part of what is held (some lapsed and claimed again: stale).
    chosen = sorted(rng.sample(range(len(held[0])), rng.randrange(len(held[0]) + 1)))
    nacked = {i for i in chosen if rng.random() < (0.5 if variant == "burials" else 0.15)}
    acks = [[h[i] for i in chosen if i not in nacked] for h in held]
    lost_many = many.ack_many(acks[0])
    lost_one = []
    for lease in acks[1]:
        try:
            one.ack(lease)
        except LeaseLost as lost:
            lost_one.append(lost)
    assert _shape([x.lease for x in lost_many]) == _shape([x.lease for x in lost_one])
    for t, h in zip(twins, held, strict=True):
        for i in sorted(nacked):
            with suppress(LeaseLost):
                t.nack(h[i])
        h[:] = [lease for i, lease in enumerate(h) if i not in set(chosen)]
    if visibility < 1:
        time.sleep(visibility + 0.1)  # lapsed on both


def _aged(stats: QueueStats) -> QueueStats:
    """``stats`` with each age only as whether there is one (0.0 or None): two queues on
    the server's clock, fed one after the other, agree on everything else."""

    def seen(age: float | None) -> float | None:
        return None if age is None else 0.0

    return replace(
        stats,
        oldest_ready_age=seen(stats.oldest_ready_age),
        by_priority=tuple(
            replace(p, oldest_ready_age=seen(p.oldest_ready_age)) for p in stats.by_priority
        ),
    )


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain", "burials", "pauses", "tenants", "timers"])
def test_claim_many_and_ack_many_agree_with_single_calls_on_a_twin_queue(
    queue_url: str, variant: str
) -> None:
    rng = random.Random(f"twins-{variant}")
    counter = itertools.count()
    with twin_queues(queue_url, max_attempts=3) as (many, one):
        held: tuple[list[Lease[Event]], list[Lease[Event]]] = ([], [])
        for _ in range(25):
            _round(rng, (many, one), held, counter, variant)
        assert isinstance(many, TransportAdmin)
        assert isinstance(one, TransportAdmin)
        assert _aged(many.stats()) == _aged(one.stats())
        dead = [(x.seq, x.group_id, x.attempts) for x in many.dead_letters()]
        assert dead == [(x.seq, x.group_id, x.attempts) for x in one.dead_letters()]
        if variant == "burials":
            assert dead, "no head ran out of deliveries: the variant tested nothing"
        if variant == "tenants":
            assert len(many.tenants()) > 1
        drained_many = many.claim_many("w", 60, 1000)
        assert _shape(drained_many) == _shape(_singles(one, "w", 60, 1000, 0))


def test_lapsed_leases_are_woken_and_taken_in_their_turn(queue_url: str) -> None:
    with twin_queues(queue_url) as (many, one):
        for t in (many, one):
            t.publish_many([(f"g{g}", Event(n=g), 0) for g in range(6)])
            assert len(t.claim_many("early", 0.2, 3)) == 3  # g0..g2, soon lapsed
        time.sleep(0.3)
        got = many.claim_many("w", 60, 10)
        assert _shape(got) == _shape(_singles(one, "w", 60, 10, 0))
        # Never claimed first, then the lapsed ones, in the order they were claimed.
        order = [(x.group_id, x.attempt) for x in got]
        assert order == [("g3", 1), ("g4", 1), ("g5", 1), ("g0", 2), ("g1", 2), ("g2", 2)]


def test_a_head_out_of_deliveries_is_buried_mid_batch_and_the_batch_goes_on(
    queue_url: str,
) -> None:
    with twin_queues(queue_url, max_attempts=1) as (many, one):
        for t in (many, one):
            t.publish_many([(f"g{g}", Event(n=n), 0) for n in (1, 2) for g in range(2)])
            t.publish_many([(f"g{g}", Event(n=1), 0) for g in range(2, 6)])
            g0, g1 = t.claim_many("w", 60, 2)
            t.nack(g0)  # out of deliveries: buried by the claim that would deliver it again
            t.ack(g1)
        got = many.claim_many("w", 60, 10)
        assert _shape(got) == _shape(_singles(one, "w", 60, 10, 0))
        # The never claimed, then g0 buried (its next head free at once, at the back),
        # then g1's next, then g0's.
        order = [(x.group_id, x.event.n) for x in got]
        assert order == [("g2", 1), ("g3", 1), ("g4", 1), ("g5", 1), ("g1", 2), ("g0", 2)]
        assert isinstance(many, TransportAdmin)
        assert [(x.group_id, x.attempts) for x in many.dead_letters()] == [("g0", 1)]


def test_the_async_twin_takes_the_same_path(queue_url: str) -> None:
    async def batches() -> tuple[list[Shape], list[LeaseLost]]:
        async with open_async_transport(queue_url) as t:
            await t.publish_many([(f"g{g}", Event(n=g), g % 2) for g in range(10)])
            leases = await t.claim_many("w", 60, 8, min_priority=1)
            await t.nack(leases[0])
            lost = await t.ack_many(leases)
            return _shape(leases), lost

    shape, lost = asyncio.run(batches())
    assert [group for group, *_ in shape] == ["g1", "g3", "g5", "g7", "g9"]
    assert [x.lease.group_id for x in lost] == ["g1"]


# --- processes ----------------------------------------------------------------------------

PROCESSES = 4
PER_GROUP = 30


@pytest.mark.slow
def test_processes_claiming_in_batches_never_share_a_group_and_lose_nothing(
    queue: Transport[Event], queue_url: str, tmp_path: Path
) -> None:
    published: dict[int, tuple[str, int]] = {}
    items = [(f"g{g}", Event(n=n), g % 3) for n in range(PER_GROUP) for g in range(GROUPS)]
    for (group, event, _), seq in zip(items, queue.publish_many(items), strict=True):
        published[seq] = (group, event.n)
    spawn = multiprocessing.get_context("spawn")
    # Each child starts claiming once all have their transport open: none drains it alone.
    ready = spawn.Barrier(PROCESSES)
    journals = [tmp_path / f"w{i}.journal" for i in range(PROCESSES)]
    children = [
        spawn.Process(
            target=_workers.drain_many, args=(queue_url, f"w{i}", str(journal), 7, 2.0, ready)
        )
        for i, journal in enumerate(journals)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(180)
        assert child.exitcode == 0
    rows = [line.split() for journal in journals for line in journal.read_text().splitlines()]
    assert sorted(int(row[0]) for row in rows) == sorted(published), "lost or doubled"
    workers = {row[6] for row in rows}
    assert len(workers) > 1, f"one process took everything: {workers}"
    by_group: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for seq_text, group, n, attempt, got_at, acking_at, _ in rows:
        assert published[int(seq_text)] == (group, int(n))
        assert attempt == "1"  # never leased twice: no lease lapsed, every ack held
        by_group[group].append((float(got_at), float(acking_at), int(n)))
    for group, spans in by_group.items():
        spans.sort()
        assert [n for *_, n in spans] == list(range(PER_GROUP)), f"{group} out of order"
        # A lease was granted before it came back, and ended after its ack was sent: the
        # next one of the group came back after the last one's ack was sent, or two
        # leases were live at once.
        for (_, acking, _), (got, _, _) in itertools.pairwise(spans):
            assert acking <= got, f"{group}: two live leases at once ({acking} > {got})"


def test_a_mixed_settle_many_locks_its_groups_in_group_order(
    queue_url: str, schema_url: tuple[str, str]
) -> None:
    """A batch of nacks given as (b, a) must take a's lock before b's, as publish_many and
    ack_many do: while another transaction holds a, the batch waits on a holding nothing,
    so b stays free. (In the caller's order it would hold b while it waits: two batches in
    opposite orders deadlock.)"""
    url, schema = schema_url
    with open_transport(queue_url) as t:
        t.publish("a", Event(n=1))
        t.publish("b", Event(n=2))
        leases = {x.group_id: x for x in t.claim_many("w", 60, 2)}
        with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as probe:
            holder.execute(f"SELECT 1 FROM {schema}.groups WHERE group_id = 'a' FOR UPDATE")
            settled: list[object] = []
            batch = [Settlement(leases["b"], "nack"), Settlement(leases["a"], "nack")]
            waiter = threading.Thread(target=lambda: settled.append(t.settle_many(batch)))
            waiter.start()
            try:
                deadline = time.monotonic() + 10
                while not _waits_on_a_lock(probe, schema):
                    assert time.monotonic() < deadline, "settle_many never waited on a"
                    time.sleep(0.01)
                row = probe.execute(
                    f"SELECT 1 FROM {schema}.groups WHERE group_id = 'b' FOR UPDATE SKIP LOCKED"
                ).fetchall()
                assert row == [(1,)], "settle_many held b while it waited for a"
            finally:
                holder.rollback()
                waiter.join(10)
        assert settled == [[]]
        assert sorted(x.group_id for x in t.claim_many("w", 60, 2)) == ["a", "b"]


def _waits_on_a_lock(probe: psycopg.Connection[tuple[object, ...]], schema: str) -> bool:
    """Whether a statement naming ``schema`` waits for a lock."""
    waiting = probe.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND position(%s in query) > 0",
        (schema,),
    ).fetchone()
    return bool(waiting and waiting[0])
