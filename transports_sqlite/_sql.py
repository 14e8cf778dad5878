"""The SQLite schema and every statement the backend runs; nothing else.

`messages` is the truth: one row per unacked message, carrying its lease. `groups` is
derived from it by triggers (a row exists exactly while the group has messages; `head_seq`
is its oldest message; `busy_until` mirrors the head's lease or park), so that choosing the
next group is a walk of one small index instead of a scan of the backlog, whoever writes.

Named parameters only; every value reaches SQLite as a bound parameter.
"""

from __future__ import annotations

from functools import cache
from typing import Final

from transports_core._validate import MAX_PRIORITY

# "DTQ1": marks a file as ours, so that we never adopt or alter another application's
# database. SCHEMA_VERSION is stored in `user_version`; a file with another one is refused.
APPLICATION_ID: Final = 0x44545131
SCHEMA_VERSION: Final = 1

# Small pages: a claim or an ack rewrites a handful of pages (the message, its group,
# their index entries), and a WAL commit costs about as much per page as the bytes it
# writes; 1 KiB pages make each commit roughly twice as cheap as 4 KiB ones. Run before
# `setup`, outside any transaction, and only when the file is new.
NEW_FILE_PAGE_SIZE: Final = "PRAGMA page_size = 1024"

# Writes take the write lock up front (IMMEDIATE), so that claims in every process
# serialize and a transaction never has to upgrade a read lock (which can fail with BUSY).
# Reads (the admin interface) take none, so they also work on a read-only file.
BEGIN_WRITE: Final = "BEGIN IMMEDIATE"
BEGIN_READ: Final = "BEGIN"


@cache
def returns_rows(statement: str) -> bool:
    """Whether one of our statements produces rows (a query, or a write with RETURNING).
    The operations read only the rows of such a statement, never its row count, so a
    driver may fetch them in the same call that runs it."""
    return statement.lstrip().upper().startswith("SELECT") or "RETURNING" in statement.upper()


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
    # Free groups (busy_until NULL sorts first) in round-robin order within each priority,
    # then busy groups by when they come free. Claim seeks the first free group of each
    # priority at or above the floor; the wake-up seeks the lapsed ones. Neither walks
    # past busy groups or groups below the floor, so a claim costs the same at any backlog.
    "CREATE INDEX groups_by_turn ON groups (busy_until, priority, last_claimed_at, head_seq)",
    # A group row exists from its first publish; only that publish sets the priority. A
    # message inserted ahead of the head (a requeue) becomes the head. The WHEN skips the
    # common case (appending behind an existing head) with one seek instead of an upsert.
    """
    CREATE TRIGGER messages_insert_group AFTER INSERT ON messages
    WHEN NOT EXISTS (SELECT 1 FROM groups WHERE group_id = NEW.group_id AND head_seq < NEW.seq)
    BEGIN
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
    # Dead letters (opt-in, max_attempts): a message keeps its seq here, so that a requeue
    # puts it back in its original place. A dead letter that holds its group (on_dead=hold)
    # also stays in `messages` as the group's head, parked for ever (HELD): so a held dead
    # letter is exactly a seq present in both tables.
    """
    CREATE TABLE dead_letters (
        seq       INTEGER PRIMARY KEY,
        group_id  TEXT    NOT NULL,
        priority  INTEGER NOT NULL,
        event     TEXT    NOT NULL,
        attempts  INTEGER NOT NULL,     -- deliveries it had, none acked
        reason    TEXT    NOT NULL,
        dead_at   REAL    NOT NULL
    )
    """,
    "CREATE INDEX dead_letters_by_group ON dead_letters (group_id, seq)",
    # A requeued message keeps its attempt count (the fencing token must never repeat for a
    # seq), so max_attempts counts its deliveries from the attempts it had when requeued.
    "CREATE TABLE requeued (seq INTEGER PRIMARY KEY, attempts INTEGER NOT NULL)",
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)

PUBLISH: Final = """
INSERT INTO messages (group_id, priority, event) VALUES (:group_id, :priority, :event)
RETURNING seq
"""

# publish_many inserts with executemany (no RETURNING there). Inside one BEGIN IMMEDIATE
# transaction nobody else can insert, so AUTOINCREMENT hands out consecutive seqs ending
# at the last row inserted (the triggers' own inserts do not count: `groups` has no rowid).
PUBLISH_ROW: Final = """
INSERT INTO messages (group_id, priority, event) VALUES (?, ?, ?)
"""
LAST_SEQ: Final = "SELECT last_insert_rowid()"

# A lapsed lease or an elapsed park makes its group free again. Claim runs this first, so
# the seek below sees exactly the groups that are free at `now` (given a clock that does
# not run backwards). Only `groups` changes: the head keeps its lease columns, so a late
# ack, nack or extend by the lapsed worker still matches until someone re-claims it (and
# an extend makes the group busy again through the trigger).
WAKE_LAPSED: Final = "UPDATE groups SET busy_until = NULL WHERE busy_until < :now"


def _first_free(priority: int) -> str:
    return f"""SELECT last_claimed_at, head_seq FROM groups
               WHERE busy_until IS NULL AND priority = {priority} AND :min_priority <= {priority}"""


# The next free group at or above the floor, in round-robin order (oldest last claim,
# then oldest head); lease its head. Only a group's head is ever leased, so a free
# group's head is the message to deliver. One index seek per priority level, merged in
# order (a MERGE of sorted arms, no sort of its own), so neither busy groups nor groups
# below the floor are ever walked over.
CLAIM_HEAD: Final = f"""
UPDATE messages
   SET locked_by = :worker_id, lock_expiry = :expires_at, attempt = attempt + 1
 WHERE seq = (SELECT head_seq FROM (
                {" UNION ALL ".join(_first_free(p) for p in range(MAX_PRIORITY + 1))}
                ORDER BY 1, 2 LIMIT 1))
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


