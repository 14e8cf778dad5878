"""The pieces of ``transports_core.backend`` that every backend would otherwise write
again: the options whitelist, the clock check, the Backend built from a parser and two
transport classes, the reused claim operation, the undecoded claim and the queue totals."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import pytest

from transports_core import Event, EventDecodeError, PriorityStats, QueueStats
from transports_core.backend import (
    Claimed,
    EventCodec,
    OptionTable,
    ReuseLast,
    build_backend,
    check_clock,
    check_max_attempts,
    check_on_dead,
    queue_stats,
)
from transports_sqlite import AsyncSqliteTransport, SqliteOptions, SqliteTransport

TABLE = OptionTable(
    "Toy",
    {"max_attempts": check_max_attempts, "on_dead": check_on_dead},
    keyword_only={"clock": check_clock},
)
URL = "toy://user:s3cret@host/q"


def test_options_from_the_url_are_checked_from_their_text() -> None:
    chosen = TABLE.choose(URL, [("max_attempts", "3"), ("on_dead", "HOLD")], {})
    assert chosen == {"max_attempts": 3, "on_dead": "hold"}


def test_options_from_keywords_are_checked_as_values() -> None:
    clock = lambda: 1.0  # noqa: E731
    chosen = TABLE.choose(URL, [], {"max_attempts": 2, "clock": clock})
    assert chosen == {"max_attempts": 2, "clock": clock}


@pytest.mark.parametrize(
    ("query", "keywords", "message"),
    [
        (
            [("colour", "red")],
            {},
            "unknown Toy option 'colour'; known options: max_attempts, on_dead",
        ),
        (  # a keyword-only option is unknown in a URL
            [("clock", "now")],
            {},
            "unknown Toy option 'clock'; known options: max_attempts, on_dead",
        ),
        (
            [],
            {"colour": "red"},
            "unknown Toy option 'colour'; known options: clock, max_attempts, on_dead",
        ),
        (
            [("on_dead", "hold"), ("on_dead", "release")],
            {},
            "Toy option 'on_dead' is given twice in 'toy://user:***@host/q'",
        ),
        (
            [("on_dead", "hold")],
            {"on_dead": "release"},
            "Toy option 'on_dead' is given both in the URL and as a keyword",
        ),
        ([("max_attempts", "0")], {}, "max_attempts must be a whole number >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_with_a_message_naming_them(
    query: list[tuple[str, str]], keywords: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$") as info:
        TABLE.choose(URL, query, keywords)
    assert "s3cret" not in str(info.value)


def test_what_else_a_url_may_carry_is_named_with_the_known_options() -> None:
    table = OptionTable("Toy", {"schema": str}, elsewhere="and libpq's, in the URL")
    with pytest.raises(ValueError, match=r"known options: schema \(and libpq's, in the URL\)$"):
        table.choose(URL, [], {"colour": "red"})


def test_check_clock_takes_a_callable_and_refuses_anything_else() -> None:
    assert check_clock(float) is float
    with pytest.raises(TypeError, match="clock must be a callable returning epoch seconds, got 5"):
        check_clock(5)


def _parse(url: str, options: Mapping[str, object]) -> SqliteOptions:
    path = url.removeprefix("kit:///")
    return SqliteOptions(path=path, **TABLE.choose(url, [], options))  # type: ignore[arg-type]


def test_build_backend_opens_both_twins_from_the_parsed_options() -> None:
    backend = build_backend(_parse, SqliteTransport, AsyncSqliteTransport)
    with backend.open("kit:///:memory:", Event, {"max_attempts": 2}) as t:
        assert isinstance(t, SqliteTransport)
        assert t.publish("g", Event(n=1)) == 1
    assert backend.open_async is not None
    opened = backend.open_async("kit:///:memory:", Event, {})
    assert isinstance(opened, AsyncSqliteTransport)
    asyncio.run(opened.close())
    with pytest.raises(ValueError, match="unknown Toy option 'colour'"):
        backend.open("kit:///:memory:", Event, {"colour": "red"})


def test_build_backend_without_an_async_twin_has_none() -> None:
    assert build_backend(_parse, SqliteTransport).open_async is None


class Built:
    def __init__(self, *args: object) -> None:
        self.args = args


def test_reuse_last_keeps_the_value_while_the_same_objects_come_again() -> None:
    calls: list[tuple[object, ...]] = []

    def build(worker: str, visibility: float, floor: int) -> Built:
        calls.append((worker, visibility, floor))
        return Built(worker, visibility, floor)

    reuse = ReuseLast(build)
    worker, visibility = "w1", 30.0
    first = reuse(worker, visibility, 1)
    assert reuse(worker, visibility, 1) is first
    # Equal is not enough: True == 1 and 30 == 30.0, yet each must pass its own checks.
    assert reuse(worker, visibility, True) is not first
    assert reuse(worker, 30, True) is not first
    assert len(calls) == 3
    again = reuse(worker, 30, True)
    assert len(calls) == 3, "the last arguments, once more, build nothing"
    assert reuse(worker, visibility, floor=True) is not again  # keywords: built anew
    assert reuse(worker, 30, True) is again, "a call with keywords is not kept"


def test_reuse_last_keeps_nothing_when_building_fails() -> None:
    def build(n: int) -> int:
        if n < 0:
            raise ValueError(n)
        return n * 2

    reuse = ReuseLast(build)
    assert reuse(2) == 4
    for _ in range(2):  # the second time too: the failure was not kept
        with pytest.raises(ValueError, match="-1"):
            reuse(-1)
    assert reuse(2) == 4


def test_claimed_decodes_into_a_lease_or_raises_with_the_current_lease() -> None:
    codec: EventCodec[Any] = EventCodec(Event)
    lease = Claimed(7, "g", '{"n": 1}', "w1", 2, 50.0).lease(codec)
    assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.attempt) == (
        7,
        "g",
        Event(n=1),
        "w1",
        2,
    )
    assert lease.expires_at == 50.0
    with pytest.raises(EventDecodeError) as info:
        Claimed(8, "g", "not json", "w1", 1, 60.0).lease(codec)
    assert (info.value.lease.seq, info.value.raw) == (8, "not json")


def test_queue_stats_totals_the_counts_per_priority() -> None:
    rows = [PriorityStats(0, 3, 1, 1, 0), PriorityStats(2, 1, 0, 0, 4)]
    assert queue_stats(iter(rows)) == QueueStats(4, 1, 1, 4, tuple(rows))
    assert queue_stats([]) == QueueStats(0, 0, 0, 0, ())
