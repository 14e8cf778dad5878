"""Every statement a claim, ack, nack, extend or publish runs is an index seek.

SQLite's `EXPLAIN QUERY PLAN` for each statement in `_sql`, and for each statement inside
the triggers that maintain `messages`, `groups` and `seqs` (with ``NEW.x``/``OLD.x`` bound
as parameters, which is how SQLite codes them), must name no full scan of a table and no
temporary B-tree for a sort. A plan that would make a claim cost grow with the backlog
fails here, with no timing involved.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from transports_core import Event
from transports_sqlite import SqliteOptions, SqliteTransport
from transports_sqlite import _sql as sql

# The statements the hot paths run; each is checked on its own.
STATEMENTS = {
    "PUBLISH": sql.PUBLISH,
    "PUBLISH_KEYED": sql.PUBLISH_KEYED,
    "LIVE_KEYS": sql.LIVE_KEYS,
    "REMEMBER_KEY": sql.REMEMBER_KEY,
    "FORGET_EXPIRED": sql.FORGET_EXPIRED,
    "LAST_SEQ": sql.LAST_SEQ,
    "LINK_TAIL": sql.LINK_TAIL,
    "OPEN_GROUP": sql.OPEN_GROUP,
    "INSERT_ROW": sql.INSERT_ROW,
    "WAKE_LAPSED": sql.WAKE_LAPSED,
    "CLAIM_READY": sql.CLAIM_READY,
    "NEXT_FREE": sql.NEXT_FREE,
    "CLAIM_GROUP": sql.CLAIM_GROUP,
    "HOLDS_LEASE": sql.HOLDS_LEASE,
    "ACK": sql.ACK,
    "RELEASE": sql.RELEASE,
    "EXTEND": sql.EXTEND,
    "INSERT_TIMER": sql.INSERT_TIMER,
    "RAISE_LAST_SEQ": sql.RAISE_LAST_SEQ,
    "REGISTER_TENANT": sql.REGISTER_TENANT,
    "ANY_DUE": sql.ANY_DUE,
    "PROMOTE_GROUP": sql.PROMOTE_GROUP,
    "PROMOTE_DUE": sql.PROMOTE_DUE,
    "ANY_TENANT": sql.ANY_TENANT,
    "NEXT_FREE_OF_TENANT": sql.NEXT_FREE_OF_TENANT,
    "NEXT_FREE_UNTENANTED": sql.NEXT_FREE_UNTENANTED,
    "TAKE_TURN_V": sql.TAKE_TURN[0],
    "TAKE_TURN_PASS": sql.TAKE_TURN[1],
}

SEED_SCHEMA = (
    """CREATE TABLE messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL,
        event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)""",
    """CREATE TABLE groups (group_id TEXT PRIMARY KEY, last_claimed_at REAL NOT NULL DEFAULT 0,
        priority INT NOT NULL DEFAULT 0)""",
)

# The seed design's claim, taken literally, on its own tables: a scan of messages, a list
# subquery scanning messages again, and a sort. The checker must reject it, or it checks nothing.
SEED_CLAIM = sql.Statement(
    """
SELECT m.seq, m.group_id, m.event
  FROM messages m JOIN groups g ON g.group_id = m.group_id
 WHERE (m.locked_by IS NULL OR m.lock_expiry < :now)
   AND m.group_id NOT IN (
       SELECT group_id FROM messages WHERE locked_by IS NOT NULL AND lock_expiry >= :now)
   AND g.priority >= :min_priority
 ORDER BY g.last_claimed_at ASC, m.seq ASC LIMIT 1