# --- dead letters -----------------------------------------------------------------------

# A held dead letter's lock_expiry: later than any `now`, so its group is never ready.
HELD: Final = float("inf")

# Deliveries a message had when it was last requeued (its max_attempts allowance starts
# there); no row: never requeued.
REQUEUED_ATTEMPTS: Final = "SELECT attempts FROM requeued WHERE seq = :seq"

# Run by the claim that would have delivered the message once too often, on the row it has
# just leased, in the same transaction: the dead letter records the deliveries that really
# happened (the claim's own increment is not one).
BURY: Final = """
INSERT INTO dead_letters (seq, group_id, priority, event, attempts, reason, dead_at)
SELECT seq, group_id, priority, event, :attempts, :reason, :now FROM messages WHERE seq = :seq
"""

# on_dead=release: the message leaves the queue; the delete trigger frees its group and
# moves the head on to the next message.
DROP_MESSAGE: Final = "DELETE FROM messages WHERE seq = :seq"

# on_dead=hold: the message stays its group's head, parked for ever, so that nothing later
# in the group is delivered and later publishes queue behind it. Its attempt goes back to
# the deliveries it had: no lease was handed out for the claim's increment.
HOLD_MESSAGE: Final = """
UPDATE messages SET locked_by = :parked, lock_expiry = :held, attempt = :attempts
 WHERE seq = :seq
"""

FORGET_REQUEUED: Final = "DELETE FROM requeued WHERE seq = :seq"

# Requeue history of acked messages is useless: trimmed at each requeue, not at each ack.
PRUNE_REQUEUED: Final = """
DELETE FROM requeued WHERE NOT EXISTS (SELECT 1 FROM messages WHERE messages.seq = requeued.seq)
"""

DEAD_LETTER: Final = """
SELECT group_id, attempts, EXISTS (SELECT 1 FROM messages WHERE seq = :seq)
  FROM dead_letters WHERE seq = :seq
"""

# A message may only become its group's head while no worker holds a lease in the group
# (lapsed leases included: they can still be acked or extended, which would free or renew
# the group under the new head's lease).
GROUP_LEASE_HOLDER: Final = """
SELECT locked_by FROM messages
 WHERE group_id = :group_id AND locked_by IS NOT NULL AND locked_by != :parked
 LIMIT 1
"""

# A held dead letter is still in `messages`: freeing it makes it deliverable again (the
# lease trigger frees the group).
UNHOLD_MESSAGE: Final = """
UPDATE messages SET locked_by = NULL, lock_expiry = NULL WHERE seq = :seq AND lock_expiry = :held
"""

# A released dead letter goes back under its own seq: the insert trigger makes it the
# head if it is older than the group's head (or creates the group with its priority).
RESTORE_MESSAGE: Final = """
INSERT INTO messages (seq, group_id, priority, event, attempt)
SELECT seq, group_id, priority, event, attempts FROM dead_letters WHERE seq = :seq
"""

MARK_REQUEUED: Final = """
INSERT INTO requeued (seq, attempts) VALUES (:seq, :attempts)
ON CONFLICT (seq) DO UPDATE SET attempts = excluded.attempts
"""

