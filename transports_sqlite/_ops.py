"""Every SQLite operation as a sans-I/O generator, shared by the sync and async drivers.

An operation validates its arguments when it is built (so bad input never takes the write
lock), then, given the transaction's ``now``, yields `Stmt` objects, receives a `Result`
for each, and returns its value or raises `LeaseLost`. It does no I/O, reads no clock and
imports no driver: the drivers open the transaction, run what is yielded, and commit when
the generator returns.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from transports_core import LeaseLost, TransportError
from transports_core._codec import EventCodec
from transports_core._models import Lease
from transports_core._validate import (
    PARKED,
    check_delay,
    check_group_id,
    check_lease,
    check_priority,
    check_visibility,
    check_worker_id,
)

from . import _sql as sql

T = TypeVar("T")

Params = Sequence[Any] | dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stmt:
    sql: str
    params: Params = ()
    many: Sequence[Params] | None = field(default=None)  # run with executemany


class Result(NamedTuple):
    rows: list[Any]
    rowcount: int


Steps = Generator[Stmt, Result, T]
# An operation, checked and ready: call it with the transaction's `now` to get its steps.
Op = Callable[[float], Steps[T]]


class Claimed(NamedTuple):
    """A leased row, before its event is decoded (outside the transaction)."""

    seq: int
    group_id: str
    raw: str
    worker_id: str
    attempt: int
    expires_at: float

    def lease(self, codec: EventCodec[T]) -> Lease[T]:
        return codec.lease(*self)


def setup(path: str) -> Op[None]:
    """Create the schema in an empty database; refuse a foreign or unknown one."""

    def steps(now: float) -> Steps[None]:
        ((tables, app_id, version),) = (yield Stmt(sql.READ_IDENTITY)).rows
        # Only a pristine database is adopted: one with no tables may still carry another
        # application's application_id or user_version, which the schema would overwrite.
        if (tables, app_id, version) == (0, 0, 0):
            for statement in sql.SCHEMA:
                yield Stmt(statement)
        elif app_id != sql.APPLICATION_ID:
            raise TransportError(
                f"{path} is a SQLite database of another application "
                f"(application_id {app_id}); refusing to use it as a queue"
            )
        elif version != sql.SCHEMA_VERSION:
            raise TransportError(
                f"{path} has queue schema version {version}; this version of "
                f"durable-transports knows version {sql.SCHEMA_VERSION}"
            )

    return steps


def publish(codec: EventCodec[Any], group_id: str, event: object, priority: int) -> Op[int]:
    params = {
        "group_id": check_group_id(group_id),
        "priority": check_priority(priority),
        "event": codec.encode(event),
    }

    def steps(now: float) -> Steps[int]:
        seq: int = (yield Stmt(sql.PUBLISH, params)).rows[0][0]
        return seq

    return steps


def publish_many(codec: EventCodec[Any], items: Iterable[tuple[str, Any, int]]) -> Op[list[int]]:
    rows = [(group_id, priority, raw) for group_id, raw, priority in codec.encode_items(items)]

    def steps(now: float) -> Steps[list[int]]:
        if not rows:
            return []
        yield Stmt(sql.PUBLISH_ROW, many=rows)
        last: int = (yield Stmt(sql.LAST_SEQ)).rows[0][0]
        return list(range(last - len(rows) + 1, last + 1))

    return steps


def claim(worker_id: str, visibility: float, min_priority: int) -> Op[Claimed | None]:
    worker_id = check_worker_id(worker_id)
    visibility = check_visibility(visibility)
    min_priority = check_priority(min_priority, "min_priority")

    def steps(now: float) -> Steps[Claimed | None]:
        expires_at = now + visibility
        yield Stmt(sql.WAKE_LAPSED, {"now": now})
        rows = (
            yield Stmt(
                sql.CLAIM_HEAD,
                {
                    "worker_id": worker_id,
                    "expires_at": expires_at,
                    "min_priority": min_priority,
                },
            )
        ).rows
        if not rows:
            return None
        seq, group_id, raw, attempt = rows[0]
        yield Stmt(sql.MARK_CLAIMED, {"now": now, "group_id": group_id})
        return Claimed(seq, group_id, raw, worker_id, attempt, expires_at)

    return steps


def _fence(lease: Lease[object]) -> dict[str, Any]:
    return {"seq": lease.seq, "worker_id": lease.worker_id, "attempt": lease.attempt}


def _require(result: Result, lease: Lease[object]) -> None:
    if result.rowcount != 1:
        raise LeaseLost(lease)


def ack(lease: Lease[object]) -> Op[None]:
    params = _fence(check_lease(lease))

    def steps(now: float) -> Steps[None]:
        _require((yield Stmt(sql.ACK, params)), lease)

    return steps


def nack(lease: Lease[object], delay: float) -> Op[None]:
    params = _fence(check_lease(lease))
    delay = check_delay(delay)

    def steps(now: float) -> Steps[None]:
        if delay > 0:  # park: the group stays held until the delay has passed
            release = {"locked_by": PARKED, "lock_expiry": now + delay}
        else:
            release = {"locked_by": None, "lock_expiry": None}
        _require((yield Stmt(sql.RELEASE, params | release)), lease)

    return steps


def extend(lease: Lease[T], visibility: float) -> Op[Lease[T]]:
    params = _fence(check_lease(lease))
    visibility = check_visibility(visibility)

    def steps(now: float) -> Steps[Lease[T]]:
        expires_at = now + visibility
        _require((yield Stmt(sql.EXTEND, params | {"lock_expiry": expires_at})), lease)
        return Lease(
            lease.seq, lease.group_id, lease.event, lease.worker_id, lease.attempt, expires_at
        )

    return steps