""",
    ("now", "min_priority"),
    rows=True,
)

# Scans that read no table: a SELECT without FROM, the <= 5 candidates of a claim's
# per-priority seeks (the MERGE of its arms' output, numbered by SQLite), `seqs`,
# whose one row the schema creates, and a keyed batch's own (group, key) pairs, which
# it passes as a JSON array (`json_each` over a parameter, aliased ``j``).
BOUNDED_SCANS = {
    "SCAN CONSTANT ROW",
    "SCAN seqs",
    "SCAN vtime",
    "SCAN j VIRTUAL TABLE INDEX 1:",
    *(f"SCAN (subquery-{n})" for n in range(1, 20)),
}

TRIGGER = re.compile(r"CREATE TRIGGER (\w+)(.*?)\bBEGIN\b(.*)\bEND\b", re.S)
WHEN = re.compile(r"\bWHEN\b(.*)", re.S)
ROW_REF = re.compile(r"\b(NEW|OLD)\.(\w+)")


def _trigger_statements() -> dict[str, sql.Statement]:
    found: dict[str, sql.Statement] = {}
    for ddl in sql.SCHEMA:
        match = TRIGGER.search(ddl.text)
        if match is None:
            continue
        name, head, body = match.groups()
        statements = [s for s in body.split(";") if s.strip()]
        when = WHEN.search(head)
        if when is not None:  # the condition runs on every row too
            statements.append(f"SELECT {when[1]}")
        for number, statement in enumerate(statements):
            text = ROW_REF.sub(lambda ref: f":{ref[1].lower()}_{ref[2]}", statement)
            names = tuple(
                dict.fromkeys(f"{ref[1].lower()}_{ref[2]}" for ref in ROW_REF.finditer(statement))
            )
            found[f"{name}[{number}]"] = sql.Statement(text, names)
    return found


TRIGGER_STATEMENTS = _trigger_statements()


def _plan(conn: sqlite3.Connection, statement: sql.Statement) -> list[str]:
    params = statement.positional((1,) * len(statement.names))
    return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement.sql}", params)]


def _problems(plan: list[str]) -> list[str]:
    """Plan lines that read a table or index without a seek, or sort."""
    return [
        line
        for line in plan
        if "TEMP B-TREE" in line
        or (line.startswith("SCAN") and line not in BOUNDED_SCANS)
        or "LIST SUBQUERY" in line
    ]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    path: Path = tmp_path_factory.mktemp("plans") / "q.db"
    with SqliteTransport[Event](SqliteOptions(str(path))) as transport:
        transport.publish_many([(f"g{i % 7}", Event(i=i), i % 5) for i in range(50)])
    connection = sqlite3.connect(path)
    yield connection
    connection.close()


def test_triggers_were_found() -> None:
    # One statement per trigger at least: a silently empty list would check nothing.
    names = {key.split("[")[0] for key in TRIGGER_STATEMENTS}
    assert names == {
        "publish_message",
        "publish_keyed_message",
        "head_removed",
        "last_removed",
        "promote_timer",
        "promote_group_timers",
        "group_opened",
    }


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_statement_is_index_seeks_only(conn: sqlite3.Connection, name: str) -> None:
    plan = _plan(conn, STATEMENTS[name])  # empty for an INSERT ... VALUES: no reads
    assert not _problems(plan), f"{name} plan:\n" + "\n".join(plan)


@pytest.mark.parametrize("name", sorted(TRIGGER_STATEMENTS))
def test_trigger_statement_is_index_seeks_only(conn: sqlite3.Connection, name: str) -> None:
    plan = _plan(conn, TRIGGER_STATEMENTS[name])
    assert not _problems(plan), f"{name} plan:\n" + "\n".join(plan)


@pytest.mark.parametrize("name", ["CLAIM_READY", "NEXT_FREE"])
def test_claim_seeks_the_turn_index_once_per_priority_level(
    conn: sqlite3.Connection, name: str
) -> None:
    seeks = [line for line in _plan(conn, STATEMENTS[name]) if "(busy_until=?" in line]
    assert len(seeks) == 5, seeks
    assert all(
        "INDEX groups_by_turn (busy_until=? AND paused=? AND priority=?)" in s for s in seeks
    ), seeks


def test_claim_fetches_the_head_by_primary_key(conn: sqlite3.Connection) -> None:
    plan = _plan(conn, sql.CLAIM_READY)
    assert "SEARCH groups USING PRIMARY KEY (group_id=?)" in plan, plan
    assert "SEARCH messages USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
    # The fast path's check that nothing has lapsed is a seek too.
    assert "SEARCH groups USING COVERING INDEX groups_by_turn (busy_until<?)" in plan, plan


@pytest.mark.parametrize("name", ["ACK", "RELEASE", "EXTEND"])
def test_settling_finds_its_rows_by_primary_key(conn: sqlite3.Connection, name: str) -> None:
    searches = [line for line in _plan(conn, STATEMENTS[name]) if "SCALAR" not in line]
    assert searches, name
    assert all(s.startswith("SEARCH") and "PRIMARY KEY" in s for s in searches), searches


def test_a_waiting_claims_look_seeks_the_busy_groups(conn: sqlite3.Connection) -> None:
    plan = _plan(conn, sql.WAIT_STATE)
    assert "SEARCH groups USING COVERING INDEX groups_by_turn (busy_until>?)" in plan, plan
    # The change counter is a pragma: one row, no table.
    assert [line for line in _problems(plan) if "pragma_data_version" not in line] == []


def test_wake_seeks_only_the_lapsed_groups(conn: sqlite3.Connection) -> None:
    (line,) = _plan(conn, sql.WAKE_LAPSED)
    assert "INDEX groups_by_turn (busy_until<?)" in line


def test_checker_rejects_the_seed_claim() -> None:
    with closing(sqlite3.connect(":memory:")) as seed:
        for ddl in SEED_SCHEMA:
            seed.execute(ddl)
        problems = _problems(_plan(seed, SEED_CLAIM))
    assert any(p.startswith("SCAN m") for p in problems), problems
    assert any("TEMP B-TREE" in p for p in problems), problems


@pytest.mark.parametrize("name", ["PUBLISH_KEYED", "LIVE_KEYS"])
def test_a_key_is_found_by_its_primary_key(conn: sqlite3.Connection, name: str) -> None:
    plan = _plan(conn, STATEMENTS[name])
    assert "SEARCH k USING PRIMARY KEY (key=? AND group_id=?)" in plan or (
        "SEARCH keys USING PRIMARY KEY (key=? AND group_id=?)" in plan
    ), plan


@pytest.mark.parametrize(
    "name", ["FORGET_EXPIRED", "publish_keyed_message[0]"], ids=["batch", "publish"]
)
def test_forgetting_keys_seeks_the_expired_ones(conn: sqlite3.Connection, name: str) -> None:
    plan = _plan(conn, {**STATEMENTS, **TRIGGER_STATEMENTS}[name])
    seeks = [line for line in plan if "keys_by_expiry (expires_at<?)" in line]
    assert len(seeks) == 2, plan  # the bounded look for the oldest, and the delete


def test_the_claims_fast_path_looks_at_the_earliest_due_and_any_tenant_by_one_seek_each(
    conn: sqlite3.Connection,
) -> None:
    plan = _plan(conn, sql.CLAIM_READY)
    # However many messages are delayed, only the earliest due is looked at.
    assert "SEARCH timers USING COVERING INDEX timers_by_due (due<?)" in plan, plan
    # The partial index of groups with a tenant: empty, and never written, without them.
    assert "SEARCH groups USING COVERING INDEX groups_by_tenant (tenant>?)" in plan, plan


def test_the_tenant_turn_reads_one_row_per_known_tenant(conn: sqlite3.Connection) -> None:
    plan = _plan(conn, sql.TENANT_TURN)
    scans = [line for line in plan if line.startswith("SCAN")]
    # `tenants` (t) once, and the few candidates (s) it yields, then sorted: a cost that
    # grows with the tenants, not with their groups or messages.
    assert sorted(scans) == ["SCAN CONSTANT ROW", "SCAN s", "SCAN t", "SCAN vtime"], plan
    assert any("groups_by_tenant (tenant=? AND busy_until=? AND paused=?" in p for p in plan)
