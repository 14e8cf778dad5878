"""Timers, pauses and tenants on Redis, where the suite cannot look: a queue stored
before their keys existed works as it was (the keys are made on demand); a claim moves a
bounded number of due delayed messages into their groups; a claim blocked on the
server's own clock wakes when a delayed message comes due; a paused group leaves the
ready sets; and a queue that never saw a tenant keeps no tenant state at all."""

from __future__ import annotations

import time

import redis

from transports_core import Event, open_transport
from transports_core.conformance import ManualClock
from transports_redis import RedisTransport
from transports_redis._scripts import PROMOTE, QUEUE_KEYS

# A queue as it was stored before timers, pauses and tenants: group records of ten
# fields (the rest dropped), and messages stored as their event's JSON alone (without
# their group and priority ahead of it).
_OLD_RECORDS = """
for _, group in ipairs(redis.call('HKEYS', KEYS[1])) do
  local f = {cmsgpack.unpack(redis.call('HGET', KEYS[1], group))}
  redis.call('HSET', KEYS[1], group, cmsgpack.pack(f[1], f[2], f[3], f[4], f[5], f[6], f[7],
    f[8], f[9], f[10]))
end
for _, seq in ipairs(redis.call('HKEYS', KEYS[2])) do
  local v = redis.call('HGET', KEYS[2], seq)
  redis.call('HSET', KEYS[2], seq, string.sub(v, 11 + tonumber(string.sub(v, 3, 10), 16)))
end
return 1
"""

_NEW_KEYS = ("tm", "tg", "td", "hz", "pz", "tq", "tc", "tp", "tw")


def _open(url: str, clock: ManualClock | None = None) -> RedisTransport[Event]:
    transport = open_transport(url, clock=clock) if clock else open_transport(url)
    assert isinstance(transport, RedisTransport)
    return transport


def _key(queue: str, suffix: str) -> str:
    return f"dt:{{{queue}}}:{suffix}"


def test_a_queue_stored_before_timers_works_as_it_was(
    queue_url: str, server_queue: tuple[str, str], raw: redis.Redis
) -> None:
    queue = server_queue[1]
    assert set(_NEW_KEYS) <= set(QUEUE_KEYS)
    with _open(queue_url) as q:
        seqs = [q.publish(f"g{i % 3}", Event(n=i)) for i in range(9)]
        lease = q.claim("w", 30)
        assert lease is not None
    raw.eval(_OLD_RECORDS, 2, _key(queue, "g"), _key(queue, "ev"))
    assert raw.hget(_key(queue, "ev"), str(seqs[2])) == '{"n":2}'  # as stored before
    assert not any(raw.exists(_key(queue, k)) for k in _NEW_KEYS)
    with _open(queue_url) as q:
        assert q.check() == []
        q.ack(lease)
        # The old records read as "no tenant, not paused, no hold"; new keys appear only
        # once something needs them.
        infos = {g.group_id: g for g in q.groups(10)}
        assert {g.tenant for g in infos.values()} == {None}
        assert not any(g.paused for g in infos.values())
        assert [m.seq for m in q.peek("g1", 10)] == seqs[1::3]
        assert q.pause_group("g2")
        assert q.stats().paused == 1
        later = q.publish("g0", Event(n=100), delay=60)
        got = []
        while (lease := q.claim("w", 30)) is not None:
            got.append(lease.seq)
            q.ack(lease)
        assert got == [s for s in seqs[1:] if s % 3 != seqs[2] % 3]
        # A message stored before does not name its group: cancel cannot find it, and
        # says so.
        assert q.cancel(seqs[2]) is False
        assert q.cancel(later) is True
        assert q.resume_group("g2")
        assert q.check() == []


def test_a_claim_moves_a_bounded_number_of_due_messages(
    queue_url: str, server_queue: tuple[str, str], raw: redis.Redis
) -> None:
    queue = server_queue[1]
    clock = ManualClock(1000.0)
    with _open(queue_url, clock) as q:
        n = PROMOTE * 2 + 7
        for i in range(n):
            q.publish(f"g{i}", Event(n=i), delay=5 + i * 0.001)
        clock.advance(10)
        lease = q.claim("w", 30)
        assert lease is not None
        assert lease.event.n == 0
        assert raw.zcard(_key(queue, "tm")) == n - PROMOTE
        assert q.claim("w", 30) is not None
        assert raw.zcard(_key(queue, "tm")) == n - 2 * PROMOTE
        # An admin read sees what a claim would: every due one is in its group.
        assert q.stats().delayed == 0
        assert raw.zcard(_key(queue, "tm")) == 0
        assert q.check() == []


