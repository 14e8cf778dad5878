"""The sans-I/O operations, driven by a fake runner: no database, no clock. Each test feeds
`Result`s in by hand and checks the statements yielded and the decisions taken."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest

from transports_core import Event, EventDecodeError, Lease, LeaseLost, TransportError
from transports_core import backend as core
from transports_core.backend import Claimed, EventCodec
from transports_sqlite import SqliteOptions, SqliteTransport, _ops
from transports_sqlite import _sql as sql
from transports_sqlite._ops import Result, Stmt

T = TypeVar("T")

NOW = 1_000.0
LEASE: Lease[Event] = Lease(7, "g", Event(i=1), "w1", 3, NOW + 5)
FENCE = {"group_id": "g", "seq": 7, "worker_id": "w1", "attempt": 3}
CODEC: EventCodec[Event] = EventCodec(Event)


def bound(stmt: Stmt) -> tuple[sql.Statement, dict[str, Any]]:
    """``stmt`` as (statement, the values it binds, by name). Only the names the statement
    declares are bound, and each must be given."""
    statement = stmt.statement
    values = dict(zip(statement.places, statement.bind(stmt.params), strict=True))
    assert values == stmt.params, f"values given but not bound: {stmt.params}"
    return statement, values


def rows(stmt: Stmt) -> list[dict[str, Any]]:
    """A batch's rows by name: each row is a tuple in the order of the statement's names."""
    assert stmt.many is not None
    names = stmt.statement.names
    return [dict(zip(names, row, strict=True)) for row in stmt.many]


def drive(op: _ops.Op[T], results: Sequence[Result], now: float = NOW) -> tuple[list[Stmt], T]:
    """Run ``op`` with core's driver, answering its statements with ``results`` in order;
    return what it ran and what it returned. Fails if it wants more answers."""
    answers = iter(results)
    seen: list[Stmt] = []

    def answer(stmt: Stmt) -> Result:
        seen.append(stmt)
        result = next(answers, None)
        if result is None:
            raise AssertionError(f"the operation wants more results after {seen}")
        return result

    value = core.drive(op, now, answer)
    assert next(answers, None) is None, "the operation stopped before using every result"
    return seen, value


DONE = Result([], 1)
NOTHING = Result([], 0)


# claim


WOKEN = Result([], 0)  # the wake-up of lapsed leases, whatever it changed
PROMOTED = Result([], 0)  # the promotion of due timers, whatever it moved
UNTENANTED = Result([(0,)], -1)  # no group has a tenant
ROW = (7, "g", '{"i":1}', 3)  # head_seq, group_id, event, attempt
CLAIM = {"worker_id": "w1", "expires_at": NOW + 30, "min_priority": 2, "now": NOW}


def test_claim_first_tries_one_statement_guarded_against_lapses() -> None:
    op = _ops.Claim("w1", 30, 2)
    assert op.begin == sql.BEGIN_WRITE  # `now` is read under the write lock
    stmts, value = drive(op, [Result([ROW], 1)])
    assert [bound(s) for s in stmts] == [(sql.CLAIM_READY, CLAIM | {"max_attempts": 2**62})]
    assert value == Claimed(7, "g", '{"i":1}', "w1", 3, NOW + 30)
    assert value.lease(CODEC) == Lease(7, "g", Event(i=1), "w1", 3, NOW + 30)


def test_claim_guards_the_first_statement_with_max_attempts() -> None:
    stmts, _ = drive(
        _ops.Claim("w1", 30, 2, max_attempts=4), [NOTHING, PROMOTED, WOKEN, UNTENANTED, NOTHING]
    )
    assert bound(stmts[0])[1]["max_attempts"] == 4


FREE = Result([("g", 7, 2, None, None)], 1)  # group, head, deliveries, holder, requeued at
LEASED = {"worker_id": "w1", "expires_at": NOW + 30, "now": NOW, "group_id": "g"}


def test_claim_goes_on_by_waking_lapsed_groups_when_the_first_statement_declines() -> None:
    stmts, value = drive(
        _ops.Claim("w1", 30, 2), [NOTHING, PROMOTED, WOKEN, UNTENANTED, FREE, Result([ROW], 1)]
    )
    assert [bound(s) for s in stmts[1:]] == [
        (sql.PROMOTE_DUE, {"now": NOW}),
        (sql.WAKE_LAPSED, {"now": NOW}),
        (sql.ANY_TENANT, {}),
        (sql.NEXT_FREE, {"min_priority": 2}),
        (sql.CLAIM_GROUP, LEASED),
    ]
    assert value == Claimed(7, "g", '{"i":1}', "w1", 3, NOW + 30)
    assert (
        drive(_ops.Claim("w1", 30, 2), [NOTHING, PROMOTED, WOKEN, UNTENANTED, NOTHING])[1] is None
    )


@pytest.mark.parametrize(
    ("holder", "last"), [("w0", "lapsed"), (None, "nacked"), (sql.PARKED, "nacked")]
)
def test_claim_buries_a_head_out_of_attempts_saying_how_its_last_delivery_ended(
    holder: str | None, last: str
) -> None:
    spent = Result([("g", 7, 3, holder, None)], 1)
    op = _ops.Claim("w1", 30, 2, max_attempts=3)
    stmts, value = drive(
        op, [NOTHING, PROMOTED, WOKEN, UNTENANTED, spent, DONE, DONE, DONE, NOTHING]
    )
    assert value is None
    bury = bound(stmts[5])
    assert bury[0] == sql.BURY
    assert bury[1]["attempts"] == 3
    assert bury[1]["reason"] == (
        f"out of attempts: 3 deliveries without an ack (max_attempts=3); the last one {last}"
    )
    assert [s.statement for s in stmts[6:]] == [
        sql.DROP_MESSAGE,
        sql.FORGET_REQUEUED,
        sql.NEXT_FREE,
    ]


def test_claim_counts_deliveries_from_a_requeue() -> None:
    requeued = Result([("g", 7, 5, None, 3)], 1)  # 5 deliveries, 3 of them before a requeue
    op = _ops.Claim("w1", 30, 2, max_attempts=3)
    stmts, value = drive(op, [NOTHING, PROMOTED, WOKEN, UNTENANTED, requeued, Result([ROW], 1)])
    assert stmts[-1].statement is sql.CLAIM_GROUP
    assert value is not None


def test_bury_checks_the_fence_then_dead_letters_under_the_policy() -> None:
    stmts, _ = drive(
        _ops.BuryLease(LEASE, "bad input", "hold"), [Result([(1,)], 1), DONE, DONE, DONE]
    )
    assert bound(stmts[0]) == (sql.HOLDS_LEASE, FENCE)
    assert bound(stmts[1])[1]["reason"] == "buried: bad input"
    assert [s.statement for s in stmts[2:]] == [sql.HOLD_GROUP, sql.FORGET_REQUEUED]
    with pytest.raises(LeaseLost):
        drive(_ops.BuryLease(LEASE, "bad input", "release"), [NOTHING])


def test_claim_takes_now_from_its_caller() -> None:
    op = _ops.Claim("w1", 30, 0)
    early, _ = drive(op, [NOTHING, PROMOTED, WOKEN, UNTENANTED, FREE, NOTHING], now=10.0)
    late, _ = drive(op, [NOTHING, PROMOTED, WOKEN, UNTENANTED, FREE, NOTHING], now=20.0)
    assert [early[2].params, late[2].params] == [{"now": 10.0}, {"now": 20.0}]
    assert bound(early[5])[1]["expires_at"] == 40.0
    assert bound(late[5])[1]["expires_at"] == 50.0


def test_claimed_row_that_does_not_decode_raises_carrying_the_lease() -> None:
    claimed = Claimed(7, "g", "not json", "w1", 1, NOW + 30)
    with pytest.raises(EventDecodeError, match="message 7 of group 'g' does not decode") as info:
        claimed.lease(CODEC)
    assert info.value.lease == Lease(7, "g", "not json", "w1", 1, NOW + 30)
    assert info.value.raw == "not json"


# ack, nack, extend


def test_ack_deletes_under_the_lease_fence() -> None:
    stmts, value = drive(_ops.Ack(LEASE), [DONE])
    assert [bound(s) for s in stmts] == [(sql.ACK, FENCE)]
    assert value is None


@pytest.mark.parametrize(
    "op",
    [
        lambda: _ops.Ack(LEASE),
        lambda: _ops.Nack(LEASE, 0),
        lambda: _ops.Nack(LEASE, 5),
        lambda: _ops.Extend(LEASE, 5),
    ],
    ids=["ack", "nack", "park", "extend"],
)
def test_settling_raises_lease_lost_when_no_row_matches(
    op: Callable[[], _ops.Op[Any]],
) -> None:
    with pytest.raises(LeaseLost) as info:
        drive(op(), [NOTHING])
    assert info.value.lease is LEASE
    assert "message 7 of group 'g' (worker 'w1', attempt 3)" in str(info.value)


def test_nack_with_delay_parks_until_now_plus_delay() -> None:
    stmts, _ = drive(_ops.Nack(LEASE, 12.5), [DONE])
    assert [bound(s) for s in stmts] == [
        (sql.RELEASE, FENCE | {"locked_by": "__parked__", "lock_expiry": NOW + 12.5})
    ]


def test_nack_without_delay_frees_the_message() -> None:
    stmts, _ = drive(_ops.Nack(LEASE, 0), [DONE])
    assert [bound(s) for s in stmts] == [
        (sql.RELEASE, FENCE | {"locked_by": None, "lock_expiry": None})
    ]


def test_extend_returns_the_lease_with_the_new_expiry() -> None:
    stmts, value = drive(_ops.Extend(LEASE, 20), [DONE])
    assert [bound(s) for s in stmts] == [(sql.EXTEND, FENCE | {"lock_expiry": NOW + 20})]
    assert value == Lease(7, "g", Event(i=1), "w1", 3, NOW + 20)


# publish


def test_publish_inserts_the_encoded_event_and_returns_the_seq() -> None:
    stmts, value = drive(_ops.Publish(CODEC, "g", Event(i=1), 2), [Result([(41,)], 1)])
    assert [bound(s) for s in stmts] == [
        (sql.PUBLISH, {"group_id": "g", "priority": 2, "event": '{"i":1}', "now": NOW})
    ]
    assert value == 41


def test_publish_many_links_each_group_once_then_appends_chained_rows() -> None:
    items = [("g", Event(i=1), 0), ("h", Event(i=2), 4), ("g", Event(i=3), 1)]
    no_timer_due = Result([(0,)], -1)
    stmts, value = drive(
        _ops.PublishMany(CODEC, items), [Result([(10,)], 1), no_timer_due, DONE, DONE, DONE]
    )
    assert [s.statement for s in stmts] == [
        sql.LAST_SEQ,
        sql.ANY_DUE,
        sql.LINK_TAIL,
        sql.OPEN_GROUP,
        sql.INSERT_ROW,
    ]
    # each group's first message in the batch goes behind the group's tail
    assert rows(stmts[2]) == [{"next_seq": 11, "group_id": "g"}, {"next_seq": 12, "group_id": "h"}]
    # each group of the batch: the priority of its first message, its head, tail and depth
    opened = {"tenant": None, "due": None}
    assert rows(stmts[3]) == [
        {"group_id": "g", "priority": 0, "head_seq": 11, "tail_seq": 13, "depth": 2} | opened,
        {"group_id": "h", "priority": 4, "head_seq": 12, "tail_seq": 12, "depth": 1} | opened,
    ]
    # every message, already chained to the next one of its group in the batch
    assert rows(stmts[4]) == [
        {
            "seq": 11,
            "group_id": "g",
            "priority": 0,
            "event": '{"i":1}',
            "next_seq": 13,
            "due": None,
            "ready_at": NOW,
        },
        {
            "seq": 12,
            "group_id": "h",
            "priority": 4,
            "event": '{"i":2}',
            "next_seq": None,
            "due": None,
            "ready_at": NOW,
        },
        {
            "seq": 13,
            "group_id": "g",
            "priority": 1,
            "event": '{"i":3}',
            "next_seq": None,
            "due": None,
            "ready_at": NOW,
        },
    ]
    assert value == [11, 12, 13]


def test_publish_many_of_nothing_runs_no_statement() -> None:
    assert drive(_ops.PublishMany(CODEC, []), []) == ([], [])


# setup


def test_setup_creates_the_schema_in_an_empty_database() -> None:
    stmts, _ = drive(
        _ops.setup("q.db"),
        [Result([(0, 0, 0)], -1), *[DONE for _ in sql.SCHEMA]],
    )
    assert [s.statement for s in stmts] == [sql.READ_IDENTITY, *sql.SCHEMA]


def test_setup_accepts_its_own_schema_without_writing() -> None:
    stmts, _ = drive(
        _ops.setup("q.db"), [Result([(2, sql.APPLICATION_ID, sql.SCHEMA_VERSION)], -1)]
    )
    assert [s.statement for s in stmts] == [sql.READ_IDENTITY]


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        ((1, 0, 0), r"q\.db is a SQLite database of another application \(application_id 0\)"),
        (
            (0, 1234, 0),
            r"q\.db is a SQLite database of another application \(application_id 1234\)",
        ),
        ((0, 0, 7), r"q\.db is a SQLite database of another application \(application_id 0\)"),
        (
            (3, sql.APPLICATION_ID, 9),
            rf"q\.db has queue schema version 9; .* knows version {sql.SCHEMA_VERSION}",
        ),
    ],
)
def test_setup_refuses_a_database_it_does_not_know(
    identity: tuple[int, int, int], message: str
) -> None:
    with pytest.raises(TransportError, match=message):
        drive(_ops.setup("q.db"), [Result([identity], -1)])


# validation happens when the operation is built, before any statement


BAD_BUILDS: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    "reserved worker": (lambda: _ops.Claim("__parked__", 30, 0), ValueError, "'__parked__'"),
    "empty worker": (lambda: _ops.Claim("", 30, 0), ValueError, "worker_id"),
    "zero visibility": (lambda: _ops.Claim("w", 0, 0), ValueError, "visibility"),
    "min_priority 5": (lambda: _ops.Claim("w", 30, 5), ValueError, "min_priority"),
    "empty group": (lambda: _ops.Publish(CODEC, "", Event(), 0), ValueError, "group_id"),
    "priority -1": (lambda: _ops.Publish(CODEC, "g", Event(), -1), ValueError, "-1"),
    "dict event": (lambda: _ops.Publish(CODEC, "g", {"i": 1}, 0), TypeError, "{'i': 1}"),
    "bad item": (lambda: _ops.PublishMany(CODEC, [("g", 1, 0)]), TypeError, "items[0]"),
    "not a lease": (lambda: _ops.Ack("lease"), TypeError, "'lease'"),  # type: ignore[arg-type]
    "negative delay": (lambda: _ops.Nack(LEASE, -1), ValueError, "-1"),
    "nan visibility": (lambda: _ops.Extend(LEASE, float("nan")), ValueError, "nan"),
}


@pytest.mark.parametrize(("build", "error", "names"), BAD_BUILDS.values(), ids=BAD_BUILDS.keys())
def test_bad_arguments_are_refused_when_the_op_is_built(
    build: Callable[[], object], error: type[Exception], names: str
) -> None:
    # Building never takes `now`, so a refusal here happens before any transaction begins.
    with pytest.raises(error) as info:
        build()
    assert names in str(info.value)


def test_a_claim_asked_with_the_very_same_arguments_is_built_and_checked_once() -> None:
    options = SqliteOptions(":memory:", max_attempts=3, on_dead="hold")
    with SqliteTransport[Event](options) as t:
        claims = t._claims
    worker, visibility = "w1", 30.5
    op = claims(worker, visibility, 2)
    assert claims(worker, visibility, 2) is op
    assert (op.worker_id, op.visibility, op.min_priority) == ("w1", 30.5, 2)
    assert (op.max_attempts, op.on_dead) == (3, "hold")
    # Equal is not enough: another object is checked again, and a new op replaces the last.
    other = claims("".join(["w", "1"]), 30.5, 2)
    assert other is not op
    assert claims("".join(["w", "1"]), visibility, 2) is not other


def test_an_equal_argument_of_another_type_is_still_checked() -> None:
    with SqliteTransport[Event](SqliteOptions(":memory:")) as t:
        claims = t._claims
    claims("w", 30, 1)
    with pytest.raises(TypeError, match="min_priority"):
        claims("w", 30, True)  # True == 1, but a bool is no priority
