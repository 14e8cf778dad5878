"""claim(wait=) on the server: a waiting claim passes over what is below its floor, and
close() at any moment ends it; and leases keep their times to the last digit. (Woken by a
publish, a lapse or close() from another thread: the conformance suite's wait scenarios.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from transports_core import Event, Lease, Transport, open_transport
from transports_redis import _ops as ops

WAIT = 20.0  # far longer than any wake-up should take: a claim that times out fails


def _claim_in_thread(
    transport: Transport[Event], **kwargs: object
) -> tuple[threading.Thread, list[Lease[Event] | None]]:
    got: list[Lease[Event] | None] = []

    def run() -> None:
        got.append(transport.claim("waiter", 30, wait=WAIT, **kwargs))  # type: ignore[arg-type]

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


@pytest.fixture
def other(queue_url: str) -> Iterator[Transport[Event]]:
    with open_transport(queue_url) as transport:
        yield transport


def test_a_waiting_claim_ignores_what_is_below_its_floor(
    queue: Transport[Event], other: Transport[Event]
) -> None:
    thread, got = _claim_in_thread(queue, min_priority=3)
    time.sleep(0.2)
    other.publish("low", Event(n=1), 0)
    high = other.publish("high", Event(n=2), 3)
    thread.join(WAIT + 5)
    assert got
    assert got[0] is not None
    assert got[0].seq == high


def test_a_wake_up_that_finds_nothing_goes_on_waiting(
    queue: Transport[Event],
    other: Transport[Event],
    raw: redis.Redis,
    server_queue: tuple[str, str],
) -> None:
    wake = ops.wake_key(server_queue[1], 0)
    thread, got = _claim_in_thread(queue)
    deadline = time.monotonic() + WAIT
    while not queue._waiting:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the claim never waited"
        time.sleep(0.005)
    raw.rpush(wake, "1")  # a wake-up with nothing behind it
    while raw.llen(wake):
        assert time.monotonic() < deadline, "the claim never took the wake-up"
        time.sleep(0.005)
    seq = other.publish("g", Event(n=1))
    thread.join(WAIT + 5)
    assert got
    assert got[0] is not None, "the claim ended at a wake-up that found nothing"
    assert got[0].seq == seq


def test_lease_times_keep_seventeen_digits(queue_url: str) -> None:
    now = 1796317695.1234567

    with open_transport(queue_url, clock=lambda: now) as transport:
        transport.publish("g", Event(n=1))
        lease = transport.claim("w", 0.3333333333333333)
        assert lease is not None
        assert lease.expires_at == now + 0.3333333333333333
        longer = transport.extend(lease, 7.000000000000001)
        assert longer.expires_at == now + 7.000000000000001
        transport.ack(longer)


def test_close_at_any_moment_of_a_waiting_claim_returns_none(queue_url: str) -> None:
    # Before its first look, during it, or while it blocks: close() never surfaces as an
    # error of the claim (redis-py fails in several ways on a socket shut under a read).
    for step in range(20):
        transport = open_transport(queue_url)
        thread, got = _claim_in_thread(transport)
        time.sleep(0.002 * step)
        transport.close()
        thread.join(WAIT + 5)
        assert got == [None], step


def test_one_publish_wakes_a_waiter_for_each_group_it_readies(queue_url: str) -> None:
    # A wake-up list holds one token: the waiter that takes it must pass it on while more
    # is ready. The socket timeout puts the waiters' own re-look (half of it) past WAIT,
    # so a waiter left asleep looks again only when its wait ends.
    url = f"{queue_url}&socket_timeout=60"
    waiters = [open_transport(url) for _ in range(3)]
    try:
        claims = [_claim_in_thread(waiter) for waiter in waiters]
        deadline = time.monotonic() + WAIT
        while sum(w._waiting for w in waiters) < 3:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the claims never blocked"
            time.sleep(0.01)
        with open_transport(queue_url) as publisher:
            publisher.publish_many([(f"g{n}", Event(n=n), 0) for n in range(3)])
        # Woken, each returns at once; asleep, one returns only when its wait ends.
        woken_by = time.monotonic() + WAIT / 2
        for thread, _ in claims:
            thread.join(max(woken_by - time.monotonic(), 0))
        assert not any(thread.is_alive() for thread, _ in claims), "a waiter slept on"
        for thread, _ in claims:
            thread.join(WAIT + 5)
        leases = [got[0] for _, got in claims]
        assert all(lease is not None for lease in leases), leases
        assert sorted(lease.group_id for lease in leases if lease is not None) == ["g0", "g1", "g2"]
    finally:
        for waiter in waiters:
            waiter.close()
