"""Helpers shared by the SQLite tests: a clock the test moves by hand, and ways to look at
a queue file from outside the transport under test (a separate, plain sqlite3 connection)."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

SIDECARS = ("-wal", "-shm", "-journal")


class FakeClock:
    """Epoch seconds that move only when the test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
