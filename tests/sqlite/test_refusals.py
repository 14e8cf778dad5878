"""Bad arguments are refused with an error naming the value, before anything is written:
the transport does not even begin a transaction, and the file's rows are unchanged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from transports_core import Event, Lease
from transports_sqlite import SqliteTransport

from ._support import snapshot
from .conftest import OpenDb


class Order(BaseModel):
    order_id: int


# The transport is typed Any: these calls are wrong on purpose.
Call = Callable[[Any, Lease[Any]], object]
NAN, INF = float("nan"), float("inf")

BAD_CALLS: dict[str, tuple[Call, type[Exception], str]] = {
    # publish
    "empty group_id": (lambda t, _: t.publish("", Event()), ValueError, "group_id"),
    "int group_id": (lambda t, _: t.publish(7, Event()), TypeError, "group_id must be a str"),
    "None group_id": (lambda t, _: t.publish(None, Event()), TypeError, "None"),
    "priority 5": (lambda t, _: t.publish("g", Event(), 5), ValueError, "got 5"),
    "priority -1": (lambda t, _: t.publish("g", Event(), -1), ValueError, "got -1"),
    "bool priority": (lambda t, _: t.publish("g", Event(), True), TypeError, "got True"),
    "float priority": (lambda t, _: t.publish("g", Event(), 1.0), TypeError, "got 1.0"),
    "str priority": (lambda t, _: t.publish("g", Event(), "1"), TypeError, "got '1'"),
    "dict event": (lambda t, _: t.publish("g", {"a": 1}), TypeError, "{'a': 1}"),
    "other model": (lambda t, _: t.publish("g", Order(order_id=1)), TypeError, "order_id=1"),
    "None event": (lambda t, _: t.publish("g", None), TypeError, "event None"),
    # publish_many
    "bad batch item": (
        lambda t, _: t.publish_many([("g", Event(), 0), ("g", Event(), 7)]),
        ValueError,
        "items[1]: priority must be from 0 to 4, got 7",
    ),
    "str batch": (lambda t, _: t.publish_many("gg"), TypeError, "'gg'"),
    # claim
    "reserved worker": (lambda t, _: t.claim("__parked__", 30), ValueError, "'__parked__'"),
    "empty worker": (lambda t, _: t.claim("", 30), ValueError, "worker_id"),
    "int worker": (lambda t, _: t.claim(1, 30), TypeError, "worker_id must be a str"),
    "zero visibility": (lambda t, _: t.claim("w", 0), ValueError, "got 0"),
    "negative visibility": (lambda t, _: t.claim("w", -2.5), ValueError, "got -2.5"),
    "nan visibility": (lambda t, _: t.claim("w", NAN), ValueError, "got nan"),
    "inf visibility": (lambda t, _: t.claim("w", INF), ValueError, "got inf"),
    "str visibility": (lambda t, _: t.claim("w", "30"), TypeError, "got '30'"),
    "bool visibility": (lambda t, _: t.claim("w", True), TypeError, "got True"),
    "min_priority 5": (lambda t, _: t.claim("w", 30, 5), ValueError, "min_priority"),
    # ack, nack, extend
    "ack non-lease": (lambda t, _: t.ack((1, "g")), TypeError, "expected a Lease, got tuple"),
    "nack non-lease": (lambda t, _: t.nack(None), TypeError, "got NoneType"),
    "negative delay": (lambda t, lease: t.nack(lease, -1), ValueError, "delay must be >= 0"),
    "nan delay": (lambda t, lease: t.nack(lease, NAN), ValueError, "delay must be finite"),
    "inf delay": (lambda t, lease: t.nack(lease, INF), ValueError, "got inf"),
    "extend non-lease": (lambda t, _: t.extend("lease", 30), TypeError, "'lease'"),
    "extend visibility 0": (lambda t, lease: t.extend(lease, 0), ValueError, "visibility"),
    "extend nan": (lambda t, lease: t.extend(lease, NAN), ValueError, "got nan"),
}


@pytest.mark.parametrize(("call", "error", "names"), BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_argument_is_refused_before_anything_is_written(
    transport: SqliteTransport[Any],
    db_path: Path,
    call: Call,
    error: type[Exception],
    names: str,
) -> None:
    transport.publish("g", Event(i=1))
    transport.publish("g", Event(i=2))
    lease = transport.claim("w", 30)
    assert lease is not None
    before = snapshot(db_path)
    assert transport._engine.conn is not None
    seen: list[str] = []
    transport._engine.conn.set_trace_callback(seen.append)
    with pytest.raises(error) as info:
        call(transport, lease)
    transport._engine.conn.set_trace_callback(None)
    assert names in str(info.value)
    assert seen == [], "a refused call still ran statements"
    assert snapshot(db_path) == before
    transport.ack(lease)  # the lease the bad call was given is intact


def test_refused_call_leaves_the_transport_usable(open_db: OpenDb) -> None:
    transport = open_db(event_type=Order)
    with pytest.raises(TypeError, match=r"event Event\(order_id=1\) is not a valid Order"):
        transport.publish("g", Event(order_id=1))
    seq = transport.publish("g", Order(order_id=1))
    lease = transport.claim("w", 30)
    assert lease is not None
    assert (lease.seq, lease.event) == (seq, Order(order_id=1))