FORGET_DEAD_LETTER: Final = "DELETE FROM dead_letters WHERE seq = :seq"

# A held dead letter's row in `messages` (see HELD): discarding it frees its group.
DROP_HELD_MESSAGE: Final = "DELETE FROM messages WHERE seq = :seq AND lock_expiry = :held"

# --- admin --------------------------------------------------------------------------------

# Per group priority (the one claims filter on). A held dead letter is counted as dead
# only: its row in `messages` matches none of the three.
MESSAGE_COUNTS: Final = """
SELECT g.priority,
       count(*) FILTER (WHERE m.locked_by IS NULL OR m.lock_expiry < :now),
       count(*) FILTER (WHERE m.locked_by != :parked AND m.lock_expiry >= :now),
       count(*) FILTER (WHERE m.locked_by = :parked AND m.lock_expiry >= :now
                          AND m.lock_expiry < :held)
  FROM messages m JOIN groups g ON g.group_id = m.group_id
 GROUP BY g.priority
"""

DEAD_COUNTS: Final = "SELECT priority, count(*) FROM dead_letters GROUP BY priority"

DEEPEST_GROUPS: Final = """
SELECT g.group_id, g.priority, g.head_seq, g.last_claimed_at, h.locked_by, h.lock_expiry,
       (SELECT count(*) FROM messages m WHERE m.group_id = g.group_id) AS depth
  FROM groups g JOIN messages h ON h.seq = g.head_seq
 ORDER BY depth DESC, g.head_seq
 LIMIT :limit
"""

LIST_DEAD_LETTERS: Final = """
SELECT d.seq, d.group_id, d.priority, d.event, d.attempts, d.reason, d.dead_at,
       EXISTS (SELECT 1 FROM messages m WHERE m.seq = d.seq)
  FROM dead_letters d
 ORDER BY d.seq
 LIMIT :limit
"""

LIST_HELD_GROUPS: Final = """
SELECT d.group_id, d.seq, d.dead_at,
       (SELECT count(*) FROM messages w WHERE w.group_id = d.group_id) - 1
  FROM dead_letters d JOIN messages m ON m.seq = d.seq
 ORDER BY d.seq
"""

COUNT_HELD_IN_GROUP: Final = """
SELECT count(*) FROM messages WHERE group_id = :group_id AND lock_expiry = :held
"""
PURGE_GROUP_MESSAGES: Final = "DELETE FROM messages WHERE group_id = :group_id"
PURGE_GROUP_DEAD_LETTERS: Final = "DELETE FROM dead_letters WHERE group_id = :group_id"

# --- WAL housekeeping -----------------------------------------------------------------------

# Under load, journal_size_limit trims the WAL to this size whenever SQLite restarts it.
# The auto-checkpoint keeps it near 1,000 frames of a 1 KiB page plus a header each, a
# little over 1 MiB: the limit sits above that, so a normal cycle is never truncated.
WAL_LIMIT_BYTES: Final = 2 << 20
# When a claim finds nothing and the WAL is larger than this, the queue is idle: the WAL
# is checkpointed and truncated to nothing, without waiting for anybody.
IDLE_WAL_BYTES: Final = 64 << 10


CHECKPOINT_TRUNCATE: Final = "PRAGMA wal_checkpoint(TRUNCATE)"


def busy_timeout(milliseconds: int) -> str:
    """Set how long a statement waits for another connection's lock (whitelisted int)."""
    return f"PRAGMA busy_timeout = {int(milliseconds)}"


READ_JOURNAL_MODE: Final = "PRAGMA journal_mode"


def session_pragmas(synchronous: str, memory: bool, journal_mode: str) -> tuple[str, ...]:
    """Per-connection settings, run after `setup` (WAL must never be switched on in a file
    before we know it is ours: it rewrites the header). ``synchronous`` is whitelisted.

    ``journal_mode`` is the file's current mode. Switching to WAL needs a moment alone
    with the file (SQLite answers "database is locked" at once, without its busy handler,
    while another connection writes), and the mode persists in the file: so it is only
    switched on a file not yet in WAL, and the runner retries it like any contention."""
    if memory:
        wal: tuple[str, ...] = ()
    else:
        switch = () if journal_mode.lower() == "wal" else ("PRAGMA journal_mode = WAL",)
        wal = (*switch, f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    return (*wal, f"PRAGMA synchronous = {synchronous.upper()}")