def test_a_claim_blocked_on_the_server_clock_wakes_when_a_message_comes_due(
    queue_url: str,
) -> None:
    with _open(queue_url) as q:
        q.publish("g", Event(n=1), delay=0.4)
        started = time.monotonic()
        lease = q.claim("w", 30, wait=10)
        took = time.monotonic() - started
        assert lease is not None
        assert lease.event.n == 1
        # Not before it is due; and well within the wait (the bound of a park's end).
        assert 0.35 <= took < 2.0
        q.ack(lease)


def test_a_paused_group_leaves_the_ready_sets(
    queue_url: str, server_queue: tuple[str, str], raw: redis.Redis
) -> None:
    queue = server_queue[1]
    with _open(queue_url) as q:
        q.publish("a", Event(n=1))
        q.publish("b", Event(n=2), tenant="t1")
        assert q.pause_group("a")
        assert q.pause_group("b")
        assert not q.pause_group("a")
        assert raw.zcard(_key(queue, "r0")) == 0
        assert raw.zcard(_key(queue, "tq")) == 0
        assert q.claim("w", 30) is None
        assert q.check() == []
        # Created while paused: a group drained and published again stays paused.
        assert q.resume_group("a")
        lease = q.claim("w", 30)
        assert lease is not None
        assert lease.group_id == "a"
        assert q.pause_group("a")
        q.ack(lease)
        q.publish("a", Event(n=3))
        assert q.claim("w", 30) is None
        assert q.paused_groups() == ["a", "b"]
        assert q.resume_group("b")
        lease = q.claim("w", 30)
        assert lease is not None
        assert lease.group_id == "b"
        q.ack(lease)
        assert q.check() == []


def test_a_queue_without_tenants_keeps_no_turns(
    queue_url: str, server_queue: tuple[str, str], raw: redis.Redis
) -> None:
    queue = server_queue[1]
    with _open(queue_url) as q:
        for i in range(20):
            q.publish(f"g{i % 4}", Event(n=i))
        while (lease := q.claim("w", 30)) is not None:
            q.ack(lease)
        assert not any(raw.exists(_key(queue, k)) for k in ("tp", "tc", "tw"))
        # Once every tenant's group is served and the groups without one are served
        # again, the turns are dropped: claims write nothing about them any more.
        q.publish("t", Event(n=1), tenant="x")
        q.publish("n", Event(n=2))
        q.publish("n", Event(n=3))
        got = []
        while (lease := q.claim("w", 30)) is not None:
            got.append(lease.group_id)
            q.ack(lease)
        # The groups without a tenant were served last (their pass is ahead of V), so
        # the tenant goes first.
        assert got == ["t", "n", "n"]
        assert not any(raw.exists(_key(queue, k)) for k in ("tp", "tc", "tw"))
        assert q.check() == []


def test_cancel_and_peek_find_a_message_of_any_group_name(queue_url: str) -> None:
    # A message's stored value names its group by length in bytes, as Lua counts them.
    group = "grüße-😀"
    with _open(queue_url) as q:
        first = q.publish(group, Event(n=1), 2)
        second = q.publish(group, Event(n=2), 4)
        third = q.publish(group, Event(n=3), 1)
        shown = q.peek(group, 10)
        assert [(m.seq, m.priority, m.event) for m in shown] == [
            (first, 2, '{"n":1}'),
            (second, 4, '{"n":2}'),
            (third, 1, '{"n":3}'),
        ]
        assert q.cancel(second)
        assert not q.cancel(second)
        lease = q.claim("w", 30)
        assert lease is not None
        assert (lease.group_id, lease.event.n) == (group, 1)
        assert not q.cancel(first)  # in flight
        q.ack(lease)
        assert [m.seq for m in q.peek(group, 10)] == [third]
        assert q.check() == []
