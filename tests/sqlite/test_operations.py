"""Each operation of the contract, on a real SQLite file, with time moved by a fake clock:
what the file holds after it, and exact lease times. (The contract's behaviour itself is
the conformance suite's, which runs on a SQLite file: ``conformance/test_sqlite.py``.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, TransportError, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import SqliteTransport

from ._support import message_count, query, snapshot
from .conftest import OpenDb


def _drain(t: SqliteTransport[Any], clock: ManualClock) -> list[Lease[Any]]:
    """Claim and ack until nothing is deliverable, a second apart; return the leases."""
    leases = []
    while (lease := t.claim("w", visibility=30)) is not None:
        t.ack(lease)
        leases.append(lease)
        clock.advance(1)
    return leases


# publish


def test_seqs_are_never_reused_after_ack_or_reopen(
    open_db: OpenDb, clock: ManualClock, db_path: Path
) -> None:
    first = open_db()
    old = [first.publish("g", Event(i=i)) for i in range(3)]
    assert [lease.seq for lease in _drain(first, clock)] == old
    assert message_count(db_path) == 0
    first.close()
    assert open_db().publish("g", Event(i=3)) > max(old)


def test_publish_stores_the_event_json(transport: SqliteTransport[Any], db_path: Path) -> None:
    seq = transport.publish("g", Event(kind="created", n=1))
    assert query(db_path, "SELECT event FROM messages WHERE seq = ?", (seq,)) == [
        ('{"kind":"created","n":1}',)
    ]


def test_drained_group_takes_priority_of_next_publish(
    transport: SqliteTransport[Any], db_path: Path
) -> None:
    transport.publish("g", Event(i=1), priority=0)
    lease = transport.claim("w", 30)
    assert lease is not None
    transport.ack(lease)
    assert query(db_path, "SELECT count(*) FROM groups") == [(0,)]
    transport.publish("g", Event(i=2), priority=4)
    again = transport.claim("w", 30, min_priority=4)
    assert again is not None
    assert again.event.i == 2


# claim


def test_claim_returns_the_lease_fields(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    seq = transport.publish("g", Event(kind="x"))
    lease = transport.claim("worker-7", visibility=12.5)
    assert lease == Lease(seq, "g", Event(kind="x"), "worker-7", 1, clock.now() + 12.5)


def test_lapsed_lease_counts_as_free(transport: SqliteTransport[Any], clock: ManualClock) -> None:
    transport.publish("g", Event(i=1))
    first = transport.claim("w1", visibility=10)
    assert first is not None
    clock.advance(9.9)
    assert transport.claim("w2", visibility=10) is None
    clock.advance(0.2)
    second = transport.claim("w2", visibility=10)
    assert second is not None
    assert (second.seq, second.worker_id, second.attempt) == (first.seq, "w2", 2)


# ack and extend


def test_ack_deletes_the_message_and_its_empty_group(
    transport: SqliteTransport[Any], db_path: Path
) -> None:
    transport.publish("g", Event(i=1))
    transport.publish("h", Event(i=2))
    lease = transport.claim("w", 30)
    assert lease is not None
    transport.ack(lease)
    assert query(db_path, "SELECT group_id FROM messages") == [("h",)]
    assert query(db_path, "SELECT group_id FROM groups") == [("h",)]


def test_extend_renews_the_lease(transport: SqliteTransport[Any], clock: ManualClock) -> None:
    transport.publish("g", Event(i=1))
    lease = transport.claim("w1", visibility=10)
    assert lease is not None
    clock.advance(8)
    renewed = transport.extend(lease, visibility=10)
    assert renewed == Lease(lease.seq, "g", lease.event, "w1", 1, clock.now() + 10)
    clock.advance(5)  # past the first expiry, within the renewed one
    assert transport.claim("w2", 10) is None
    transport.ack(renewed)
    assert transport.claim("w2", 10) is None


# lifecycle


def test_with_block_closes(db_path: Path) -> None:
    with open_transport(f"sqlite:///{db_path}") as t:
        t.publish("g", Event(i=1))
    with pytest.raises(TransportError, match="closed"):
        t.publish("g", Event(i=2))
    assert message_count(db_path) == 1


def test_with_block_closes_on_error(db_path: Path) -> None:
    with pytest.raises(RuntimeError), open_transport(f"sqlite:///{db_path}") as t:
        raise RuntimeError
    with pytest.raises(TransportError, match="closed"):
        t.claim("w", 30)


LEASE = Lease(1, "g", Event(), "w", 1, 0.0)
CALLS: dict[str, Callable[[SqliteTransport[Any]], object]] = {
    "publish": lambda t: t.publish("g", Event()),
    "publish_many": lambda t: t.publish_many([("g", Event(), 0)]),
    "claim": lambda t: t.claim("w", 30),
    "ack": lambda t: t.ack(LEASE),
    "nack": lambda t: t.nack(LEASE),
    "extend": lambda t: t.extend(LEASE, 30),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_use_after_close_raises_transport_error(
    transport: SqliteTransport[Any], call: Callable[[SqliteTransport[Any]], object]
) -> None:
    transport.close()
    with pytest.raises(TransportError, match="is closed"):
        call(transport)


# publish_many


def test_publish_many_returns_seqs_in_order(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    transport.publish("x", Event(i=-1))
    seqs = transport.publish_many(
        [("g", Event(i=0), 0), ("h", Event(i=1), 2), ("g", Event(i=2), 0)]
    )
    assert len(seqs) == 3
    assert seqs == sorted(seqs)
    by_seq = {lease.seq: (lease.group_id, lease.event.i) for lease in _drain(transport, clock)}
    assert [by_seq[seq] for seq in seqs] == [("g", 0), ("h", 1), ("g", 2)]


def test_publish_many_seqs_follow_a_gap_left_by_acks(
    transport: SqliteTransport[Any], clock: ManualClock
) -> None:
    last = transport.publish_many([("g", Event(i=i), 0) for i in range(3)])[-1]
    _drain(transport, clock)
    seqs = transport.publish_many([("g", Event(i=i), 0) for i in range(3, 5)])
    assert seqs == [last + 1, last + 2]
    assert [lease.seq for lease in _drain(transport, clock)] == seqs


def test_publish_many_of_nothing_returns_empty(
    transport: SqliteTransport[Any], db_path: Path
) -> None:
    assert transport.publish_many([]) == []
    assert message_count(db_path) == 0


def test_publish_many_first_item_of_a_new_group_sets_its_priority(
    transport: SqliteTransport[Any],
) -> None:
    transport.publish_many([("g", Event(i=1), 4), ("g", Event(i=2), 0)])
    first = transport.claim("w", 30, min_priority=4)
    assert first is not None
    transport.ack(first)
    second = transport.claim("w", 30, min_priority=4)
    assert second is not None
    assert second.event.i == 2


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (("", Event(), 0), "group_id"),
        (("g", {"i": 1}, 0), "not a valid Event"),
        (("g", Event(), 9), "priority must be from 0 to 4, got 9"),
        (("g", Event()), "must be a Message or a (group_id, event, priority) tuple"),
    ],
)
def test_publish_many_refuses_the_whole_batch_naming_the_bad_item(
    transport: SqliteTransport[Any], db_path: Path, bad: tuple[object, ...], message: str
) -> None:
    transport.publish("g", Event(i=0))
    before = snapshot(db_path)
    items: list[Any] = [("g", Event(i=1), 0), ("h", Event(i=2), 0), bad, ("k", Event(i=3), 0)]
    with pytest.raises((TypeError, ValueError)) as info:
        transport.publish_many(items)
    assert str(info.value).startswith("items[2]")
    assert message in str(info.value)
    assert snapshot(db_path) == before
