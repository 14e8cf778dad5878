"""A stored event that no longer decodes does not wedge its group: claim raises
EventDecodeError carrying the lease, which the caller can ack or park."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from transports_core import Event, EventDecodeError, Lease, LeaseLost, TransportError
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteTransport

from ._support import query
from .conftest import OpenDb


class Order(BaseModel):
    """A stricter event type than the one the old messages were published with."""

    order_id: int


@pytest.fixture
def strict(open_db: OpenDb) -> SqliteTransport[Order]:
    """A queue holding, in group "g", a legacy event that `Order` refuses, then a good one;
    reopened with ``event_type=Order``."""
    with open_db() as loose:
        loose.publish("g", Event(legacy="yes"))
        loose.publish("g", Event(order_id=2))
        loose.publish("h", Event(order_id=3))
    return open_db(event_type=Order)


def _poison(t: SqliteTransport[Order], worker: str = "w1") -> EventDecodeError:
    with pytest.raises(EventDecodeError) as info:
        t.claim(worker, visibility=30)
    return info.value


def test_claim_of_an_undecodable_event_raises_carrying_the_lease(
    strict: SqliteTransport[Order], clock: ManualClock, db_path: Path
) -> None:
    err = _poison(strict)
    assert isinstance(err, TransportError)
    assert err.lease == Lease(1, "g", '{"legacy":"yes"}', "w1", 1, clock.now() + 30)
    assert err.raw == '{"legacy":"yes"}'
    assert query(db_path, "SELECT event FROM messages WHERE seq = 1") == [(err.raw,)]
    assert "message 1 of group 'g' does not decode: order_id: Field required" in str(err)
    assert isinstance(err.__cause__, ValidationError)


def test_undecodable_event_is_leased_so_its_group_is_held(
    strict: SqliteTransport[Order],
) -> None:
    _poison(strict)
    other = strict.claim("w2", 30)
    assert other is not None
    assert (other.group_id, other.event) == ("h", Order(order_id=3))
    assert strict.claim("w2", 30) is None


def test_acking_the_poison_lease_lets_the_group_flow(
    strict: SqliteTransport[Order], db_path: Path
) -> None:
    err = _poison(strict)
    strict.ack(err.lease)
    assert query(db_path, "SELECT seq FROM messages WHERE group_id = 'g'") == [(2,)]
    never_served = strict.claim("w1", 30)  # round-robin: "h" has not had a turn yet
    assert never_served is not None
    assert never_served.group_id == "h"
    following = strict.claim("w1", 30)
    assert following is not None
    assert (following.seq, following.event) == (2, Order(order_id=2))


def test_nacking_the_poison_lease_with_delay_parks_it(
    strict: SqliteTransport[Order], clock: ManualClock
) -> None:
    err = _poison(strict)
    strict.nack(err.lease, delay=60)
    other = strict.claim("w1", 30)
    assert other is not None
    assert other.group_id == "h"
    strict.ack(other)
    assert strict.claim("w1", 30) is None
    clock.advance(61)
    again = _poison(strict, "w2")
    assert (again.lease.seq, again.lease.attempt, again.lease.worker_id) == (1, 2, "w2")


def test_poison_lease_is_fenced_like_any_other(
    strict: SqliteTransport[Order], clock: ManualClock
) -> None:
    err = _poison(strict)
    other = strict.claim("w1", 30)
    assert other is not None
    strict.ack(other)
    clock.advance(31)
    again = _poison(strict, "w2")
    with pytest.raises(LeaseLost):
        strict.ack(err.lease)
    strict.ack(again.lease)


def test_decodable_events_keep_flowing_around_poison(open_db: OpenDb) -> None:
    loose = open_db()
    for i in range(4):
        loose.publish(f"g{i}", Event(order_id=i) if i % 2 else Event(junk=i))
    strict = open_db(event_type=Order)
    decoded: list[Any] = []
    poisoned: list[str] = []
    for _ in range(4):
        try:
            lease = strict.claim("w", 30)
        except EventDecodeError as err:
            poisoned.append(err.lease.group_id)
            strict.ack(err.lease)
        else:
            assert lease is not None
            decoded.append(lease.event)
            strict.ack(lease)
    assert decoded == [Order(order_id=1), Order(order_id=3)]
    assert poisoned == ["g0", "g2"]
