"""Opt-in dead letters (``max_attempts``, ``on_dead``) and the admin calls that repair them,
on a real file with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from transports_core import (
    AsyncTransportAdmin,
    DeadLetter,
    Event,
    LeaseLost,
    RequeueRefused,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_core.backend import exhausted_reason
from transports_core.conformance import ManualClock


class Queue(TransportAdmin, Transport[Event]):  # what open_transport gives, for mypy
    pass


Opener = Callable[..., Queue]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def open_queue(tmp_path: Path, clock: ManualClock) -> Opener:
    def opener(**options: Any) -> Queue:
        transport = open_transport(f"sqlite:///{tmp_path / 'q.db'}", clock=clock, **options)
        assert isinstance(transport, TransportAdmin)
        return transport  # type: ignore[return-value]

    return opener


def _fail(queue: Queue, times: int, group: str = "g") -> None:
    """Deliver the head of ``group`` ``times`` times, nacking it each time."""
    for _ in range(times):
        lease = queue.claim("w", 10)
        assert lease is not None
        assert lease.group_id == group
        queue.nack(lease)


def test_without_max_attempts_nothing_is_ever_dead_lettered(open_queue: Opener) -> None:
    with open_queue() as queue:
        queue.publish("g", Event(n=1))
        _fail(queue, 20)
        lease = queue.claim("w", 10)
        assert lease is not None
        assert lease.attempt == 21
        assert queue.dead_letters() == []


def test_release_moves_the_message_aside_and_the_group_goes_on(
    open_queue: Opener, clock: ManualClock
) -> None:
    with open_queue(max_attempts=2) as queue:
        first = queue.publish("g", Event(n=1))
        queue.publish("g", Event(n=2))
        _fail(queue, 2)
        clock.advance(1)
        # The third delivery of n=1 would be one too many: the same claim buries it and
        # hands out the group's next message.
        before = clock.now()
        lease = queue.claim("w", 10)
        after = clock.now()
        assert lease is not None
        assert (lease.event.n, lease.attempt) == (2, 1)
        (dead,) = queue.dead_letters()
        assert before < dead.dead_at <= after
        assert dead == DeadLetter(
            seq=first,
            group_id="g",
            priority=0,
            event='{"n":1}',
            attempts=2,
            reason=exhausted_reason(2, 2, "nacked"),
            dead_at=dead.dead_at,
            held=False,
        )
        stats = queue.stats()
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 1, 1)
        assert queue.held_groups() == []


def test_hold_blocks_the_group_until_the_dead_letter_is_requeued(
    open_queue: Opener, clock: ManualClock
) -> None:
    with open_queue(max_attempts=2, on_dead="hold") as queue:
        poison = queue.publish("g", Event(n=1))
        queue.publish("g", Event(n=2))
        _fail(queue, 2)
        queue.publish("other", Event(n=9))
        # The next claim buries g's head, and serves `other` instead.
        before = clock.now()
        lease = queue.claim("w", 10)
        assert lease is not None
        assert lease.group_id == "other"
        queue.ack(lease)
        queue.publish("g", Event(n=3))  # queues behind the dead letter
        assert queue.claim("w", 10) is None
        (held,) = queue.held_groups()
        assert (held.group_id, held.seq, held.waiting) == ("g", poison, 2)
        assert before < held.since <= clock.now()
        assert held.since == queue.dead_letters()[0].dead_at
        assert [d.held for d in queue.dead_letters()] == [True]
        (group,) = queue.groups()
        assert (group.state, group.depth, group.head_seq) == ("held", 2, poison)
        stats = queue.stats()
        assert (stats.ready, stats.in_flight, stats.parked, stats.dead) == (2, 0, 0, 1)

        assert queue.requeue(poison) is True
        assert queue.held_groups() == []
        assert queue.dead_letters() == []
        # Back at the head, attempt still counting (a fencing token never repeats), with a
        # fresh allowance of two deliveries.
        lease = queue.claim("w", 10)
        assert lease is not None
        assert (lease.seq, lease.event.n, lease.attempt) == (poison, 1, 3)
        queue.nack(lease)
        lease = queue.claim("w", 10)
        assert lease is not None
        assert (lease.seq, lease.attempt) == (poison, 4)
        queue.ack(lease)
        assert [queue_item(queue) for _ in range(2)] == [2, 3]


def queue_item(queue: Queue) -> int:
    lease = queue.claim("w", 10)
    assert lease is not None
    queue.ack(lease)
    n: int = lease.event.n
    return n


def test_requeue_returns_a_released_dead_letter_to_its_place(open_queue: Opener) -> None:
    with open_queue(max_attempts=1) as queue:
        poison = queue.publish("g", Event(n=1))
        queue.publish("g", Event(n=2))
        queue.publish("g", Event(n=3))
        _fail(queue, 1)
        lease = queue.claim("w", 10)  # buries n=1, delivers n=2
        assert lease is not None
        assert lease.event.n == 2
        with pytest.raises(RequeueRefused, match=r"requeue.*worker 'w' holds a lease in .*'g'"):
            queue.requeue(poison)
        assert [d.seq for d in queue.dead_letters()] == [poison]  # nothing changed
        queue.ack(lease)
        assert queue.requeue(poison) is True
        assert queue.requeue(poison) is False
        assert [queue_item(queue) for _ in range(2)] == [1, 3]  # ahead of n=3 again


def test_a_head_displaced_by_a_requeue_keeps_its_deliveries(open_queue: Opener) -> None:
    with open_queue(max_attempts=1) as queue:
        poison = queue.publish("g", Event(n=1))
        later = queue.publish("g", Event(n=2))
        _fail(queue, 1)
        _fail(queue, 1)  # buries n=1, delivers n=2 once
        assert queue.requeue(poison) is True  # n=1 is the head again, in front of n=2
        lease = queue.claim("w", 10)
        assert lease is not None
        assert (lease.seq, lease.attempt) == (poison, 2)  # one more go after the requeue
        queue.ack(lease)
        # n=2 had its one delivery before it was displaced: it is due for burial, not for
        # a first delivery with its fencing token started over.
        assert queue.claim("w", 10) is None
        (dead,) = queue.dead_letters()
        assert (dead.seq, dead.attempts) == (later, 1)


@pytest.mark.parametrize("publish_first", [True, False], ids=["behind-n3", "then-n3"])
@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["oldest-first", "newest-first"])
def test_requeued_dead_letters_go_back_in_seq_order(
    open_queue: Opener, order: tuple[int, int], publish_first: bool
) -> None:
    # Each requeue lands in its place among what waits: as the head, between two messages,
    # or as the tail (which the next publish must then go behind).
    with open_queue(max_attempts=1) as queue:
        dead = [queue.publish("g", Event(n=n)) for n in (1, 2)]
        _fail(queue, 1)
        _fail(queue, 1)  # buries n=1, delivers n=2 once
        assert queue.claim("w", 10) is None  # buries n=2: the group is drained
        if publish_first:
            queue.publish("g", Event(n=3))
        for index in order:
            assert queue.requeue(dead[index]) is True
        if not publish_first:
            queue.publish("g", Event(n=3))
        assert [(g.group_id, g.depth, g.head_seq) for g in queue.groups()] == [("g", 3, dead[0])]
        assert queue.stats().ready == 3
        assert [queue_item(queue) for _ in range(3)] == [1, 2, 3]
        assert queue.claim("w", 10) is None
        assert queue.groups() == []


def test_requeue_behind_a_held_dead_letter_is_refused_until_that_one_is_settled(
    open_queue: Opener,
) -> None:
    with open_queue(max_attempts=1) as queue:  # on_dead=release
        released = queue.publish("g", Event(n=1))
        held = queue.publish("g", Event(n=2))
        _fail(queue, 1)
        _fail(queue, 1)  # buries n=1, delivers n=2 once
    with open_queue(max_attempts=1, on_dead="hold") as queue:
        assert queue.claim("w", 10) is None  # buries n=2, which holds the group
        with pytest.raises(RequeueRefused, match=rf"dead letter {held} is held .* 'g'"):
            queue.requeue(released)
        assert [d.seq for d in queue.dead_letters()] == [released, held]  # nothing changed
        assert queue.requeue(held) is True
        assert queue.requeue(released) is True
        assert [queue_item(queue) for _ in range(2)] == [1, 2]


def test_requeue_into_a_drained_group_recreates_it_with_its_priority(open_queue: Opener) -> None:
    with open_queue(max_attempts=1) as queue:
        poison = queue.publish("g", Event(n=1), priority=3)
        _fail(queue, 1)
        assert queue.claim("w", 10) is None
        assert queue.groups() == []
        assert queue.requeue(poison) is True
        (group,) = queue.groups()
        assert (group.group_id, group.priority, group.state) == ("g", 3, "ready")
        assert queue.claim("w", 10, min_priority=3) is not None


def test_a_stale_lease_from_before_the_dead_letter_stays_fenced(
    open_queue: Opener, clock: ManualClock
) -> None:
    with open_queue(max_attempts=1) as queue:
        poison = queue.publish("g", Event(n=1))
        stale = queue.claim("w", 5)
        assert stale is not None
        clock.advance(6)
        assert queue.claim("w", 5) is None  # buried
        queue.requeue(poison)
        fresh = queue.claim("w", 5)
        assert fresh is not None
        assert fresh.attempt == stale.attempt + 1
        with pytest.raises(LeaseLost):
            queue.ack(stale)
        queue.ack(fresh)


def test_purge_counts_a_holding_dead_letter_once(open_queue: Opener) -> None:
    with open_queue(max_attempts=1, on_dead="hold") as queue:
        queue.publish("g", Event(n=1))
        queue.publish("g", Event(n=2))
        _fail(queue, 1)
        assert queue.claim("w", 10) is None
        assert queue.purge_group("g") == 2
        assert queue.stats().dead == 0


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("max_attempts=0", "max_attempts must be a whole number >= 1, got 0"),
        ("max_attempts=two", "max_attempts must be a whole number >= 1, got 'two'"),
        ("on_dead=drop", "on_dead must be one of release, hold, got 'drop'"),
    ],
)
def test_bad_dead_letter_options_are_refused(tmp_path: Path, query: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_transport(f"sqlite:///{tmp_path / 'q.db'}?{query}")
    assert not (tmp_path / "q.db").exists()


@pytest.mark.parametrize("bad", [0, -1, True, "1", None])
def test_admin_calls_refuse_bad_seqs_before_writing(open_queue: Opener, bad: object) -> None:
    with open_queue() as queue, pytest.raises((TypeError, ValueError), match="seq"):
        queue.requeue(bad)  # type: ignore[arg-type]


def test_url_options_turn_dead_letters_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}?max_attempts=1&on_dead=HOLD"
    with open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        queue.publish("g", Event(n=1))
        lease = queue.claim("w", 10)
        assert lease is not None
        queue.nack(lease)
        assert queue.claim("w", 10) is None
        assert [h.group_id for h in queue.held_groups()] == ["g"]


def test_async_twin_dead_letters_and_requeues(tmp_path: Path) -> None:
    async def main() -> list[int]:
        url = f"sqlite:///{tmp_path / 'q.db'}"
        async with open_async_transport(url, max_attempts=1, on_dead="hold") as queue:
            assert isinstance(queue, AsyncTransportAdmin)
            poison = await queue.publish("g", Event(n=1))
            await queue.publish("g", Event(n=2))
            lease = await queue.claim("w", 10)
            assert lease is not None
            await queue.nack(lease)
            assert await queue.claim("w", 10) is None
            assert [h.seq for h in await queue.held_groups()] == [poison]
            assert (await queue.stats()).dead == 1
            assert (await queue.groups())[0].state == "held"
            assert await queue.requeue(poison)
            seen = []
            while (lease := await queue.claim("w", 10)) is not None:
                seen.append(lease.event.n)
                await queue.ack(lease)
            return seen

    assert asyncio.run(main()) == [1, 2]
