"""The races PostgreSQL makes subtle, staged deterministically on the real server: a
transaction held open on a raw connection, a call blocked behind it (seen waiting on a
lock in pg_stat_activity), then the commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
import pytest

from transports_core import Event, Lease, LeaseLost, Transport, TransportAdmin, open_transport
from transports_core.conformance import ManualClock
from transports_postgres import _sql as sql
from transports_postgres._ops import Ack, Claim, Result, Steps, Stmt
from transports_postgres._sync import PostgresTransport

Conn = psycopg.Connection[Any]


def _run(conn: Conn, schema: str, stmt: sql.Statement, *params: object) -> list[Any]:
    cursor = conn.execute(stmt.render(schema), dict(zip(stmt.names, params, strict=True)))
    return cursor.fetchall() if cursor.description else []


def _blocked_on_lock(raw: Conn, blocker: Conn, timeout: float = 20) -> int:
    """Wait until a backend waits for a lock that ``blocker`` holds; return its pid.
    (Matched by the blocker's pid: other runs share the server.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = raw.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (blocker.info.backend_pid,),
        ).fetchall()
        if rows:
            return int(rows[0][0])
        time.sleep(0.01)
    raise AssertionError(f"no backend waited for a lock of pid {blocker.info.backend_pid}")


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def _open_publish(schema_url: tuple[str, str], group: str, n: int) -> Conn:
    """A publish to ``group`` that holds the group lock and has appended, uncommitted."""
    url, schema = schema_url
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("BEGIN")
    _run(conn, schema, sql.LOCK_GROUP, group, 0)
    _run(conn, schema, sql.APPEND, group, None, 0, Event(n=n).model_dump_json())
    return conn


class OneStatementAck(Ack):
    """The ack this backend must not be: one statement, no lock taken first, and no look
    at the group row as the publish committed it."""

    __slots__ = ()

    def first(self, now: float | None) -> tuple[Any, ...]:
        return (Stmt(sql.ACK, (*self.fence, now)),)

    def done(self, results: list[Result], now: float | None) -> None:
        self.held(results[0].rows[0][0] == 1)


class AtOnceWithoutRetry(Ack):
    """The backend's first try at an ack, taken for the whole ack: when the race leaves it
    unable to tell the next head, it changes nothing, and nothing acks again."""

    __slots__ = ()

    def done(self, results: list[Result], now: float | None) -> None:
        self.held(results[0].rows[0][0] == 1)


class CountingAck(Ack):
    """The backend's ack, noting whether it had to ack again, locking first."""

    __slots__ = ()
    retried: ClassVar[list[bool]] = []

    def steps(self, now: float | None) -> Steps[None]:
        CountingAck.retried.append(True)
        return super().steps(now)


ACKS: dict[str, type[Ack]] = {
    "ack": CountingAck,
    "one-statement": OneStatementAck,
    "at-once-without-retry": AtOnceWithoutRetry,
}


def _ack_racing_a_publish(
    queue: PostgresTransport[Event], raw: Conn, schema_url: tuple[str, str], op: Ack, n: int
) -> object:
    """Run ``op`` while a publish of ``Event(n=n)`` to its group holds the group row; the
    publish commits once the ack waits for that row. What the ack returned or raised."""
    publisher = _open_publish(schema_url, op.lease.group_id, n)
    try:
        thread, out = _in_thread(lambda: queue._run(op))
        _blocked_on_lock(raw, publisher)
        publisher.execute("COMMIT")
        thread.join(20)
    finally:
        publisher.close()
    (outcome,) = out
    return outcome


@pytest.mark.parametrize("ack", list(ACKS))
def test_ack_sees_a_publish_to_its_group_committing_meanwhile(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str], ack: str
) -> None:
    # The group has only the acked message when the ack begins: its snapshot cannot see
    # the next one.
    assert isinstance(queue, PostgresTransport)
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    CountingAck.retried.clear()
    outcome = _ack_racing_a_publish(queue, raw, schema_url, ACKS[ack](lease), 2)
    nxt = queue.claim("w", 60)
    if ack != "at-once-without-retry":
        assert outcome is None
    if ack == "one-statement":
        # The race is real: the one-statement ack deleted the group row from a snapshot
        # older than the publish, and the new message is stranded without a group.
        assert nxt is None
        orphans = raw.execute(
            f'SELECT count(*) FROM "{schema_url[1]}".messages m WHERE NOT EXISTS '
            f'(SELECT 1 FROM "{schema_url[1]}".groups g WHERE g.group_id = m.group_id)'
        ).fetchone()
        assert orphans == (1,)
    elif ack == "at-once-without-retry":
        # It saw the race and changed nothing: the lease looks lost, and the message
        # it acked is still the head.
        assert isinstance(outcome, LeaseLost)
        assert nxt is None
        assert queue.groups()[0].head_seq == lease.seq
    else:
        assert CountingAck.retried == [True]
        assert nxt is not None
        assert nxt.event.n == 2


