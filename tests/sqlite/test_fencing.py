"""Fencing: ack, nack and extend act only on the current lease (same seq, worker and
attempt), and otherwise raise LeaseLost and change nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, LeaseLost
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteTransport

from ._support import message_count, snapshot

Settle = Callable[[SqliteTransport[Any], Lease[Any]], object]
SETTLE: dict[str, Settle] = {
    "ack": lambda t, lease: t.ack(lease),
    "nack": lambda t, lease: t.nack(lease),
    "park": lambda t, lease: t.nack(lease, delay=30),
    "extend": lambda t, lease: t.extend(lease, 30),
}


def _claim(t: SqliteTransport[Any], worker: str, visibility: float = 10) -> Lease[Any]:
    lease = t.claim(worker, visibility)
    assert lease is not None
    return lease


@pytest.mark.parametrize("settle", SETTLE.values(), ids=SETTLE.keys())
def test_stale_lease_after_another_worker_reclaimed_raises_lease_lost(
    transport: SqliteTransport[Any], clock: ManualClock, db_path: Path, settle: Settle
) -> None:
    transport.publish("g", Event(i=1))
    stale = _claim(transport, "w1")
    clock.advance(11)
    current = _claim(transport, "w2")
    before = snapshot(db_path)
    with pytest.raises(LeaseLost) as info:
        settle(transport, stale)
    assert info.value.lease == stale
    assert "'w1', attempt 1" in str(info.value)
    assert snapshot(db_path) == before
    # w2 still holds the group: nobody else gets the message, and w2's lease works.
    assert transport.claim("w3", 10) is None
    renewed = transport.extend(current, 10)
    transport.ack(renewed)
    assert message_count(db_path) == 0


def test_stale_lease_of_the_same_worker_after_its_own_reclaim_raises_lease_lost(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("g", Event(i=1))
    stale = _claim(transport, "w1")
    clock.advance(11)
    current = _claim(transport, "w1")
    assert current.attempt == 2
    with pytest.raises(LeaseLost):
        transport.ack(stale)
    transport.ack(current)


@pytest.mark.parametrize("settle", SETTLE.values(), ids=SETTLE.keys())
def test_settling_after_ack_raises_lease_lost(
    transport: SqliteTransport[Any], settle: Settle
) -> None:
    transport.publish("g", Event(i=1))
    transport.publish("g", Event(i=2))
    lease = _claim(transport, "w1")
    transport.ack(lease)
    with pytest.raises(LeaseLost):
        settle(transport, lease)
    follower = _claim(transport, "w1")
    assert follower.event.i == 2


@pytest.mark.parametrize("settle", SETTLE.values(), ids=SETTLE.keys())
def test_settling_after_nack_raises_lease_lost(
    transport: SqliteTransport[Any], db_path: Path, settle: Settle
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1")
    transport.nack(lease)
    before = snapshot(db_path)
    with pytest.raises(LeaseLost):
        settle(transport, lease)
    assert snapshot(db_path) == before


@pytest.mark.parametrize("settle", SETTLE.values(), ids=SETTLE.keys())
def test_settling_a_parked_message_with_its_old_lease_raises_lease_lost(
    transport: SqliteTransport[Any], clock: ManualClock, settle: Settle
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1")
    transport.nack(lease, delay=60)
    with pytest.raises(LeaseLost):
        settle(transport, lease)
    clock.advance(30)
    assert transport.claim("w2", 10) is None, "the park was cut short"
    clock.advance(31)
    assert _claim(transport, "w2").attempt == 2


def test_lease_with_another_worker_id_raises_lease_lost(
    transport: SqliteTransport[Any],
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1")
    forged = Lease(lease.seq, lease.group_id, lease.event, "w2", lease.attempt, lease.expires_at)
    with pytest.raises(LeaseLost):
        transport.ack(forged)
    transport.ack(lease)


@pytest.mark.parametrize("settle", SETTLE.values(), ids=SETTLE.keys())
def test_lapsed_lease_nobody_reclaimed_still_settles(
    transport: SqliteTransport[Any], clock: ManualClock, settle: Settle
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1", visibility=10)
    clock.advance(100)
    settle(transport, lease)


def test_lapsed_lease_nobody_reclaimed_can_be_acked(
    transport: SqliteTransport[Any], clock: ManualClock, db_path: Path
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1", visibility=10)
    clock.advance(100)
    transport.ack(lease)
    assert message_count(db_path) == 0
    assert transport.claim("w2", 10) is None


def test_extending_a_lapsed_lease_holds_the_group_again(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1", visibility=10)
    clock.advance(100)
    renewed = transport.extend(lease, 10)
    assert renewed.expires_at == clock.now() + 10
    assert transport.claim("w2", 10) is None
