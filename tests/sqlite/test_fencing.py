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


def _reclaimed(t: SqliteTransport[Any], clock: ManualClock) -> Lease[Any]:
    stale = _claim(t, "w1")
    clock.advance(11)
    _claim(t, "w2")
    return stale


def _acked(t: SqliteTransport[Any], clock: ManualClock) -> Lease[Any]:
    lease = _claim(t, "w1")
    t.ack(lease)
    return lease


def _nacked(t: SqliteTransport[Any], clock: ManualClock) -> Lease[Any]:
    lease = _claim(t, "w1")
    t.nack(lease)
    return lease


def _parked(t: SqliteTransport[Any], clock: ManualClock) -> Lease[Any]:
    lease = _claim(t, "w1")
    t.nack(lease, delay=60)
    return lease


STALE = {"reclaimed": _reclaimed, "acked": _acked, "nacked": _nacked, "parked": _parked}


@pytest.mark.parametrize("stale", STALE.values(), ids=STALE.keys())
@pytest.mark.parametrize("settle", SETTLE.values(), ids=SETTLE.keys())
def test_settling_a_stale_lease_raises_lease_lost_and_changes_nothing(
    transport: SqliteTransport[Any],
    clock: ManualClock,
    db_path: Path,
    settle: Settle,
    stale: Callable[[SqliteTransport[Any], ManualClock], Lease[Any]],
) -> None:
    # Not a byte of the file changes: the new holder keeps its lease, a park is not cut.
    transport.publish("g", Event(i=1))
    transport.publish("g", Event(i=2))
    lease = stale(transport, clock)
    before = snapshot(db_path)
    with pytest.raises(LeaseLost) as info:
        settle(transport, lease)
    assert info.value.lease == lease
    assert "'w1', attempt 1" in str(info.value)
    assert snapshot(db_path) == before


def test_lease_with_another_worker_id_raises_lease_lost(
    transport: SqliteTransport[Any],
) -> None:
    transport.publish("g", Event(i=1))
    lease = _claim(transport, "w1")
    forged = Lease(lease.seq, lease.group_id, lease.event, "w2", lease.attempt, lease.expires_at)
    with pytest.raises(LeaseLost):
        transport.ack(forged)
    transport.ack(lease)


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