def test_an_ack_whose_snapshot_has_the_next_head_needs_no_second_try(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str]
) -> None:
    assert isinstance(queue, PostgresTransport)
    queue.publish("g", Event(n=1))
    queue.publish("g", Event(n=2))
    lease = queue.claim("w", 60)
    assert lease is not None
    CountingAck.retried.clear()
    assert _ack_racing_a_publish(queue, raw, schema_url, CountingAck(lease), 3) is None
    # Acked at once, on the group row as the publish committed it: three messages,
    # one acked, two left in order.
    assert CountingAck.retried == []
    (info,) = queue.groups()
    assert info.depth == 2
    events = []
    for _ in range(2):
        nxt = _claim(queue)
        events.append(nxt.event.n)
        queue.ack(nxt)
    assert events == [2, 3]
    assert queue.claim("w", 60) is None


@pytest.mark.parametrize("raced", ["a", "b"], ids=["last-message", "more-messages"])
def test_ack_many_sees_a_publish_to_one_of_its_groups_committing_meanwhile(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str], raced: str
) -> None:
    # Group a has only the acked message when the batch begins, b has one more; a
    # publish to one of them holds its group until the batch waits for it, then
    # commits. The batch's acks run in a statement whose snapshot is taken once its
    # locks are held: both acked, and the new message is next in its group (an ack
    # from an older snapshot would drop group a under it).
    assert isinstance(queue, PostgresTransport)
    queue.publish("a", Event(n=1))
    queue.publish("b", Event(n=1))
    queue.publish("b", Event(n=2))
    leases = queue.claim_many("w", 60, 10)
    assert sorted(x.group_id for x in leases) == ["a", "b"]
    publisher = _open_publish(schema_url, raced, 3)
    try:
        thread, out = _in_thread(lambda: queue.ack_many(leases))
        _blocked_on_lock(raw, publisher)
        publisher.execute("COMMIT")
        thread.join(20)
    finally:
        publisher.close()
    assert out == [[]]
    left: dict[str, list[int]] = {}
    while (nxt := queue.claim("w", 60)) is not None:
        left.setdefault(nxt.group_id, []).append(nxt.event.n)
        queue.ack(nxt)
    assert left == ({"a": [3], "b": [2]} if raced == "a" else {"b": [2, 3]})


class ClaimWithoutWaking(Claim):
    """A claim that takes a ready group without first looking for lapsed ones."""

    __slots__ = ()

    def first(self, now: float | None) -> tuple[Any, ...]:
        return (self._claim(now),)


@pytest.mark.parametrize("wakes", [True, False], ids=["claim", "claim-without-waking"])
def test_a_lapsed_group_keeps_its_turn_before_groups_served_after_it(
    queue_url: str, wakes: bool
) -> None:
    clock = ManualClock()
    with open_transport(queue_url, clock=clock) as queue:
        assert isinstance(queue, PostgresTransport)
        for group in "abc":
            queue.publish(group, Event(n=1))
            queue.publish(group, Event(n=2))
        first = _claim(queue)  # a, whose lease will lapse
        served = _claim(queue)  # b, served after a
        assert (first.group_id, served.group_id) == ("a", "b")
        queue.ack(served)
        clock.advance(120)
        order = []
        for _ in range(3):
            op = Claim("w", 60, 0) if wakes else ClaimWithoutWaking("w", 60, 0)
            claimed = queue._run(op)
            assert claimed is not None
            order.append(claimed.group_id)
    # c was never served; a was served before b: a lapsed lease keeps its group's turn.
    assert order == (["c", "a", "b"] if wakes else ["c", "b", "a"])


def _publish_behind_a_publisher(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str], publish: Callable[[], object]
) -> tuple[int, object]:
    """Run ``publish`` while another publisher holds group g and has drawn no seq yet;
    that one draws (Event(n=1)) and commits only once ``publish`` waits for the group.
    Its seq, and what ``publish`` returned."""
    url, schema = schema_url
    queue.publish("warm", Event(n=0))  # the schema exists
    first = psycopg.connect(url, autocommit=True)
    try:
        first.execute("BEGIN")
        _run(first, schema, sql.LOCK_GROUP, "g", 0)
        thread, out = _in_thread(publish)
        _blocked_on_lock(raw, first)
        ((first_seq, _, _),) = _run(
            first, schema, sql.APPEND, "g", None, 0, Event(n=1).model_dump_json()
        )
        first.execute("COMMIT")
        thread.join(20)
    finally:
        first.close()
    (returned,) = out
    return int(first_seq), returned


def test_two_publishers_to_one_group_commit_in_seq_order(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str]
) -> None:
    first_seq, second_seq = _publish_behind_a_publisher(
        queue, raw, schema_url, lambda: queue.publish("g", Event(n=2))
    )
    assert isinstance(second_seq, int)
    assert first_seq < second_seq
    queue.ack(_claim(queue))  # "warm"
    leases = [_claim(queue)]
    queue.ack(leases[0])
    leases.append(_claim(queue))
    assert [lease.event.n for lease in leases] == [1, 2]


