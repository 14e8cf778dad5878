"""Dead letters on PostgreSQL: max_attempts with both on_dead policies, bury, the shared
reason texts, discard and purge. Time is a manual clock, so lapses need no sleeping.
(Requeue and its refusal are the conformance suite's admin scenarios.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests._handles import handles
from transports_core import Event, LeaseLost, TransportAdmin
from transports_core.backend import buried_reason, exhausted_reason
from transports_core.conformance import ManualClock
from transports_postgres import PostgresTransport

Opener = Callable[..., PostgresTransport[Event]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def opener(queue_url: str, clock: ManualClock) -> Iterator[Opener]:
    with handles(queue_url, PostgresTransport, clock=clock) as open_:
        yield open_


def test_the_transport_offers_the_admin_interface(opener: Opener) -> None:
    assert isinstance(opener(), TransportAdmin)


def test_lapsed_deliveries_exhaust_and_release_the_group(
    opener: Opener, clock: ManualClock
) -> None:
    queue = opener(max_attempts=2)
    seq = queue.publish("g", Event(n=1))
    queue.publish("g", Event(n=2))
    for attempt in (1, 2):
        lease = queue.claim("w", 5)
        assert lease is not None
        assert (lease.seq, lease.attempt) == (seq, attempt)
        clock.advance(10)
    nxt = queue.claim("w", 5)  # the third delivery is a burial; the group goes on
    assert nxt is not None
    assert nxt.event.n == 2
    (dead,) = queue.dead_letters()
    assert (dead.seq, dead.attempts, dead.held) == (seq, 2, False)
    assert dead.reason == exhausted_reason(2, 2, "lapsed")
    assert dead.event == '{"n":1}'
    assert queue.stats().dead == 1


def test_nacked_deliveries_exhaust_and_hold_the_group(opener: Opener) -> None:
    queue = opener(max_attempts=1, on_dead="hold")
    seq = queue.publish("g", Event(n=1))
    queue.publish("g", Event(n=2))
    lease = queue.claim("w", 5)
    assert lease is not None
    queue.nack(lease)
    assert queue.claim("w", 5) is None  # buried, and the group is held behind it
    (dead,) = queue.dead_letters()
    assert (dead.seq, dead.held) == (seq, True)
    assert dead.reason == exhausted_reason(1, 1, "nacked")
    (held,) = queue.held_groups()
    assert (held.group_id, held.seq, held.waiting) == ("g", seq, 1)
    (group,) = queue.groups()
    assert (group.state, group.depth) == ("held", 1)
    # Requeued: back at the head with a fresh allowance; the attempt keeps counting.
    assert queue.requeue(seq)
    again = queue.claim("w", 5)
    assert again is not None
    assert (again.seq, again.attempt) == (seq, 2)
    queue.ack(again)
    last = queue.claim("w", 5)
    assert last is not None
    assert last.event.n == 2
    assert queue.dead_letters() == []


def test_bury_is_fenced_like_ack_and_follows_on_dead(opener: Opener, clock: ManualClock) -> None:
    queue = opener()
    seq = queue.publish("g", Event(n=1))
    queue.publish("g", Event(n=2))
    stale = queue.claim("w", 5)
    assert stale is not None
    clock.advance(10)
    lease = queue.claim("w2", 5)
    assert lease is not None
    with pytest.raises(LeaseLost):
        queue.bury(stale, "too late")
    with pytest.raises(ValueError, match="reason"):
        queue.bury(lease, "  ")
    queue.bury(lease, "bad payload")
    (dead,) = queue.dead_letters()
    assert (dead.seq, dead.reason, dead.attempts) == (seq, buried_reason("bad payload"), 2)
    with pytest.raises(LeaseLost):
        queue.ack(lease)
    nxt = queue.claim("w", 5)
    assert nxt is not None
    assert nxt.event.n == 2


def test_discard_frees_a_held_group_and_purge_removes_everything(opener: Opener) -> None:
    queue = opener(on_dead="hold")
    seq = queue.publish("g", Event(n=1))
    queue.publish("g", Event(n=2))
    queue.publish("h", Event(n=3))
    lease = queue.claim("w", 5)
    assert lease is not None
    queue.bury(lease, "hold it")
    assert [g.group_id for g in queue.held_groups()] == ["g"]
    assert queue.discard(seq)
    assert queue.held_groups() == []
    assert queue.dead_letters() == []
    nxt = queue.claim("w", 5)
    assert nxt is not None
    assert nxt.group_id == "h"
    assert queue.purge_group("g") == 1
    held = queue.claim("w", 5)
    assert held is None
    with pytest.raises(LeaseLost):
        queue.ack(lease)
    stats = queue.stats()
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 1, 0)
