"""The SQLite schema and every statement the backend runs; nothing else.

`messages` is the truth: one row per unacked message, carrying its lease. `groups` is
derived from it by triggers (a row exists exactly while the group has messages; `head_seq`
is its oldest message; `busy_until` mirrors the head's lease or park), so that choosing the
next group is a walk of one small index instead of a scan of the backlog, whoever writes.

Named parameters only; every value reaches SQLite as a bound parameter.
"""

from __future__ import annotations

from typing import Final

# "DTQ1": marks a file as ours, so that we never adopt or alter another application's
# database. SCHEMA_VERSION is stored in `user_version`; a file with another one is refused.
APPLICATION_ID: Final = 0x44545131
SCHEMA_VERSION: Final = 1

READ_IDENTITY: Final = """
SELECT (SELECT count(*) FROM sqlite_master),
       (SELECT application_id FROM pragma_application_id),
       (SELECT user_version FROM pragma_user_version)
"""

SCHEMA: Final = (
    # seq is AUTOINCREMENT so that a seq is never reused: it is the lease's identity, and a
    # stale lease must never match a later message.
    """
    CREATE TABLE messages (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        group_id    TEXT    NOT NULL,
        priority    INTEGER NOT NULL,
        event       TEXT    NOT NULL,
        locked_by   TEXT,               -- worker holding the lease, '__parked__', or NULL
        lock_expiry REAL,               -- when that lease or park ends; NULL when free
        attempt     INTEGER NOT NULL DEFAULT 0  -- deliveries so far: the fencing token
    )
    """,
    # FIFO within a group, and the seek for a group's new head after an ack.
    "CREATE INDEX messages_by_group ON messages (group_id, seq)",
    """
    CREATE TABLE groups (
        group_id        TEXT    PRIMARY KEY,
        priority        INTEGER NOT NULL,
        last_claimed_at REAL    NOT NULL DEFAULT 0.0,   -- 0.0: never claimed, so served first
        head_seq        INTEGER NOT NULL,
        busy_until      REAL                            -- head's lease or park end; NULL: free
    ) WITHOUT ROWID
    """,
    # Round-robin order: claim walks this index and stops at the first ready group.
    "CREATE INDEX groups_by_turn ON groups (last_claimed_at, head_seq)",
    # A group row exists from its first publish; only that publish sets the priority. A
    # message inserted ahead of the head (a requeue) becomes the head.
    """
    CREATE TRIGGER messages_insert_group AFTER INSERT ON messages BEGIN
        INSERT INTO groups (group_id, priority, head_seq)
        VALUES (NEW.group_id, NEW.priority, NEW.seq)
        ON CONFLICT (group_id) DO UPDATE SET head_seq = excluded.head_seq
        WHERE excluded.head_seq < groups.head_seq;
    END
    """,
    # The group is busy exactly as long as its head's lease or park.
    """
    CREATE TRIGGER messages_lease_group AFTER UPDATE OF lock_expiry ON messages BEGIN
        UPDATE groups SET busy_until = NEW.lock_expiry WHERE group_id = NEW.group_id;
    END
    """,
    # Removing a message: a drained group disappears (its next publish sets a new
    # priority); otherwise the head moves on, and removing the leased message frees the group.
    """
    CREATE TRIGGER messages_delete_group AFTER DELETE ON messages BEGIN
        DELETE FROM groups WHERE group_id = OLD.group_id
            AND NOT EXISTS (SELECT 1 FROM messages WHERE group_id = OLD.group_id);
        UPDATE groups
           SET head_seq = (SELECT min(seq) FROM messages WHERE group_id = OLD.group_id),
               busy_until = CASE WHEN OLD.lock_expiry IS NULL THEN busy_until END
         WHERE group_id = OLD.group_id;
    END
    """,
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)

PUBLISH: Final = """
INSERT INTO messages (group_id, priority, event) VALUES (:group_id, :priority, :event)
RETURNING seq
"""

# publish_many inserts with executemany (no RETURNING there). Inside one BEGIN IMMEDIATE
# transaction nobody else can insert, so AUTOINCREMENT hands out consecutive seqs ending here.
PUBLISH_ROW: Final = """
INSERT INTO messages (group_id, priority, event) VALUES (?, ?, ?)
"""
LAST_SEQ: Final = "SELECT seq FROM sqlite_sequence WHERE name = 'messages'"

# The next group in round-robin order that is at or above the floor and has nothing
# leased or parked (a lapsed lease or an elapsed park counts as free); lease its head.
# Only a group's head is ever leased, so a ready group's head is the message to deliver.
CLAIM_HEAD: Final = """
UPDATE messages
   SET locked_by = :worker_id, lock_expiry = :expires_at, attempt = attempt + 1
 WHERE seq = (SELECT head_seq FROM groups
               WHERE priority >= :min_priority
                 AND (busy_until IS NULL OR busy_until < :now)
               ORDER BY last_claimed_at, head_seq
               LIMIT 1)
RETURNING seq, group_id, event, attempt
"""

# Just-served groups go to the back of the round-robin order.
MARK_CLAIMED: Final = "UPDATE groups SET last_claimed_at = :now WHERE group_id = :group_id"

# ack, nack and extend act only on the current lease: same seq, worker and attempt, not
# acked or nacked since. A re-claim after a lapse bumps attempt, so a stale worker matches
# no row and changes nothing.
ACK: Final = """
DELETE FROM messages WHERE seq = :seq AND locked_by = :worker_id AND attempt = :attempt
"""

RELEASE: Final = """
UPDATE messages SET locked_by = :locked_by, lock_expiry = :lock_expiry
 WHERE seq = :seq AND locked_by = :worker_id AND attempt = :attempt
"""

EXTEND: Final = """
UPDATE messages SET lock_expiry = :lock_expiry
 WHERE seq = :seq AND locked_by = :worker_id AND attempt = :attempt
"""


READ_JOURNAL_MODE: Final = "PRAGMA journal_mode"


def session_pragmas(synchronous: str, memory: bool, journal_mode: str) -> tuple[str, ...]:
    """Per-connection settings, run after `setup` (WAL must never be switched on in a file
    before we know it is ours: it rewrites the header). ``synchronous`` is whitelisted.

    ``journal_mode`` is the file's current mode. Setting WAL fails at once with "database
    is locked" (SQLite does not use the busy handler there) while another connection
    writes, so it is only set on a file not yet in WAL; the mode persists in the file."""
    wal = () if memory or journal_mode.lower() == "wal" else ("PRAGMA journal_mode = WAL",)
    return (*wal, f"PRAGMA synchronous = {synchronous.upper()}")
