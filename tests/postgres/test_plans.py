"""The statements on a worker's path use index seeks only, also as generic plans (what a
prepared statement switches to), on a queue with a backlog."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from transports_core import Event, Transport
from transports_postgres import _sql as sql

GROUPS = 2000
PER_GROUP = 10

# Each statement, and parameter values of the right types for the EXPLAIN.
HOT = {
    "claim_ready": (sql.CLAIM_READY, (0, None, "w", 30.0, None)),
    "claim": (sql.CLAIM, (0, None, "w", 30.0, None)),
    "wake": (sql.WAKE_LAPSED, (None,)),
    "next_due": (sql.NEXT_DUE, (None, 0)),
    "lock_lease": (sql.LOCK_LEASE, ("g1", 1, "w", 1)),
    "ack_at_once": (sql.ACK_AT_ONCE, ("g1", 1, "w", 1, None)),
    "ack": (sql.ACK, ("g1", 1, "w", 1, None)),
    "nack": (sql.FREE, ("g1", 1, "w", 1, None)),
    "park": (sql.RELEASE, ("g1", 1, "w", 1, sql.PARKED, None, 30.0, None)),
    "extend": (sql.EXTEND, ("g1", 1, "w", 1, None, 30.0, None)),
    "publish_lock": (sql.LOCK_GROUP, ("g1", 0)),
    "publish": (sql.APPEND, ("g1", None, 0, "{}")),
    "claim_simple": (sql.CLAIM_SIMPLE, (0, None, "w", 30.0, None)),
    "claim_needs": (sql.CLAIM_NEEDS, (None,)),
    "claim_tenant": (sql.CLAIM_TENANT, (0, "t", None, "w", 30.0, None)),
    "claim_no_tenant": (sql.CLAIM_NO_TENANT, (0, None, "w", 30.0, None)),
    "tenant_turns": (sql.TENANT_TURNS, ()),
    "make_due_groups": (sql.MAKE_DUE_GROUPS, (None,)),
    "claim_many": (sql.CLAIM_MANY, (0, None, 100, 3, "w", 30.0, 1e-6, None)),
    "lock_batch_groups": (sql.LOCK_BATCH_GROUPS, (["g1", "g2"],)),
    "ack_many": (sql.ACK_MANY, (["g1", "g2"], [1, 2], ["w", "w"], [1, 1], None)),
}


# (claim_many sorts the groups it locked, at most its limit, to number them; the locks of
# an ack_many are taken in group order.)
SORTS_FEW = {"tenant_turns", "make_due_groups", "claim_many", "lock_batch_groups"}


def _positional(stmt: sql.Statement, schema: str) -> str:
    text = stmt.render(schema)
    for number, name in enumerate(stmt.names, 1):
        text = text.replace(f"%({name})s", f"${number}").replace(f"%({name})b", f"${number}")
    return text.replace("%%", "%")


@pytest.fixture
def loaded(queue: Transport[Event], raw: psycopg.Connection[Any], schema: str) -> str:
    queue.publish_many(
        [(f"g{g}", Event(n=n), g % 5) for n in range(PER_GROUP) for g in range(GROUPS)]
    )
    for _ in range(GROUPS // 4):  # some busy groups too
        assert queue.claim("w", 3600) is not None
    raw.execute(f'ANALYZE "{schema}".groups')
    raw.execute(f'ANALYZE "{schema}".messages')
    return schema


def _plan(raw: psycopg.Connection[Any], schema: str, name: str) -> str:
    stmt, params = HOT[name]
    raw.execute(f"PREPARE probe_{name} AS {_positional(stmt, schema)}")
    args = ", ".join("NULL" if p is None else psycopg.sql.quote(p) for p in params)
    call = f"probe_{name}({args})" if params else f"probe_{name}"
    return "\n".join(row[0] for row in raw.execute(f"EXPLAIN EXECUTE {call}"))


def test_hot_statements_use_index_seeks_only_as_generic_plans(
    loaded: str, raw: psycopg.Connection[Any]
) -> None:
    raw.execute("SET plan_cache_mode = force_generic_plan")
    raw.execute("BEGIN")  # EXPLAIN of a write does not run it; rolled back all the same
    try:
        plans = {name: _plan(raw, loaded, name) for name in HOT}
    finally:
        raw.execute("ROLLBACK")
    for name, plan in plans.items():
        assert "Seq Scan on groups" not in plan, f"{name}:\n{plan}"
        assert "Seq Scan on messages" not in plan, f"{name}:\n{plan}"
        # No sort: the next head and the next group come off an index in order (the
        # tenants' turns sort the tenants that have a ready group, and the groups of due
        # delayed messages are sorted, at most 100, into the order they are locked in).
        assert "Sort" not in plan or name in SORTS_FEW, f"{name}:\n{plan}"
        # (A bitmap scan of a primary key by a list of its keys is a seek per key.)
        seeks = re.findall(
            r"Index (?:Only )?Scan(?: Backward)? using (\w+)|Bitmap Index Scan on (\w+_pkey)", plan
        )
        assert seeks or "Conflict Arbiter Indexes" in plan, f"{name}:\n{plan}"
    assert "groups_ready" in plans["claim"], plans["claim"]
    assert "groups_ready" in plans["claim_ready"], plans["claim_ready"]
    assert "groups_busy" in plans["claim_ready"], plans["claim_ready"]
    assert "groups_busy" in plans["wake"], plans["wake"]
    # A batch's heads and next messages are one probe each, their rows changed by row id.
    assert "Index Scan using messages_pkey" in plans["claim_many"], plans["claim_many"]
    assert "Tid Scan on messages" in plans["ack_many"], plans["ack_many"]


def test_a_fresh_queue_claims_off_the_front_of_its_index_before_any_statistics(
    queue: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    # A few groups and many claims, as a new queue sees before autovacuum first analyzes
    # it: the planner knows nothing of the free groups but the statement's own words.
    queue.publish_many([(f"g{n % 50}", Event(n=n), 0) for n in range(1000)])
    for _ in range(500):
        lease = queue.claim("w", 60)
        assert lease is not None
        queue.ack(lease)
    (analyzed,) = raw.execute(
        "SELECT coalesce(last_analyze, last_autoanalyze) FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = 'groups'",
        (schema,),
    ).fetchone() or (None,)
    assert analyzed is None
    raw.execute("SET plan_cache_mode = force_generic_plan")
    raw.execute("BEGIN")
    try:
        plan = _plan(raw, schema, "claim_ready")
    finally:
        raw.execute("ROLLBACK")
    # Not every free group read (a bitmap or sequential scan) and sorted.
    assert "Sort" not in plan, plan
    assert "Bitmap" not in plan, plan
    assert re.search(r"Index Scan using groups_ready", plan), plan


# publish_many's two statements, for a batch of two groups (one message each), and
# ack_many's two.
BATCH = {
    "lock_groups": (sql.LOCK_GROUPS, (["g1", "new"], [0, 0], [1, 1])),
    "append_many": (
        sql.APPEND_MANY,
        (["{}", "{}"], ["g1", "new"], [0, 0], ["g1", "new"], [1, 2], None),
    ),
    "lock_batch_groups": HOT["lock_batch_groups"],
    "ack_many": HOT["ack_many"],
}
UPSERTS = {"lock_groups", "append_many"}


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed", "never-analyzed"])
def test_a_batch_finds_its_groups_by_key_whatever_the_statistics(
    queue: Transport[Event],
    raw: psycopg.Connection[Any],
    schema: str,
    analyzed: bool,
) -> None:
    # Many groups already: a scan of the groups table per batch would cost per group.
    queue.publish_many([(f"g{g}", Event(n=g), 0) for g in range(GROUPS)])
    if analyzed:
        raw.execute(f'ANALYZE "{schema}".groups')
        raw.execute(f'ANALYZE "{schema}".messages')
    raw.execute("SET plan_cache_mode = force_generic_plan")
    raw.execute("BEGIN")
    try:
        plans = {}
        for name, (stmt, params) in BATCH.items():
            raw.execute(f"PREPARE probe_{name} AS {_positional(stmt, schema)}")
            args = ", ".join("NULL" if p is None else psycopg.sql.quote(p) for p in params)
            rows = raw.execute(f"EXPLAIN EXECUTE probe_{name}({args})")
            plans[name] = "\n".join(row[0] for row in rows)
    finally:
        raw.execute("ROLLBACK")
    for name, plan in plans.items():
        assert "Seq Scan on groups" not in plan, f"{name}:\n{plan}"
        assert "Seq Scan on messages" not in plan, f"{name}:\n{plan}"
        if name in UPSERTS:
            assert "Conflict Arbiter Indexes: groups_pkey" in plan, f"{name}:\n{plan}"
        else:
            assert "groups_pkey" in plan, f"{name}:\n{plan}"


def test_the_stats_read_the_oldest_ready_message_off_the_front_of_its_index(
    loaded: str, raw: psycopg.Connection[Any]
) -> None:
    # The groups are counted in one scan of their table (as ever); the messages are not
    # scanned: each priority's oldest ready one is the front of its part of messages_ready.
    raw.execute("SET plan_cache_mode = force_generic_plan")
    raw.execute("BEGIN")
    try:
        raw.execute(f"PREPARE probe_counts AS {_positional(sql.MESSAGE_COUNTS, loaded)}")
        args = f"{psycopg.sql.quote(sql.PARKED)}, NULL"
        rows = raw.execute(f"EXPLAIN EXECUTE probe_counts({args})")
        plan = "\n".join(row[0] for row in rows)
    finally:
        raw.execute("ROLLBACK")
    assert "Seq Scan on messages" not in plan, plan
    assert "Index Scan using messages_ready" in plan, plan


# claim_many's, and ack_many's two: the statements of a batch that reach its groups' rows.
BATCH_ROWS = ("claim_many", "lock_batch_groups", "ack_many")
# The ways into groups that cost a probe per row found: a key, a row id, the front of the
# claims' indexes (the free groups in order; the first busy or tenanted one).
PROBES = {
    "Index Scan using groups_pkey",
    "Tid Scan",
    "Index Scan using groups_ready",
    "Index Only Scan using groups_busy",
    "Index Only Scan using groups_tenanted",
}


def test_a_batch_reaches_its_groups_one_probe_each_on_a_small_table(
    queue: Transport[Event], raw: psycopg.Connection[Any], schema: str
) -> None:
    # A few hundred groups with short names and a backlog, drained once by batches and
    # filled again, never analyzed: the groups table is a few dozen pages, which the
    # planner would rather scan than probe, and a scan joined to a batch that it
    # believes has one row is then made once per group of the batch.
    items = [(f"g{n % 500}", Event(n=n), 0) for n in range(3000)]
    queue.publish_many(items)
    while leases := queue.claim_many("w", 60, 50):
        assert queue.ack_many(leases) == []
    queue.publish_many(items)
    leases = queue.claim_many("w", 60, 50)
    fences = [
        [x.group_id for x in leases],
        [x.seq for x in leases],
        [x.worker_id for x in leases],
        [x.attempt for x in leases],
    ]
    params = {
        "claim_many": HOT["claim_many"][1],
        "lock_batch_groups": (fences[0],),
        "ack_many": (*fences, None),
    }
    raw.execute("SET plan_cache_mode = force_generic_plan")
    raw.execute("BEGIN")
    try:
        plans = {}
        for name in BATCH_ROWS:
            stmt = HOT[name][0]
            raw.execute(f"PREPARE probe_{name} AS {_positional(stmt, schema)}")
            args = ", ".join("NULL" if p is None else psycopg.sql.quote(p) for p in params[name])
            rows = raw.execute(f"EXPLAIN EXECUTE probe_{name}({args})")
            plans[name] = "\n".join(row[0] for row in rows)
    finally:
        raw.execute("ROLLBACK")
    for name, plan in plans.items():
        # Every row of groups the statement reaches is a probe of an index or a row id.
        scans = re.findall(r"((?:\w+ )*?Scan(?: using \w+)?) on groups\b", plan)
        assert scans, f"{name}:\n{plan}"
        for scan in scans:
            assert scan in PROBES, f"{name}: {scan}\n{plan}"
    assert "Tid Scan on groups" in plans["claim_many"], plans["claim_many"]
    assert "Tid Scan on groups" in plans["ack_many"], plans["ack_many"]
