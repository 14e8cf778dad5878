"""The pieces of ``transports_core.backend`` that every backend would otherwise write
again: the options whitelist, the clock and seconds checks, the Backend built from a
parser and two transport classes, the reused claim operation, the undecoded claim, the
roots of a claim's operation and of those on a held lease, the queue totals and the admin
reads' values from stored rows."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import pytest

from transports_core import (
    DeadLetter,
    Event,
    EventDecodeError,
    GroupInfo,
    HeldGroup,
    Lease,
    LeaseLost,
    PriorityStats,
    QueueStats,
)
from transports_core.backend import (
    MAX_PUBLISH_DELAY,
    Claimed,
    Claiming,
    EventCodec,
    OptionTable,
    ReuseLast,
    Settle,
    build_backend,
    check_clock,
    check_max_attempts,
    check_on_dead,
    dead_letter,
    group_info,
    held_group,
    queue_stats,
    seconds_option,
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


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("2.5", 2.5), (3, 3.0), (0.25, 0.25), (MAX_PUBLISH_DELAY, MAX_PUBLISH_DELAY)],
)
def test_seconds_option_takes_a_positive_number_from_text_or_a_value(
    given: object, seconds: float
) -> None:
    check = seconds_option("timeout")
    assert check(given) == seconds
    assert type(check(given)) is float


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("0", "timeout must be a number of seconds > 0, got 0.0"),
        (-1, "timeout must be a number of seconds > 0, got -1"),
        ("soon", "timeout must be a number of seconds > 0, got 'soon'"),
        (True, "timeout must be a number of seconds > 0, got True"),
        ("nan", "timeout must be a number of seconds > 0, got nan"),
        ("inf", "timeout must be finite, got inf"),
        # Drivers turn a timeout into a deadline, which overflows the platform's time_t.
        ("1e10", "timeout must be at most 31622400 seconds (a year), got 10000000000.0"),
        (1e10, "timeout must be at most 31622400 seconds (a year), got 10000000000.0"),
        (31_622_401, "timeout must be at most 31622400 seconds (a year), got 31622401"),
        pytest.param(10**400, f"timeout must be finite, got {str(10**400)[:200]}", id="10**400"),
    ],
)
def test_seconds_option_refuses_what_is_not_a_finite_positive_number(
    given: object, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        seconds_option("timeout")(given)


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


PARKED, HELD = "__parked__", float("inf")


@pytest.mark.parametrize(
    ("locked_by", "lock_expiry", "state", "depth", "busy_until"),
    [
        (None, None, "ready", 3, None),
        ("w1", 90.0, "ready", 3, None),  # a lease that lapsed before now
        ("w1", 110.0, "in_flight", 3, 110.0),
        (PARKED, 120.0, "parked", 3, 120.0),
        (PARKED, HELD, "held", 2, None),  # the dead letter is not counted
    ],
)
def test_group_info_reads_the_head_lease_with_the_backends_markers(
    locked_by: str | None, lock_expiry: float | None, state: str, depth: int, busy_until: float
) -> None:
    row = ("g", 4, 17, 80.0, locked_by, lock_expiry, 3)
    info = group_info(row, 100.0, parked=PARKED, held=HELD)
    assert info == GroupInfo("g", 4, depth, 17, state, busy_until, 80.0)  # type: ignore[arg-type]


def test_group_info_of_a_group_never_claimed_has_no_last_claim() -> None:
    info = group_info(("g", 0, 1, 0, None, None, 1), 5.0, parked=PARKED, held=HELD)
    assert info.last_claimed_at is None


def test_dead_letter_and_held_group_are_built_from_their_stored_rows() -> None:
    row = (9, "g", 2, '{"n": 1}', 3, "buried: bad", 70.0, 1)
    assert dead_letter(row) == DeadLetter(9, "g", 2, '{"n": 1}', 3, "buried: bad", 70.0, True)
    assert dead_letter((*row[:7], 0)).held is False
    assert held_group(("g", 9, 70.0, 4)) == HeldGroup("g", 9, waiting=4, since=70.0)


class Touch(Settle[Lease[Any]]):
    """A toy operation on a held lease: ``current`` is what its store would answer."""

    __slots__ = ("current",)

    def __init__(self, lease: Lease[Any], current: bool) -> None:
        super().__init__(lease)
        self.current = current

    def reply(self, expires_at: float) -> Lease[Any]:
        self.held(self.current)
        return self.renewed(expires_at)


def test_settle_checks_the_lease_when_built() -> None:
    with pytest.raises(TypeError, match="lease"):
        Touch("not a lease", True)  # type: ignore[arg-type]


def test_settle_renews_a_current_lease_and_raises_lease_lost_for_another() -> None:
    lease = Lease(7, "g", Event(n=1), "w1", 2, 50.0)
    assert Touch(lease, True).reply(80.0) == Lease(7, "g", Event(n=1), "w1", 2, 80.0)
    with pytest.raises(LeaseLost) as info:
        Touch(lease, False).reply(80.0)
    assert info.value.lease is lease


def test_claiming_checks_the_claims_arguments_and_keeps_the_policy() -> None:
    op: Claiming[None] = Claiming("w1", 2.5, 3, 4, "hold")
    assert (op.worker_id, op.visibility, op.min_priority) == ("w1", 2.5, 3)
    assert (op.max_attempts, op.on_dead) == (4, "hold")
    default: Claiming[None] = Claiming("w1", 1, 0)
    assert (default.max_attempts, default.on_dead) == (None, "release")


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        (("", 1.0, 0), ValueError, "worker_id"),
        (("__parked__", 1.0, 0), ValueError, "'__parked__'"),
        (("w", 0, 0), ValueError, "visibility"),
        (("w", 1.0, True), TypeError, "min_priority"),
        (("w", 1.0, 5), ValueError, "min_priority"),
    ],
)
def test_claiming_refuses_bad_arguments_when_built(
    args: tuple[Any, Any, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=re.escape(names)):
        Claiming(*args)
