"""The seed design's claim, taken literally, for comparison: its two tables and the one
claim query that joins them, excludes busy groups with a ``NOT IN`` list and sorts."""

from __future__ import annotations

import sqlite3
from typing import Final

SCHEMA: Final = (
    """CREATE TABLE messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL, event TEXT NOT NULL,
        locked_by TEXT, lock_expiry REAL)""",
    """CREATE TABLE groups (
        group_id TEXT PRIMARY KEY, last_claimed_at REAL NOT NULL DEFAULT 0.0,
        priority INT NOT NULL DEFAULT 0)""",
)

CLAIM: Final = """
SELECT m.seq, m.group_id, m.event
  FROM messages m JOIN groups g ON g.group_id = m.group_id
 WHERE (m.locked_by IS NULL OR m.lock_expiry < ?)
   AND m.group_id NOT IN (
       SELECT group_id FROM messages WHERE locked_by IS NOT NULL AND lock_expiry >= ?)
   AND g.priority >= ?
 ORDER BY g.last_claimed_at ASC, m.seq ASC LIMIT 1
"""


def create(path: str, rows: list[tuple[str, str]], synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("BEGIN")
    for statement in SCHEMA:
        conn.execute(statement)
    conn.executemany("INSERT INTO messages (group_id, event) VALUES (?, ?)", rows)
    conn.executemany(
        "INSERT OR IGNORE INTO groups (group_id, priority) VALUES (?, 0)",
        [(group,) for group in dict.fromkeys(group for group, _ in rows)],
    )
    conn.execute("COMMIT")
    return conn


def claim_ack(conn: sqlite3.Connection, now: float, worker: str) -> bool:
    """One claim and one ack, as the seed does them; False when nothing was deliverable."""
    conn.execute("BEGIN IMMEDIATE")
    row = conn.execute(CLAIM, (now, now, 0)).fetchone()
    if row is None:
        conn.execute("COMMIT")
        return False
    seq, group_id, _ = row
    conn.execute("UPDATE groups SET last_claimed_at = ? WHERE group_id = ?", (now, group_id))
    conn.execute(
        "UPDATE messages SET locked_by = ?, lock_expiry = ? WHERE seq = ?", (worker, now + 30, seq)
    )
    conn.execute("COMMIT")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DELETE FROM messages WHERE seq = ?", (seq,))
    conn.execute(
        "DELETE FROM groups WHERE group_id = ? AND NOT EXISTS "
        "(SELECT 1 FROM messages WHERE group_id = ?)",
        (group_id, group_id),
    )
    conn.execute("COMMIT")
    return True
