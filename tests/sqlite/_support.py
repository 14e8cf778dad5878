"""Helpers shared by the SQLite tests: ways to look at a queue file from outside the
transport under test (a separate, plain sqlite3 connection). The clock the tests move by
hand is core's public `ManualClock`."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transports_sqlite import SqliteTransport

SIDECARS = ("-wal", "-shm", "-journal")


def query(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one read on ``path`` over a connection of its own."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


def snapshot(path: Path) -> tuple[list[tuple[Any, ...]], ...]:
    """Everything a write could change: the rows of every table, the seq counter among them."""
    return (
        query(path, "SELECT * FROM messages ORDER BY seq"),
        query(path, "SELECT * FROM groups ORDER BY group_id"),
        query(path, "SELECT * FROM seqs"),
        query(path, "SELECT * FROM dead_letters ORDER BY seq"),
        query(path, "SELECT * FROM requeued ORDER BY seq"),
    )


def message_count(path: Path) -> int:
    ((count,),) = query(path, "SELECT count(*) FROM messages")
    return int(count)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sidecars(path: Path) -> list[str]:
    """The journal files SQLite may leave beside ``path``."""
    return [path.name + suffix for suffix in SIDECARS if Path(f"{path}{suffix}").exists()]


def chain_problems(path: Path) -> list[str]:
    """What is wrong with the file's group chains: each group's chain must run from its
    head to its tail through exactly its messages, in seq order, and its depth must count
    them; every message must belong to a group that has a row. Empty when all is well."""
    with closing(sqlite3.connect(path)) as conn:
        groups = conn.execute("SELECT group_id, head_seq, tail_seq, depth FROM groups").fetchall()
        rows = conn.execute("SELECT seq, group_id, next_seq FROM messages").fetchall()
    next_of = {seq: next_seq for seq, _, next_seq in rows}
    members: dict[str, list[int]] = {}
    for seq, group_id, _ in sorted(rows):
        members.setdefault(group_id, []).append(seq)
    known = {group[0] for group in groups}
    problems = [
        f"messages {seqs} have no group {g!r}" for g, seqs in members.items() if g not in known
    ]
    for group_id, head, tail, depth in groups:
        walk: list[int] = []
        seq = head
        while seq is not None and seq in next_of and len(walk) <= len(rows):
            walk.append(seq)
            seq = next_of[seq]
        expected = members.get(group_id, [])
        if seq is not None:
            problems.append(f"group {group_id!r}: chain {walk} runs into {seq}, not a message")
        if walk != expected:
            problems.append(f"group {group_id!r}: chain {walk}, messages {expected}")
        if (tail, depth) != (expected[-1] if expected else None, len(expected)):
            problems.append(f"group {group_id!r}: tail {tail}, depth {depth} for {expected}")
    return problems


def traced(transport: SqliteTransport[Any]) -> list[str]:
    """The statements the transport runs from now on. SQLite reports a statement again
    at the start of each trigger program it runs, so a repeat in a row is the same one."""
    statements: list[str] = []
    conn = transport._engine.conn
    assert conn is not None

    def trace(statement: str) -> None:
        statement = " ".join(statement.split())
        if not statements or statements[-1] != statement:
            statements.append(statement)

    conn.set_trace_callback(trace)
    return statements
