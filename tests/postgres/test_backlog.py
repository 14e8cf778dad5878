"""The backlog in PostgreSQL's stats: the age of the oldest ready message and the ready
and busy groups, per priority and in total, on a real store. Time is a manual clock
(each reading moves it a microsecond, hence the margins), but for one test on the
server's clock, which measures real elapsed time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests._handles import handles
from transports_core import Event, Message, QueueStats
from transports_core.conformance import ManualClock
from transports_postgres import PostgresTransport

Opener = Callable[..., PostgresTransport[Event]]
# Readings of a manual clock between two instants of a test: a few microseconds.
MARGIN = 1e-3


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


@pytest.fixture
def opener(queue_url: str, clock: ManualClock) -> Iterator[Opener]:
    with handles(queue_url, PostgresTransport, clock=clock) as open_:
        yield open_


def _age(stats: QueueStats, priority: int | None = None) -> float | None:
    if priority is None:
        return stats.oldest_ready_age
    (row,) = [p for p in stats.by_priority if p.priority == priority]
    return row.oldest_ready_age


def _groups(stats: QueueStats) -> tuple[int, int]:
    return stats.ready_groups, stats.busy_groups


def _agrees_with_groups(queue: PostgresTransport[Event], stats: QueueStats) -> None:
    """ready + busy groups are the groups listed with a message; ready ones are those
    listed ready and not paused."""
    listed = [g for g in queue.groups(limit=10_000) if g.depth >= 1]
    assert stats.ready_groups + stats.busy_groups == len(listed)
    assert stats.ready_groups == sum(g.state == "ready" and not g.paused for g in listed)


def test_an_empty_queue_has_no_age_and_no_groups(opener: Opener) -> None:
    stats = opener().stats()
    assert (stats.oldest_ready_age, stats.ready_groups, stats.busy_groups) == (None, 0, 0)


def test_the_age_runs_from_the_publish_and_skips_the_head_in_flight(
    opener: Opener, clock: ManualClock
) -> None:
    queue = opener()
    queue.publish("g", Event(n=1))
    clock.advance(10)
    queue.publish("g", Event(n=2))
    clock.advance(5)
    queue.publish("h", Event(n=3))
    clock.advance(1)
    stats = queue.stats()
    assert stats.oldest_ready_age == pytest.approx(16, abs=MARGIN)
    assert _groups(stats) == (2, 0)
    # The head of g leased: the message behind it (published 6 s ago) is the oldest ready.
    lease = queue.claim("w", 60)
    assert lease is not None
    assert lease.event.n == 1
    stats = queue.stats()
    assert stats.ready == 2
    assert stats.oldest_ready_age == pytest.approx(6, abs=MARGIN)
    assert _groups(stats) == (1, 1)
    _agrees_with_groups(queue, stats)
    # Its lease lapsed: the head counts again, from its publish (a lapse restarts nothing).
    clock.advance(100)
    stats = queue.stats()
    assert stats.oldest_ready_age == pytest.approx(116, abs=MARGIN)
    assert _groups(stats) == (2, 0)
    # h's message acked; g's head nacked with a delay: parked, busy; the park ended,
    # ready again with its first age.
    lease = queue.claim("w", 60)
    assert lease is not None
    assert lease.event.n == 3
    queue.ack(lease)
    lease = queue.claim("w", 60)
    assert lease is not None
    assert lease.event.n == 1
    queue.nack(lease, delay=30)
    stats = queue.stats()
    assert (stats.ready, stats.parked) == (1, 1)
    assert stats.oldest_ready_age == pytest.approx(106, abs=MARGIN)
    assert _groups(stats) == (0, 1)
    clock.advance(31)
    stats = queue.stats()
    assert stats.oldest_ready_age == pytest.approx(147, abs=MARGIN)
    assert _groups(stats) == (1, 0)
    _agrees_with_groups(queue, stats)


def test_a_lone_message_in_flight_leaves_nothing_ready(opener: Opener) -> None:
    queue = opener()
    queue.publish("g", Event(n=1))
    assert queue.claim("w", 60) is not None
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (0, 1)
    assert stats.oldest_ready_age is None
    assert _groups(stats) == (0, 1)


def test_delayed_messages_age_from_their_due_time(opener: Opener, clock: ManualClock) -> None:
    queue = opener()
    queue.publish("d", Event(n=1), delay=10)
    queue.publish("h", Event(n=2), delay=20, hold=True)
    stats = queue.stats()
    assert (stats.ready, stats.delayed) == (0, 2)
    assert stats.oldest_ready_age is None
    # The held one, not due, holds its group: busy. The other has no group yet.
    assert _groups(stats) == (0, 1)
    clock.advance(15)
    stats = queue.stats()  # d came due 5 s ago (and joins its group now)
    assert (stats.ready, stats.delayed) == (1, 1)
    assert stats.oldest_ready_age == pytest.approx(5, abs=MARGIN)
    assert _groups(stats) == (1, 1)
    clock.advance(10)
    stats = queue.stats()  # h came due 5 s ago, d 15 s ago
    assert (stats.ready, stats.delayed) == (2, 0)
    assert stats.oldest_ready_age == pytest.approx(15, abs=MARGIN)
    assert _groups(stats) == (2, 0)
    _agrees_with_groups(queue, stats)


def test_a_delayed_message_joining_late_keeps_its_due_time(
    opener: Opener, clock: ManualClock
) -> None:
    # Due long before anything lets it join its group: its age still runs from due.
    queue = opener()
    queue.publish("g", Event(n=1), delay=5)
    clock.advance(60)
    queue.publish("g", Event(n=2))  # it joins now, before this one
    clock.advance(1)
    stats = queue.stats()
    assert stats.ready == 2
    assert stats.oldest_ready_age == pytest.approx(56, abs=MARGIN)


def test_a_paused_group_is_busy_and_its_messages_still_age(
    opener: Opener, clock: ManualClock
) -> None:
    queue = opener()
    queue.publish("p", Event(n=1))
    queue.publish("q", Event(n=2))
    clock.advance(3)
    assert queue.pause_group("p") is True
    stats = queue.stats()
    assert stats.ready == 2
    assert stats.oldest_ready_age == pytest.approx(3, abs=MARGIN)
    assert _groups(stats) == (1, 1)
    _agrees_with_groups(queue, stats)
    queue.resume_group("p")
    assert _groups(queue.stats()) == (2, 0)


def test_a_held_dead_letter_blocks_its_group_and_its_requeue_ages_from_then(
    opener: Opener, clock: ManualClock
) -> None:
    queue = opener(on_dead="hold")
    queue.publish("held", Event(n=1))
    queue.publish("alone", Event(n=2))
    clock.advance(50)
    queue.publish("held", Event(n=3))
    for _ in range(2):
        lease = queue.claim("w", 60)
        assert lease is not None
        queue.bury(lease, "bad")
    clock.advance(7)
    # "held": its dead letter (counted dead) with a message behind: busy. "alone": its
    # dead letter and nothing behind it: in neither count.
    stats = queue.stats()
    assert (stats.ready, stats.dead) == (1, 2)
    assert stats.oldest_ready_age == pytest.approx(7, abs=MARGIN)
    assert _groups(stats) == (0, 1)
    _agrees_with_groups(queue, stats)
    # Requeued, the dead letter is ready again, its age from the requeue.
    held = {d.group_id: d.seq for d in queue.dead_letters()}
    clock.advance(20)
    assert queue.requeue(held["held"]) is True
    assert queue.requeue(held["alone"]) is True
    clock.advance(2)
    stats = queue.stats()
    assert (stats.ready, stats.dead) == (3, 0)
    assert stats.oldest_ready_age == pytest.approx(29, abs=MARGIN)  # the one behind
    assert _groups(stats) == (2, 0)
    _agrees_with_groups(queue, stats)
    # The requeued head of "held" taken: left are the one behind it and "alone"'s.
    for _ in range(2):
        lease = queue.claim("w", 60)
        assert lease is not None
        queue.ack(lease)
    stats = queue.stats()
    assert stats.ready == 1
    assert stats.oldest_ready_age == pytest.approx(29, abs=MARGIN)


def test_a_released_dead_letters_requeue_ages_from_then(opener: Opener, clock: ManualClock) -> None:
    queue = opener()
    queue.publish("g", Event(n=1))
    clock.advance(40)
    lease = queue.claim("w", 60)
    assert lease is not None
    queue.bury(lease, "bad")
    assert queue.stats().oldest_ready_age is None
    clock.advance(4)
    (dead,) = queue.dead_letters()
    assert queue.requeue(dead.seq) is True
    clock.advance(1)
    stats = queue.stats()
    assert stats.ready == 1
    assert stats.oldest_ready_age == pytest.approx(1, abs=MARGIN)


def test_ages_and_groups_split_by_the_groups_priority(opener: Opener, clock: ManualClock) -> None:
    queue = opener()
    queue.publish("low", Event(n=1), priority=0)
    clock.advance(100)
    queue.publish("high", Event(n=2), priority=3)
    queue.publish("high2", Event(n=3), priority=3)
    # A message published at another priority into an existing group counts under the
    # group's priority, as the message counts do.
    queue.publish("low", Event(n=4), priority=3)
    clock.advance(2)
    assert queue.claim("w", 60, min_priority=3) is not None  # one of the high groups
    stats = queue.stats()
    low, high = stats.by_priority
    assert (low.priority, low.ready, low.ready_groups, low.busy_groups) == (0, 2, 1, 0)
    assert low.oldest_ready_age == pytest.approx(102, abs=MARGIN)
    assert (high.priority, high.ready, high.ready_groups, high.busy_groups) == (3, 1, 1, 1)
    assert high.oldest_ready_age == pytest.approx(2, abs=MARGIN)
    assert stats.oldest_ready_age == low.oldest_ready_age
    assert _groups(stats) == (2, 1)


def test_every_way_of_publishing_stamps_the_message(
    opener: Opener, clock: ManualClock, queue_url: str
) -> None:
    # publish_many plain, keyed (its first try, then one with a known key) and with a
    # tenant; publish keyed and with a tenant; and publishes in a caller's transaction.
    queue = opener()
    queue.publish_many([("a", Event(n=1), 0), ("b", Event(n=2), 1)])
    clock.advance(1)
    queue.publish("c", Event(n=3), priority=2, key="k")
    queue.publish_many([Message("c", Event(n=4), 2, key="k2")])
    queue.publish_many([Message("c", Event(n=5), 2, key="k"), Message("c", Event(n=6), key="k3")])
    queue.publish_many([Message("t", Event(n=7), 3, tenant="x")])
    clock.advance(1)
    queue.publish("t", Event(n=8), priority=3, tenant="x")
    server = queue_url.partition("?")[0]
    with psycopg.connect(server) as conn:
        within = queue.within(conn)
        within.publish("e", Event(n=9), priority=4)
        within.publish_many([("e", Event(n=10), 4)])
        within.publish("e", Event(n=11), priority=4, key="k4")
        conn.commit()
    clock.advance(1)
    stats = queue.stats()
    assert stats.ready == 10
    ages = {p.priority: p.oldest_ready_age for p in stats.by_priority}
    assert ages == pytest.approx({0: 3, 1: 3, 2: 2, 3: 2, 4: 1}, abs=MARGIN)


def test_on_the_servers_clock_the_age_is_the_real_time_since_the_publish(
    queue_url: str,
) -> None:
    with handles(queue_url, PostgresTransport) as open_:
        queue = open_()
        before = time.time()
        queue.publish("g", Event(n=1))
        published = time.time()
        time.sleep(0.3)  # for time to pass, not to wait for anything
        stats = queue.stats()
        after = time.time()
    assert stats.oldest_ready_age is not None
    # At least the time from the publish's return to the read's start, at most the time
    # from before the publish to after the read (one host: the server's clock is ours).
    assert 0.3 - 0.01 <= stats.oldest_ready_age <= after - before + 0.01
    assert after - published >= 0.3