def test_a_batch_draws_its_seqs_under_the_locks_of_its_groups(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str]
) -> None:
    batch = [("h", Event(n=10), 0), ("g", Event(n=2), 0), ("h", Event(n=11), 0)]
    first_seq, seqs = _publish_behind_a_publisher(
        queue, raw, schema_url, lambda: queue.publish_many(batch)
    )
    assert isinstance(seqs, list)
    assert seqs == sorted(seqs)
    assert first_seq < min(seqs)
    queue.ack(_claim(queue))  # "warm"
    order = []
    while (lease := queue.claim("w", 60)) is not None:
        order.append((lease.group_id, lease.event.n))
        queue.ack(lease)
    assert [n for group, n in order if group == "g"] == [1, 2]
    assert [n for group, n in order if group == "h"] == [10, 11]


def test_batches_locking_the_same_groups_in_opposite_orders_never_deadlock(
    queue_url: str,
) -> None:
    groups = [f"g{n:02d}" for n in range(20)]
    errors: list[BaseException] = []

    def publish(order: list[str]) -> None:
        try:
            with open_transport(queue_url) as queue:
                for n in range(30):
                    queue.publish_many([(group, Event(n=n), 0) for group in order])
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=publish, args=(order,))
        for order in (groups, groups[::-1], groups[::2] + groups[1::2])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    with open_transport(queue_url) as queue:
        assert isinstance(queue, TransportAdmin)
        assert queue.stats().ready == 3 * 30 * len(groups)


def _claim(queue: Transport[Event]) -> Lease[Event]:
    lease = queue.claim("w", 60)
    assert lease is not None
    return lease


def test_claimers_skip_a_group_another_claimer_holds(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str]
) -> None:
    url, schema = schema_url
    queue.publish("a", Event(n=1))
    queue.publish("b", Event(n=2))
    holder = psycopg.connect(url, autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute(f"SELECT 1 FROM \"{schema}\".groups WHERE group_id = 'a' FOR UPDATE")
        # Group a is locked by an open transaction: a claim skips it rather than wait.
        lease = queue.claim("w", 60)
        assert lease is not None
        assert lease.group_id == "b"
        assert queue.claim("w", 60) is None
        # Ended here, not by the close: the server ends a closed session's transaction
        # a moment after the socket goes, and a claim meanwhile still skips group a.
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    again = queue.claim("w", 60)
    assert again is not None
    assert again.group_id == "a"


def test_a_claim_blocked_with_wait_is_woken_by_a_publish_from_another_handle(
    queue_url: str, raw: Conn, schema_url: tuple[str, str]
) -> None:
    with open_transport(queue_url) as waiter, open_transport(queue_url) as publisher:
        assert isinstance(waiter, PostgresTransport)
        waiter._recheck = 600.0  # only a notification can wake it in time
        waiter.claim("w", 60)
        thread, out = _in_thread(lambda: waiter.claim("w", 60, wait=30))
        _registered(raw, schema_url[1])
        publisher.publish("g", Event(n=7))
        thread.join(40)
    assert len(out) == 1
    lease = out[0]
    assert isinstance(lease, Lease)
    assert lease.event.n == 7


def test_a_claim_blocked_with_wait_is_woken_when_a_lease_lapses(
    queue_url: str, raw: Conn, schema_url: tuple[str, str]
) -> None:
    with open_transport(queue_url) as waiter:
        assert isinstance(waiter, PostgresTransport)
        waiter._recheck = 600.0
        waiter.publish("g", Event(n=1))
        first = waiter.claim("w1", 0.5)
        assert first is not None
        again = waiter.claim("w2", 60, wait=30)
    # Woken by its timer at the lapse, not by a recheck (which would come after 30 s).
    assert again is not None
    assert (again.seq, again.attempt) == (first.seq, 2)


def test_close_from_another_thread_wakes_a_blocked_claim(
    queue_url: str, raw: Conn, schema_url: tuple[str, str]
) -> None:
    waiter = open_transport(queue_url)
    assert isinstance(waiter, PostgresTransport)
    waiter._recheck = 600.0
    thread, out = _in_thread(lambda: waiter.claim("w", 60, wait=60))
    _registered(raw, schema_url[1])
    waiter.close()
    thread.join(20)
    assert not thread.is_alive()
    assert out == [None]


def test_no_notification_while_nobody_waits(
    queue: Transport[Event], raw: Conn, schema_url: tuple[str, str]
) -> None:
    listener = psycopg.connect(schema_url[0], autocommit=True)
    try:
        listener.execute(f'LISTEN "{schema_url[1]}"')
        queue.publish("g", Event(n=1))
        lease = _claim(queue)
        queue.publish("g", Event(n=2))
        queue.ack(lease)  # frees a group with a next message: would notify a waiter
        assert list(listener.notifies(timeout=0.3)) == []
        raw.execute(f'INSERT INTO "{schema_url[1]}".waiters VALUES (pg_backend_pid())')
        queue.publish("h", Event(n=3))
        assert len(list(listener.notifies(timeout=5, stop_after=1))) == 1
    finally:
        listener.close()


def _registered(raw: Conn, schema: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if raw.execute(f'SELECT count(*) FROM "{schema}".waiters').fetchone() != (0,):
            return
        time.sleep(0.01)
    raise AssertionError("the blocked claim never registered as a waiter")
