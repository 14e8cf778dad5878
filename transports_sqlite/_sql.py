"""The SQLite schema and every statement the backend runs; nothing else.

`messages` holds one row per unacked message, in seq order, so that a publish appends at
the end of the table whatever its group. Each row points to the next message of its
group: a group's messages form a chain from its head (oldest) to its tail (newest).
`groups` holds one row per group that has messages: its head, tail and depth, the head's
lease or park, and its turn in the round-robin. Claim, nack and extend touch only
`groups`; ack deletes the head and a trigger moves the head along the chain. So choosing
the next group is a walk of one small index, never a scan of the backlog, and a claim
writes two pages whatever the backlog.
`keys` remembers each idempotency key a group used within the queue's window, with the
seq it published: a keyed publish is one more statement's worth of index seeks.
`timers` holds delayed messages outside every chain until they are due, when they are
promoted to the end of their group's chain; `paused` and `tenants` keep pauses and
tenants' weights and turns (see `_V6`). Each message in a chain knows when it became
ready, for the backlog's age in `stats` (see `_V7`).

Each statement is a `Statement`: its text, with ``:name`` for each parameter, the names of
those parameters, declared once beside it, and whether it returns rows. Every value
reaches SQLite as a bound parameter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

from transports_core.backend import MAX_PRIORITY, RESERVED_PREFIX

# "DTQ1": marks a file as ours, so that we never adopt or alter another application's
# database. SCHEMA_VERSION is stored in `user_version`; a file with another one is refused,
# except one at a version in `UPGRADES`, which is brought up to date when opened.
APPLICATION_ID: Final = 0x44545131
SCHEMA_VERSION: Final = 7

# The holder of a parked head, where a worker's id would be: inside core's reserved
# prefix, so no worker can hold a lease under this name.
PARKED: Final = RESERVED_PREFIX + "parked__"

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _binder(keys: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """A function of a mapping (or a tuple) to the tuple of its items at ``keys``."""
    if len(keys) > 1:
        return itemgetter(*keys)
    if keys:
        (key,) = keys
        return lambda values: (values[key],)
    return lambda values: ()


@dataclass(frozen=True, slots=True, eq=False)
class Statement:
    """A statement as data: ``text``, with ``:name`` for each parameter; the ``names`` of
    those parameters, in the order SQLite binds them; and whether it returns ``rows`` (a
    query, or a write with RETURNING), which a runner then fetches.

    sqlite3 binds a tuple for less than a mapping, and the statements on a worker's path
    run for every message. So SQLite runs `sql`, the text with each ``:name`` written
    ``?``, and `bind` turns the values an operation gives by name into the tuple that
    `sql` binds: a value for each of its ``places``, the names in the order they stand
    in the text, a name that stands twice given twice. (Not ``?N``, which
    would bind each value once: sqlite3 counts those as named, and Python 3.12 warns
    that binding them from a tuple is deprecated, an error from 3.14.) `spread` does the
    same for a tuple of values in the order of ``names``, as ``executemany`` rows are
    built. Raises ``ValueError`` unless ``names`` are exactly the text's parameters,
    each once."""

    text: str
    names: tuple[str, ...] = ()
    rows: bool = False
    sql: str = field(init=False, repr=False)
    places: tuple[str, ...] = field(init=False, repr=False)
    bind: Callable[[Mapping[str, Any]], tuple[Any, ...]] = field(init=False, repr=False)
    spread: Callable[[Sequence[Any]], tuple[Any, ...]] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        places = tuple(_NAMED.findall(self.text))
        if len(set(self.names)) != len(self.names) or set(places) != set(self.names):
            raise ValueError(
                f"parameters {sorted(set(places))} of the statement, named {self.names}"
            )
        object.__setattr__(self, "sql", _NAMED.sub("?", self.text))
        object.__setattr__(self, "places", places)
        object.__setattr__(self, "bind", _binder(places))
        index = [self.names.index(name) for name in places]
        spread = None if places == self.names else _binder(index)
        object.__setattr__(self, "spread", spread)

    def positional(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """``values``, in the order of ``names``, as `sql` binds them."""
        return tuple(values) if self.spread is None else self.spread(values)


# In WAL mode a commit costs about as much per page as the bytes it writes, and a claim
# or an ack writes two or three pages: 1 KiB pages keep those commits cheaper than 2 or
# 4 KiB ones, and a batch, which only appends, fills its pages in order. Run before
# `setup`, outside any transaction, and only when the file is new.
NEW_FILE_PAGE_SIZE: Final = Statement("PRAGMA page_size = 1024")

# Writes take the write lock up front (IMMEDIATE), so that claims in every process
# serialize and a transaction never has to upgrade a read lock (which can fail with BUSY).
# Reads (the admin interface) take none, so they also work on a read-only file.
BEGIN_WRITE: Final = "BEGIN IMMEDIATE"
BEGIN_READ: Final = "BEGIN"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"


READ_IDENTITY: Final = Statement(
    """
SELECT (SELECT count(*) FROM sqlite_master),
       (SELECT application_id FROM pragma_application_id),
       (SELECT user_version FROM pragma_user_version)
""",
    rows=True,
)

# The tables, views and triggers of version 3, which version 4 only adds to.
_SCHEMA_V3: Final = tuple(
    Statement(ddl)
    for ddl in (
        # In seq order: publishing appends (the cheap insert into a B-tree, whatever the
        # group), and a message is found by its seq alone. A group's order is its chain of
        # `next_seq`, so no second index has to be kept in group order on every write.
        """
    CREATE TABLE messages (
        seq         INTEGER PRIMARY KEY,
        group_id    TEXT    NOT NULL,
        priority    INTEGER NOT NULL,   -- as published; the group keeps its first one
        event       TEXT    NOT NULL,
        attempt     INTEGER NOT NULL DEFAULT 0,  -- deliveries before it last became a head
        next_seq    INTEGER             -- the group's next message; NULL for its tail
    )
    """,
        # Seqs are never reused: a seq is a lease's identity, and a stale lease must never
        # match a later message. The next seq is one above both the highest in `messages` and
        # `last`, the highest seq that ever left `messages` while it was the highest there.
        # So a publish only reads this row; the delete trigger writes it when the newest
        # message leaves.
        "CREATE TABLE seqs (last INTEGER NOT NULL)",
        "INSERT INTO seqs (last) VALUES (0)",
        """
    CREATE TABLE groups (
        group_id        TEXT    PRIMARY KEY,
        priority        INTEGER NOT NULL,
        last_claimed_at REAL    NOT NULL DEFAULT 0.0,   -- 0.0: never claimed, so served first
        head_seq        INTEGER NOT NULL,
        tail_seq        INTEGER NOT NULL,
        depth           INTEGER NOT NULL DEFAULT 1,     -- its messages, head included
        attempt         INTEGER NOT NULL DEFAULT 0,     -- the head's deliveries: the fencing token
        locked_by       TEXT,           -- worker holding the head's lease, '__parked__', or NULL
        lock_expiry     REAL,           -- when that lease or park ends; NULL when free
        busy_until      REAL            -- lock_expiry while it runs; NULL: free (or lapsed)
    ) WITHOUT ROWID
    """,
        # Free groups (busy_until NULL sorts first) in round-robin order within each priority,
        # then busy groups by when they come free. Claim seeks the first free group of each
        # priority at or above the floor; the wake-up seeks the lapsed ones. Neither walks
        # past busy groups or groups below the floor, so a claim costs the same at any backlog.
        "CREATE INDEX groups_by_turn ON groups (busy_until, priority, last_claimed_at, head_seq)",
        # One publish is one statement: an insert into this view, whose trigger links the
        # message behind its group's tail, stores it and opens or extends its group (the first
        # publish sets the priority). `publish_many` writes the same tables directly, once per
        # group and once per batch where it can, rather than running a trigger for every row.
        """
    CREATE VIEW publish (seq, group_id, priority, event) AS
    SELECT seq, group_id, priority, event FROM messages WHERE 0
    """,
        """
    CREATE TRIGGER publish_message INSTEAD OF INSERT ON publish BEGIN
        UPDATE messages SET next_seq = NEW.seq
         WHERE seq = (SELECT tail_seq FROM groups WHERE group_id = NEW.group_id);
        INSERT INTO messages (seq, group_id, priority, event)
        VALUES (NEW.seq, NEW.group_id, NEW.priority, NEW.event);
        INSERT INTO groups (group_id, priority, head_seq, tail_seq)
        VALUES (NEW.group_id, NEW.priority, NEW.seq, NEW.seq)
        ON CONFLICT (group_id) DO UPDATE SET tail_seq = excluded.tail_seq, depth = depth + 1;
    END
    """,
        # Removing a message: an ack, or a dead letter leaving. If it was its group's head, the
        # next message in the chain becomes the head, free, with the deliveries it already had.
        # A group's last message takes the group with it (its next publish sets a new
        # priority). The highest seq in `messages` is always some group's last, so only then
        # may `seqs.last` have to remember it. A purge removes the group first, so its
        # messages can go in any order.
        """
    CREATE TRIGGER head_removed AFTER DELETE ON messages WHEN OLD.next_seq IS NOT NULL BEGIN
        UPDATE groups
           SET head_seq = OLD.next_seq, depth = depth - 1,
               attempt = (SELECT attempt FROM messages WHERE seq = OLD.next_seq),
               locked_by = NULL, lock_expiry = NULL, busy_until = NULL
         WHERE group_id = OLD.group_id AND head_seq = OLD.seq;
    END
    """,
        """
    CREATE TRIGGER last_removed AFTER DELETE ON messages WHEN OLD.next_seq IS NULL BEGIN
        DELETE FROM groups WHERE group_id = OLD.group_id AND head_seq = OLD.seq;
        UPDATE seqs SET last = OLD.seq
         WHERE last < OLD.seq AND NOT EXISTS (SELECT 1 FROM messages WHERE seq > OLD.seq);
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
        """
    CREATE TABLE requeued (
        seq      INTEGER PRIMARY KEY,
        group_id TEXT    NOT NULL,
        attempts INTEGER NOT NULL
    )
    """,
    )
)

# How many expired keys a keyed publish forgets, on its way: those expiring no later than
# the FORGET_PER_PUBLISH-th oldest, all found through `keys_by_expiry` (so a few more only
# when several share that expiry, as a batch's keys do). Never a sweep; and as each publish
# that remembers a key can forget several, the table does not outgrow the window.
FORGET_PER_PUBLISH: Final = 8

# Idempotency keys: version 4 added them, version 5 ordered `keys` by key first.
_KEYS_SCHEMA: Final = tuple(
    Statement(ddl)
    for ddl in (
        # One row per (group, key) used within the window: the seq it published (which may
        # have been acked, buried or purged since) and when the key is forgotten. A row past
        # its expiry counts as absent until it is deleted or overwritten. The primary key
        # is what makes racing publishes of one key store one message. It leads with the
        # key, not the group: a batch spread over many groups whose keys follow one another
        # (counters, timestamps, ULIDs) then writes its keys side by side, in a few pages,
        # instead of a page in each group's stretch of the table.
        """
    CREATE TABLE keys (
        group_id   TEXT    NOT NULL,
        key        TEXT    NOT NULL,
        seq        INTEGER NOT NULL,
        expires_at REAL    NOT NULL,
        PRIMARY KEY (key, group_id)
    ) WITHOUT ROWID
    """,
        "CREATE INDEX keys_by_expiry ON keys (expires_at)",
        # A keyed publish is one statement too: an insert into this view. Its trigger forgets
        # a few expired keys, then claims the key for the new seq: inserted, or taken over
        # from an expired row; a live row keeps its seq and the upsert changes nothing. Only
        # when it changed a row is the message published, through `publish`'s own trigger.
        # The insert's RETURNING reads the key's seq after the trigger ran: the new seq, or
        # the original one of a duplicate.
        """
    CREATE VIEW publish_keyed (seq, group_id, priority, event, key, now, expires_at) AS
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0
    """,
        f"""
    CREATE TRIGGER publish_keyed_message INSTEAD OF INSERT ON publish_keyed BEGIN
        DELETE FROM keys WHERE expires_at <= (
            SELECT max(expires_at) FROM (
                SELECT expires_at FROM keys WHERE expires_at <= NEW.now
                 ORDER BY expires_at LIMIT {FORGET_PER_PUBLISH}));
        INSERT INTO keys (group_id, key, seq, expires_at)
        VALUES (NEW.group_id, NEW.key, NEW.seq, NEW.expires_at)
        ON CONFLICT (group_id, key) DO UPDATE
        SET seq = excluded.seq, expires_at = excluded.expires_at WHERE expires_at <= NEW.now;
        INSERT INTO publish (seq, group_id, priority, event)
        SELECT NEW.seq, NEW.group_id, NEW.priority, NEW.event WHERE changes() = 1;
    END
    """,
    )
)

# The highest seq handed out so far (see `seqs`): two seeks, no write.
_LAST_SEQ = "SELECT max(last, coalesce((SELECT max(seq) FROM messages), 0)) FROM seqs"

# Version 6: delayed messages, paused groups and tenants. Run on a new file after the
# older versions' DDL, and as the upgrade of a version 5 file (nothing stored changes:
# columns are added with their defaults, and views, triggers and one index are rebuilt).
_V6: Final = tuple(
    Statement(ddl)
    for ddl in (
        # A message published with hold=True takes its place in its chain at once, with
        # its not-before time here; NULL for every other message. While such a message is
        # its group's head and not due, the group is parked until `due`, as a nack's
        # delay parks it. The partial index holds only those rows, for `stats`.
        "ALTER TABLE messages ADD COLUMN due REAL",
        "CREATE INDEX messages_held ON messages (due) WHERE due IS NOT NULL",
        # `paused` mirrors `paused_groups` on the group's row, so that a claim's seek
        # skips a paused group as it skips a busy one. `tenant` is set by the publish
        # that opens the group; NULL: none.
        "ALTER TABLE groups ADD COLUMN paused INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE groups ADD COLUMN tenant TEXT",
        "DROP INDEX groups_by_turn",
        """
    CREATE INDEX groups_by_turn
        ON groups (busy_until, paused, priority, last_claimed_at, head_seq)
    """,
        # The same turn order per tenant, for the groups that have one only: a queue
        # without tenants keeps this index empty and never writes to it.
        """
    CREATE INDEX groups_by_tenant
        ON groups (tenant, busy_until, paused, priority, last_claimed_at, head_seq)
     WHERE tenant IS NOT NULL
    """,
        # Whatever opens a group (a publish, a batch, a promotion, a requeue) opens it
        # paused if a pause is stored for it. Only a new row runs this; a publish that
        # extends its group pays nothing.
        """
    CREATE TRIGGER group_opened AFTER INSERT ON groups
    WHEN EXISTS (SELECT 1 FROM paused WHERE group_id = NEW.group_id)
    BEGIN
        UPDATE groups SET paused = 1 WHERE group_id = NEW.group_id;
    END
    """,
        # Delayed messages without hold, kept out of every chain until due: then they are
        # promoted (see `promote`) to the end of their group's chain, in (due, seq) order.
        # Their seqs are handed out like any other (a publish that stores one raises
        # `seqs.last` to it), so a seq is never reused.
        """
    CREATE TABLE timers (
        seq      INTEGER PRIMARY KEY,
        group_id TEXT    NOT NULL,
        priority INTEGER NOT NULL,
        event    TEXT    NOT NULL,
        tenant   TEXT,
        due      REAL    NOT NULL
    )
    """,
        # A claim looks at the earliest due only; a publish at its own group's.
        "CREATE INDEX timers_by_due ON timers (due, seq)",
        "CREATE INDEX timers_by_group ON timers (group_id, due, seq)",
        # Pauses, stored apart from `groups` so that they outlast a group's draining.
        "CREATE TABLE paused (group_id TEXT PRIMARY KEY) WITHOUT ROWID",
        # Tenants that ever opened a group or were given a weight: weight NULL means
        # never set (1); pass is the tenant's place in the weighted turn. '' stands for
        # the groups without a tenant (a tenant's name is never empty).
        """
    CREATE TABLE tenants (
        tenant TEXT PRIMARY KEY,
        weight INTEGER,
        pass   REAL NOT NULL DEFAULT 0
    ) WITHOUT ROWID
    """,
        "CREATE TABLE vtime (v REAL NOT NULL)",
        "INSERT INTO vtime (v) VALUES (0)",
        "DROP TRIGGER publish_keyed_message",
        "DROP VIEW publish_keyed",
        "DROP VIEW publish",
        "DROP TRIGGER head_removed",
        # Promoting a due timer: it joins the end of its group's chain as if published
        # now, opening the group (never claimed, with its own priority, tenant and any
        # pause) when there is none. A promoted seq can be lower than the tail's, so the
        # highest seq in `messages` may stop being a tail: `seqs.last` keeps it.
        """
    CREATE VIEW promote (seq, group_id, priority, event, tenant) AS
    SELECT seq, group_id, priority, event, tenant FROM timers WHERE 0
    """,
        """
    CREATE TRIGGER promote_timer INSTEAD OF INSERT ON promote BEGIN
        UPDATE seqs SET last = max(last, coalesce((SELECT max(seq) FROM messages), 0));
        UPDATE messages SET next_seq = NEW.seq
         WHERE seq = (SELECT tail_seq FROM groups WHERE group_id = NEW.group_id);
        INSERT INTO messages (seq, group_id, priority, event)
        VALUES (NEW.seq, NEW.group_id, NEW.priority, NEW.event);
        INSERT INTO groups (group_id, priority, head_seq, tail_seq, tenant)
        VALUES (NEW.group_id, NEW.priority, NEW.seq, NEW.seq, NEW.tenant)
        ON CONFLICT (group_id) DO UPDATE SET tail_seq = excluded.tail_seq, depth = depth + 1;
        INSERT INTO tenants (tenant) SELECT NEW.tenant WHERE NEW.tenant IS NOT NULL
        ON CONFLICT (tenant) DO NOTHING;
        DELETE FROM timers WHERE seq = NEW.seq;
    END
    """,
        # A group's due timers, promoted in (due, seq) order. An insert of one row into
        # this view costs a publish only the seek of its WHEN while none is due (an
        # INSERT ... SELECT into `promote` would build a temporary table every time).
        """
    CREATE VIEW promote_group (group_id, now) AS SELECT NULL, NULL WHERE 0
    """,
        """
    CREATE TRIGGER promote_group_timers INSTEAD OF INSERT ON promote_group
    WHEN EXISTS (SELECT 1 FROM timers WHERE group_id = NEW.group_id AND due <= NEW.now)
    BEGIN
        INSERT INTO promote (seq, group_id, priority, event, tenant)
        SELECT seq, group_id, priority, event, tenant FROM timers
         WHERE group_id = NEW.group_id AND due <= NEW.now ORDER BY due, seq;
    END
    """,
        # A publish first promotes its own group's due timers, so that it lands behind
        # them; then it links the message behind its group's tail, stores it and opens
        # or extends its group (the first publish sets the priority, and a group opened
        # while paused is paused).
        """
    CREATE VIEW publish (seq, group_id, priority, event, now) AS
    SELECT seq, group_id, priority, event, NULL FROM messages WHERE 0
    """,
        """
    CREATE TRIGGER publish_message INSTEAD OF INSERT ON publish BEGIN
        INSERT INTO promote_group (group_id, now) VALUES (NEW.group_id, NEW.now);
        UPDATE messages SET next_seq = NEW.seq
         WHERE seq = (SELECT tail_seq FROM groups WHERE group_id = NEW.group_id);
        INSERT INTO messages (seq, group_id, priority, event)
        VALUES (NEW.seq, NEW.group_id, NEW.priority, NEW.event);
        INSERT INTO groups (group_id, priority, head_seq, tail_seq)
        VALUES (NEW.group_id, NEW.priority, NEW.seq, NEW.seq)
        ON CONFLICT (group_id) DO UPDATE SET tail_seq = excluded.tail_seq, depth = depth + 1;
    END
    """,
        """
    CREATE VIEW publish_keyed (seq, group_id, priority, event, key, now, expires_at) AS
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0
    """,
        f"""
    CREATE TRIGGER publish_keyed_message INSTEAD OF INSERT ON publish_keyed BEGIN
        DELETE FROM keys WHERE expires_at <= (
            SELECT max(expires_at) FROM (
                SELECT expires_at FROM keys WHERE expires_at <= NEW.now
                 ORDER BY expires_at LIMIT {FORGET_PER_PUBLISH}));
        INSERT INTO keys (group_id, key, seq, expires_at)
        VALUES (NEW.group_id, NEW.key, NEW.seq, NEW.expires_at)
        ON CONFLICT (key, group_id) DO UPDATE
        SET seq = excluded.seq, expires_at = excluded.expires_at WHERE expires_at <= NEW.now;
        INSERT INTO publish (seq, group_id, priority, event, now)
        SELECT NEW.seq, NEW.group_id, NEW.priority, NEW.event, NEW.now WHERE changes() = 1;
    END
    """,
        # As before, and a new head published with hold=True that is not due parks its
        # group until then (one due in the past is freed by the next claim's wake-up).
        f"""
    CREATE TRIGGER head_removed AFTER DELETE ON messages WHEN OLD.next_seq IS NOT NULL BEGIN
        UPDATE groups
           SET head_seq = OLD.next_seq, depth = depth - 1,
               (attempt, locked_by, lock_expiry, busy_until) = (
                   SELECT attempt, CASE WHEN due IS NULL THEN NULL ELSE '{PARKED}' END,
                          due, due
                     FROM messages WHERE seq = OLD.next_seq)
         WHERE group_id = OLD.group_id AND head_seq = OLD.seq;
    END
    """,
    )
)

# The upgrade's own time, for the rows it finds (see `_V7`): the transport's clock when an
# open upgrades, bound as ``:now``; SQLite's (the system's) in the script that
# `transports migrate --sql` prints, which runs without bound values (see `script`).
SCRIPT_VALUES: Final = {"now": "((julianday('now') - 2440587.5) * 86400.0)"}


def script(statement: Statement) -> str:
    """``statement``'s text as a script runs it: each parameter written as the SQL of
    `SCRIPT_VALUES`. Raises ``KeyError`` for a parameter a script cannot know."""
    return _NAMED.sub(lambda match: SCRIPT_VALUES[match[1]], statement.text).strip()


# Version 7: when each message in a chain became ready, and its group's priority, for the
# backlog's age in `stats`. Run on a new file after the older versions' DDL, and as the
# upgrade of a version 6 file, with `_STAMP_READY`.
_V7: Final = tuple(
    Statement(ddl)
    for ddl in (
        # ready_at: when it was published, came due (a delayed message: its due time,
        # whether it waited in `timers` or in its chain with hold=True), or was requeued
        # (a dead letter). A lapsed lease, a nack's park or a claim leaves it alone.
        # group_priority: its group's priority when it joined the chain, which is the
        # group's for as long as the message is in it (a group keeps its priority until
        # its last message leaves); `stats` counts by it, as by `groups.priority`. Adding
        # a column with a constant default rewrites no row.
        "ALTER TABLE messages ADD COLUMN ready_at REAL NOT NULL DEFAULT 0",
        "ALTER TABLE messages ADD COLUMN group_priority INTEGER NOT NULL DEFAULT 0",
        # The oldest ready message of a priority is the first row of this index, at that
        # priority, that is neither a busy head nor a hold=True message not yet due: a
        # walk past the busy heads older than it, never a scan of the backlog. A publish
        # appends to it (its ready_at is the latest yet, at its priority) and an ack
        # removes an old entry: one page more per write, not a search.
        "CREATE INDEX messages_by_ready ON messages (group_priority, ready_at)",
        # Promotion: as in version 6, and the timer's due time is when it became ready.
        "DROP TRIGGER promote_group_timers",
        "DROP TRIGGER promote_timer",
        "DROP VIEW promote",
        """
    CREATE VIEW promote (seq, group_id, priority, event, tenant, due) AS
    SELECT seq, group_id, priority, event, tenant, due FROM timers WHERE 0
    """,
        """
    CREATE TRIGGER promote_timer INSTEAD OF INSERT ON promote BEGIN
        UPDATE seqs SET last = max(last, coalesce((SELECT max(seq) FROM messages), 0));
        UPDATE messages SET next_seq = NEW.seq
         WHERE seq = (SELECT tail_seq FROM groups WHERE group_id = NEW.group_id);
        INSERT INTO messages (seq, group_id, priority, event, ready_at, group_priority)
        VALUES (NEW.seq, NEW.group_id, NEW.priority, NEW.event, NEW.due,
                coalesce((SELECT priority FROM groups WHERE group_id = NEW.group_id),
                         NEW.priority));
        INSERT INTO groups (group_id, priority, head_seq, tail_seq, tenant)
        VALUES (NEW.group_id, NEW.priority, NEW.seq, NEW.seq, NEW.tenant)
        ON CONFLICT (group_id) DO UPDATE SET tail_seq = excluded.tail_seq, depth = depth + 1;
        INSERT INTO tenants (tenant) SELECT NEW.tenant WHERE NEW.tenant IS NOT NULL
        ON CONFLICT (tenant) DO NOTHING;
        DELETE FROM timers WHERE seq = NEW.seq;
    END
    """,
        """
    CREATE TRIGGER promote_group_timers INSTEAD OF INSERT ON promote_group
    WHEN EXISTS (SELECT 1 FROM timers WHERE group_id = NEW.group_id AND due <= NEW.now)
    BEGIN
        INSERT INTO promote (seq, group_id, priority, event, tenant, due)
        SELECT seq, group_id, priority, event, tenant, due FROM timers
         WHERE group_id = NEW.group_id AND due <= NEW.now ORDER BY due, seq;
    END
    """,
        # A publish: as in version 6, and it is ready from its publish's `now`.
        "DROP TRIGGER publish_message",
        """
    CREATE TRIGGER publish_message INSTEAD OF INSERT ON publish BEGIN
        INSERT INTO promote_group (group_id, now) VALUES (NEW.group_id, NEW.now);
        UPDATE messages SET next_seq = NEW.seq
         WHERE seq = (SELECT tail_seq FROM groups WHERE group_id = NEW.group_id);
        INSERT INTO messages (seq, group_id, priority, event, ready_at, group_priority)
        VALUES (NEW.seq, NEW.group_id, NEW.priority, NEW.event, NEW.now,
                coalesce((SELECT priority FROM groups WHERE group_id = NEW.group_id),
                         NEW.priority));
        INSERT INTO groups (group_id, priority, head_seq, tail_seq)
        VALUES (NEW.group_id, NEW.priority, NEW.seq, NEW.seq)
        ON CONFLICT (group_id) DO UPDATE SET tail_seq = excluded.tail_seq, depth = depth + 1;
    END
    """,
    )
)

# The upgrade to version 7 stamps the messages it finds, before the index is built from
# them: their group's priority, and as ready since the upgrade (the time they really
# became ready was never stored), except a hold=True message not yet due, which becomes
# ready at its due time.
_STAMP_READY: Final = Statement(
    """
UPDATE messages
   SET ready_at = max(coalesce(due, :now), :now),
       group_priority = coalesce(
           (SELECT priority FROM groups g WHERE g.group_id = messages.group_id), priority)
""",
    ("now",),
)

SCHEMA: Final = (
    *_SCHEMA_V3,
    *_KEYS_SCHEMA,
    *_V6,
    *_V7,
    Statement(f"PRAGMA application_id = {APPLICATION_ID}"),
    Statement(f"PRAGMA user_version = {SCHEMA_VERSION}"),
)

# Version 4 to 5: `keys` rebuilt in its new order, the keys it holds kept. The view and
# its trigger go first (renaming a table rewrites the triggers that name it), and come
# back with the new table.
_KEYS_V4_TO_V5: Final = (
    Statement("DROP TRIGGER publish_keyed_message"),
    Statement("DROP VIEW publish_keyed"),
    Statement("DROP INDEX keys_by_expiry"),
    Statement("ALTER TABLE keys RENAME TO keys_v4"),
    *_KEYS_SCHEMA,
    Statement(
        "INSERT INTO keys (group_id, key, seq, expires_at) "
        "SELECT group_id, key, seq, expires_at FROM keys_v4"
    ),
    Statement("DROP TABLE keys_v4"),
)

# What brings a queue at an older version up to SCHEMA_VERSION, by that version, run in
# one write transaction (SQLite's DDL is transactional), so that a crash leaves the old
# version whole and the next open upgrades again. The stamp goes between the columns and
# the index (`_V7`'s first two statements, then the rest), so the index is built once.
_UP_TO_DATE: Final = Statement(f"PRAGMA user_version = {SCHEMA_VERSION}")
_TO_V7: Final = (*_V7[:2], _STAMP_READY, *_V7[2:], _UP_TO_DATE)
UPGRADES: Final = {
    3: (*_KEYS_SCHEMA, *_V6, *_TO_V7),
    4: (*_KEYS_V4_TO_V5, *_V6, *_TO_V7),
    5: (*_V6, *_TO_V7),
    6: _TO_V7,
}

# A publish adds one to the highest seq handed out; publish_many reads it first to number
# its batch.
LAST_SEQ: Final = Statement(_LAST_SEQ, rows=True)

# RETURNING gives back the row as inserted into the view: the seq computed here, under
# the write lock that the statement holds from its start.
PUBLISH: Final = Statement(
    f"""
INSERT INTO publish (seq, group_id, priority, event, now)
VALUES (({_LAST_SEQ}) + 1, :group_id, :priority, :event, :now)
RETURNING seq
""",
    ("group_id", "priority", "event", "now"),
    rows=True,
)

# A keyed publish (see `publish_keyed`): its seq, and the seq its key points to once the
# trigger ran: the same, or the original message's when the key was live (a duplicate,
# which stored nothing).
PUBLISH_KEYED: Final = Statement(
    f"""
INSERT INTO publish_keyed (seq, group_id, priority, event, key, now, expires_at)
VALUES (({_LAST_SEQ}) + 1, :group_id, :priority, :event, :key, :now, :expires_at)
RETURNING seq, (SELECT seq FROM keys WHERE group_id = :group_id AND key = :key)
""",
    ("group_id", "priority", "event", "key", "now", "expires_at"),
    rows=True,
)

# publish_many with keys, under the write lock it holds from its start. It remembers each
# distinct key of the batch with the seq it would publish if none were live, before it
# stores any message: a new row, or one taking over an expired row; a live row is left
# as it is, and not counted in the row count. So when the count is the number of keys,
# which is the usual case, none was live and the batch is stored as numbered.
REMEMBER_KEY: Final = Statement(
    """
INSERT INTO keys (group_id, key, seq, expires_at) VALUES (:group_id, :key, :seq, :expires_at)
ON CONFLICT (key, group_id) DO UPDATE SET seq = excluded.seq, expires_at = excluded.expires_at
 WHERE expires_at <= :now
""",
    ("group_id", "key", "seq", "expires_at", "now"),
)
# Otherwise it reads the live keys among the batch's (group, key) pairs, given as a JSON
# array of pairs: those whose row still holds a seq from before the batch. One seek per
# pair; the pairs themselves are the batch's own parameter, not a table.
LIVE_KEYS: Final = Statement(
    """
SELECT k.group_id, k.key, k.seq
  FROM json_each(:pairs) AS j
  JOIN keys k ON k.key = json_extract(j.value, '$[1]')
             AND k.group_id = json_extract(j.value, '$[0]')
 WHERE k.seq < :first
""",
    ("pairs", "first"),
    rows=True,
)
# And numbers the batch again without the duplicates: the keys it remembered move to
# their messages' new seqs.
RENUMBER_KEY: Final = Statement(
    "UPDATE keys SET seq = :seq WHERE key = :key AND group_id = :group_id",
    ("seq", "key", "group_id"),
)
# Before all that, it forgets as many expired keys as it may remember and a few more,
# through the expiry index: the same bounded delete as a keyed publish's, never a sweep.
FORGET_EXPIRED: Final = Statement(
    """
DELETE FROM keys WHERE expires_at <= (
    SELECT max(expires_at) FROM (
        SELECT expires_at FROM keys WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit))
""",
    ("now", "limit"),
)

# publish_many, in one write transaction: read where the batch's seqs start (LAST_SEQ);
# link each group's first message in the batch behind the group's tail; open the groups
# the batch brings, or move the tails of those it extends (an existing group keeps its
# head and priority, as every new seq is behind its head); then append the rows, each
# already pointing to the next message of its group in the batch. (A batch gives each
# row's values as a tuple in the order of `names`.)
LINK_TAIL: Final = Statement(
    """
UPDATE messages SET next_seq = :next_seq
 WHERE seq = (SELECT tail_seq FROM groups WHERE group_id = :group_id)
""",
    ("next_seq", "group_id"),
)
# A group the batch opens takes the tenant of its first message in the batch (and any
# pause stored for it: `group_opened`) and, when that message was published with
# hold=True, a park until its due time.
OPEN_GROUP: Final = Statement(
    f"""
INSERT INTO groups (group_id, priority, head_seq, tail_seq, depth, tenant,
                    locked_by, lock_expiry, busy_until)
VALUES (:group_id, :priority, :head_seq, :tail_seq, :depth, :tenant,
        CASE WHEN :due IS NULL THEN NULL ELSE '{PARKED}' END, :due, :due)
ON CONFLICT (group_id) DO UPDATE
SET tail_seq = excluded.tail_seq, depth = depth + excluded.depth
""",
    ("group_id", "priority", "head_seq", "tail_seq", "depth", "tenant", "due"),
)
# Each is ready from the batch's `now`, or from its due time if it has one (hold=True);
# its group is open by now (OPEN_GROUP ran first), and lends it its priority.
INSERT_ROW: Final = Statement(
    """
INSERT INTO messages (seq, group_id, priority, event, next_seq, due, ready_at, group_priority)
VALUES (:seq, :group_id, :priority, :event, :next_seq, :due, :ready_at,
        coalesce((SELECT priority FROM groups WHERE group_id = :group_id), :priority))
""",
    ("seq", "group_id", "priority", "event", "next_seq", "due", "ready_at"),
)
# A batch's delayed messages without hold wait here until due, out of every chain.
INSERT_TIMER: Final = Statement(
    """
INSERT INTO timers (seq, group_id, priority, event, tenant, due)
VALUES (:seq, :group_id, :priority, :event, :tenant, :due)
""",
    ("seq", "group_id", "priority", "event", "tenant", "due"),
)
# A seq stored only in `timers` must still count as handed out.
RAISE_LAST_SEQ: Final = Statement("UPDATE seqs SET last = max(last, :seq)", ("seq",))
# A tenant is known from the publish that first names it (its pass starts at 0).
REGISTER_TENANT: Final = Statement(
    "INSERT INTO tenants (tenant) VALUES (:tenant) ON CONFLICT (tenant) DO NOTHING",
    ("tenant",),
)
# Whether any timer is due: a batch promotes its groups' due timers only then.
ANY_DUE: Final = Statement(
    "SELECT EXISTS (SELECT 1 FROM timers WHERE due <= :now)", ("now",), rows=True
)
# A group's due timers join its chain, in (due, seq) order, before a batch appends to it.
PROMOTE_GROUP: Final = Statement(
    "INSERT INTO promote_group (group_id, now) VALUES (:group_id, :now)",
    ("group_id", "now"),
)
# How many due timers a claim promotes: the earliest due, so a backlog of them drains in
# order over a few claims, and no claim does more than this much of that work.
PROMOTE_PER_CLAIM: Final = 100
PROMOTE_DUE: Final = Statement(
    f"""
INSERT INTO promote (seq, group_id, priority, event, tenant, due)
SELECT seq, group_id, priority, event, tenant, due FROM timers
 WHERE due <= :now ORDER BY due, seq LIMIT {PROMOTE_PER_CLAIM}
""",
    ("now",),
)

# A lapsed lease or an elapsed park makes its group free again. Only `busy_until` changes:
# the lease columns stay, so a late ack, nack or extend by the lapsed worker still matches
# until someone re-claims the group (an extend makes it busy again).
WAKE_LAPSED: Final = Statement(
    "UPDATE groups SET busy_until = NULL WHERE busy_until < :now", ("now",)
)


def _first_free(priority: int, tenant: str = "") -> str:
    return f"""SELECT last_claimed_at, head_seq, group_id FROM groups
               WHERE busy_until IS NULL AND paused = 0{tenant}
                 AND priority = {priority} AND :min_priority <= {priority}"""


def _next_free(tenant: str = "") -> str:
    arms = " UNION ALL ".join(_first_free(p, tenant) for p in range(MAX_PRIORITY + 1))
    return f"SELECT group_id FROM ({arms} ORDER BY 1, 2 LIMIT 1)"


_NEXT_FREE = _next_free()


def _claim(target: str, guard: str = "") -> str:
    # The group is leased and goes to the back of the round-robin order; its head's event
    # comes back with it.
    return f"""
UPDATE groups
   SET locked_by = :worker_id, lock_expiry = :expires_at, busy_until = :expires_at,
       attempt = attempt + 1, last_claimed_at = :now
 WHERE group_id = {target}{guard}
RETURNING head_seq, group_id,
          (SELECT event FROM messages WHERE seq = groups.head_seq),
          attempt
"""


# The claim's one statement in the common case: no lease or park has lapsed (so the
# wake-up would change nothing), no delayed message is due (nothing to promote), no group
# has a tenant (no weighted turn to take), and the next free, unpaused group at or above
# the floor, in round-robin order (oldest last claim, then oldest head), has had fewer than
# ``max_attempts`` deliveries (so it cannot be due for burial). That group is found by one
# index seek per priority level, merged in order (no sort of its own), so neither busy
# groups nor groups below the floor are walked over. When either guard fails it claims
# nothing, and the claim goes on: wake-up, then NEXT_FREE and CLAIM_GROUP, burying on the way.
CLAIM_READY: Final = Statement(
    _claim(
        f"({_NEXT_FREE})",
        """
   AND NOT EXISTS (SELECT 1 FROM groups WHERE busy_until < :now)
   AND NOT EXISTS (SELECT 1 FROM timers WHERE due <= :now)
   AND NOT EXISTS (SELECT 1 FROM groups WHERE tenant IS NOT NULL)
   AND attempt < :max_attempts""",
    ),
    ("worker_id", "expires_at", "min_priority", "now", "max_attempts"),
    rows=True,
)

# The slow path: look at the next free group before leasing it, so that a head out of
# attempts is buried as it was left (how its last delivery ended is in `locked_by`).
NEXT_FREE: Final = Statement(
    f"""
SELECT g.group_id, g.head_seq, g.attempt, g.locked_by,
       (SELECT attempts FROM requeued WHERE seq = g.head_seq)
  FROM groups g WHERE g.group_id = ({_NEXT_FREE})
""",
    ("min_priority",),
    rows=True,
)
CLAIM_GROUP: Final = Statement(
    _claim(":group_id"), ("worker_id", "expires_at", "now", "group_id"), rows=True
)

# With tenants: whether any group has one (a seek of the partial index, empty without).
ANY_TENANT: Final = Statement(
    "SELECT EXISTS (SELECT 1 FROM groups WHERE tenant IS NOT NULL)", rows=True
)
# The tenant whose turn it is (see `TransportAdmin`'s tenant rule): among those with a
# free, unpaused group at or above the floor, the least max(pass, V), ties by name, ''
# (no tenant) first; with its start and weight. One seek per known tenant.
_SERVABLE = """busy_until IS NULL AND paused = 0 AND priority >= :min_priority"""
TENANT_TURN: Final = Statement(
    f"""
WITH servable (tenant) AS (
    SELECT '' WHERE EXISTS (SELECT 1 FROM groups WHERE tenant IS NULL AND {_SERVABLE})
    UNION ALL
    SELECT t.tenant FROM tenants t
     WHERE t.tenant != ''
       AND EXISTS (SELECT 1 FROM groups g WHERE g.tenant = t.tenant AND {_SERVABLE})
)
SELECT s.tenant, max(coalesce(t.pass, 0.0), (SELECT v FROM vtime)), coalesce(t.weight, 1)
  FROM servable s LEFT JOIN tenants t ON t.tenant = s.tenant
 ORDER BY 2, 1 LIMIT 1
""",
    ("min_priority",),
    rows=True,
)
# The next free group of one tenant, in round-robin order: as NEXT_FREE, through the
# tenants' own index; the groups without a tenant through the turn index.
_HEAD_OF = """SELECT g.group_id, g.head_seq, g.attempt, g.locked_by,
       (SELECT attempts FROM requeued WHERE seq = g.head_seq)
  FROM groups g WHERE g.group_id = """
NEXT_FREE_OF_TENANT: Final = Statement(
    f"{_HEAD_OF}({_next_free(' AND tenant = :tenant')})",
    ("tenant", "min_priority"),
    rows=True,
)
NEXT_FREE_UNTENANTED: Final = Statement(
    f"{_HEAD_OF}({_next_free(' AND tenant IS NULL')})",
    ("min_priority",),
    rows=True,
)
# The claim took the tenant's turn: V moves to its start, its pass one weighted step on.
TAKE_TURN: Final = (
    Statement("UPDATE vtime SET v = :start", ("start",)),
    Statement(
        """
INSERT INTO tenants (tenant, pass) VALUES (:tenant, :pass)
ON CONFLICT (tenant) DO UPDATE SET pass = excluded.pass
""",
        ("tenant", "pass"),
    ),
)

# What a waiting claim watches: the database's change counter (which moves when another
# connection commits), when the next lease or park at or above the floor runs out, and
# when the earliest delayed message comes due (whatever its priority: waking early
# costs one look).
WAIT_STATE: Final = Statement(
    """
SELECT (SELECT data_version FROM pragma_data_version),
       (SELECT min(busy_until) FROM groups WHERE busy_until IS NOT NULL
           AND priority >= :min_priority),
       (SELECT min(due) FROM timers)
""",
    ("min_priority",),
    rows=True,
)


# ack, nack and extend act only on the current lease: the group's head is that seq, and
# the same worker holds it with the same attempt, not acked or nacked since. A re-claim
# after a lapse bumps attempt, so a stale worker matches no row and changes nothing.
_LEASE_HOLDER = """group_id = :group_id AND head_seq = :seq
   AND locked_by = :worker_id AND attempt = :attempt"""
_FENCE = ("group_id", "seq", "worker_id", "attempt")

ACK: Final = Statement(
    f"""
DELETE FROM messages
 WHERE seq = :seq
   AND EXISTS (SELECT 1 FROM groups WHERE {_LEASE_HOLDER})
""",
    _FENCE,
)

RELEASE: Final = Statement(
    f"""
UPDATE groups SET locked_by = :locked_by, lock_expiry = :lock_expiry, busy_until = :lock_expiry
 WHERE {_LEASE_HOLDER}
""",
    (*_FENCE, "locked_by", "lock_expiry"),
)

# A claim whose caller was cancelled before it heard of the lease gives it back as if it
# had never been taken: free, and with the delivery it never made uncounted.
UNCLAIM: Final = Statement(
    f"""
UPDATE groups SET locked_by = NULL, lock_expiry = NULL, busy_until = NULL, attempt = attempt - 1
 WHERE {_LEASE_HOLDER}
""",
    _FENCE,
)

# bury's first statement: is the lease current? (It settles the message in the next ones.)
HOLDS_LEASE: Final = Statement(f"SELECT 1 FROM groups WHERE {_LEASE_HOLDER}", _FENCE, rows=True)

EXTEND: Final = Statement(
    f"""
UPDATE groups SET lock_expiry = :lock_expiry, busy_until = :lock_expiry
 WHERE {_LEASE_HOLDER}
""",
    (*_FENCE, "lock_expiry"),
)


# --- dead letters -----------------------------------------------------------------------

# A held dead letter's lock_expiry: later than any `now`, so its group is never ready.
HELD: Final = float("inf")

# Run by `bury`, or by the claim that would have delivered the message once too often, in
# the same transaction: the dead letter records the deliveries that really happened.
BURY: Final = Statement(
    """
INSERT INTO dead_letters (seq, group_id, priority, event, attempts, reason, dead_at)
SELECT seq, group_id, priority, event, :attempts, :reason, :now FROM messages
 WHERE seq = :seq
""",
    ("attempts", "reason", "now", "seq"),
)

# on_dead=release: the message leaves the queue; the delete trigger frees its group and
# moves the head on to the next message.
DROP_MESSAGE: Final = Statement("DELETE FROM messages WHERE seq = :seq", ("seq",))

# on_dead=hold: the message stays its group's head, parked for ever, so that nothing later
# in the group is delivered and later publishes queue behind it. Its attempt is the
# deliveries it had.
HOLD_GROUP: Final = Statement(
    """
UPDATE groups SET locked_by = :parked, lock_expiry = :held, busy_until = :held, attempt = :attempts
 WHERE group_id = :group_id
""",
    ("parked", "held", "attempts", "group_id"),
)

FORGET_REQUEUED: Final = Statement("DELETE FROM requeued WHERE seq = :seq", ("seq",))

# Requeue history of acked messages is useless: trimmed at each requeue, not at each ack.
PRUNE_REQUEUED: Final = Statement(
    """
DELETE FROM requeued WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.seq = requeued.seq)
""",
)

DEAD_LETTER: Final = Statement(
    """
SELECT group_id, attempts, EXISTS (SELECT 1 FROM messages m WHERE m.seq = d.seq)
  FROM dead_letters d WHERE seq = :seq
""",
    ("seq",),
    rows=True,
)

# A message may only become its group's head while nobody holds the group: no worker's
# lease (lapsed ones included: they can still be acked or extended, which would act on
# the new head) and no held dead letter (the hold belongs to that message). A park is
# fine: the new head waits for it to end.
GROUP_HOLDER: Final = Statement(
    """
SELECT locked_by, head_seq FROM groups
 WHERE group_id = :group_id AND (locked_by != :parked OR lock_expiry = :held)
""",
    ("group_id", "parked", "held"),
    rows=True,
)

# A held dead letter is still its group's head: freeing it makes it deliverable again,
# and ready from the requeue's `now`.
UNHOLD_GROUP: Final = Statement(
    """
UPDATE groups SET locked_by = NULL, lock_expiry = NULL, busy_until = NULL
 WHERE group_id = :group_id AND head_seq = :seq AND lock_expiry = :held
""",
    ("group_id", "seq", "held"),
)
READY_AGAIN: Final = Statement(
    "UPDATE messages SET ready_at = :now WHERE seq = :seq", ("now", "seq")
)

# A released dead letter goes back under its own seq, in its place in its group's chain:
# after the last message older than it (`PREDECESSOR`; NULL: none, so it becomes the
# head), or as a new group with its priority. A head it displaces keeps its deliveries in
# its own row, for when it becomes the head again: its fencing token must not start over.
STASH_HEAD_ATTEMPT: Final = Statement(
    """
UPDATE messages SET attempt = (SELECT attempt FROM groups WHERE group_id = :group_id)
 WHERE seq = (SELECT head_seq FROM groups WHERE group_id = :group_id AND head_seq > :seq)
""",
    ("group_id", "seq"),
)
# A walk along the group's chain, from its head while the seqs are older than :seq: as
# long as the messages ahead of it, not the backlog. Each step must go to a higher seq,
# as every link does, so that even a damaged chain cannot make the walk go round.
PREDECESSOR: Final = Statement(
    """
WITH RECURSIVE chain (seq, next_seq) AS (
    SELECT seq, next_seq FROM messages
     WHERE seq = (SELECT head_seq FROM groups WHERE group_id = :group_id) AND seq < :seq
    UNION ALL
    SELECT m.seq, m.next_seq FROM chain JOIN messages m ON m.seq = chain.next_seq
     WHERE m.seq < :seq AND m.seq > chain.seq
)
SELECT max(seq) FROM chain
""",
    ("group_id", "seq"),
    rows=True,
)
# It is ready from the requeue's `now`, at its group's priority (its own if it opens the
# group again: RESTORE_HEAD).
RESTORE_MESSAGE: Final = Statement(
    """
INSERT INTO messages (seq, group_id, priority, event, attempt, next_seq, ready_at,
                      group_priority)
SELECT seq, group_id, priority, event, attempts,
       CASE WHEN :after IS NULL THEN (SELECT head_seq FROM groups WHERE group_id = :group_id)
            ELSE (SELECT next_seq FROM messages WHERE seq = :after) END,
       :now,
       coalesce((SELECT priority FROM groups WHERE group_id = :group_id), priority)
  FROM dead_letters WHERE seq = :seq
""",
    ("after", "group_id", "now", "seq"),
)
LINK_AFTER: Final = Statement(
    "UPDATE messages SET next_seq = :seq WHERE seq = :after",
    ("seq", "after"),
)
RESTORE_HEAD: Final = Statement(
    """
INSERT INTO groups (group_id, priority, head_seq, tail_seq, attempt)
SELECT group_id, priority, seq, seq, attempts FROM dead_letters WHERE seq = :seq
ON CONFLICT (group_id) DO UPDATE
SET head_seq = min(head_seq, excluded.head_seq),
    attempt = CASE WHEN excluded.head_seq < head_seq THEN excluded.attempt ELSE attempt END,
    tail_seq = max(tail_seq, excluded.tail_seq),
    depth = depth + 1
""",
    ("seq",),
)

MARK_REQUEUED: Final = Statement(
    """
INSERT INTO requeued (seq, group_id, attempts) VALUES (:seq, :group_id, :attempts)
ON CONFLICT (seq) DO UPDATE SET attempts = excluded.attempts
""",
    ("seq", "group_id", "attempts"),
)

FORGET_DEAD_LETTER: Final = Statement("DELETE FROM dead_letters WHERE seq = :seq", ("seq",))

# --- admin --------------------------------------------------------------------------------

# Per group priority (the one claims filter on), from `groups` alone: one pass over the
# table, as today's counts always took. Only a head can be leased or parked; the messages
# behind it count as ready. A held dead letter is counted as dead only: it matches none
# of the three. Then the groups: those a claim could serve now (head free or lapsed, not
# paused: a held dead letter's expiry never lapses), and those `groups` lists (depth 1 or
# more once a holding dead letter is left out), whose difference is the busy ones.
MESSAGE_COUNTS: Final = Statement(
    """
SELECT priority,
       sum(depth - (locked_by IS NOT NULL AND lock_expiry >= :now)),
       count(*) FILTER (WHERE locked_by != :parked AND lock_expiry >= :now),
       count(*) FILTER (WHERE locked_by = :parked AND lock_expiry >= :now
                          AND lock_expiry < :held),
       count(*) FILTER (WHERE paused = 0 AND (locked_by IS NULL OR lock_expiry < :now)),
       count(*) FILTER (WHERE depth > (lock_expiry IS :held))
  FROM groups
 GROUP BY priority
""",
    ("now", "parked", "held"),
    rows=True,
)

# When the oldest ready message of each priority became ready. For each priority, a walk
# of `messages_by_ready` from its oldest entry, stopping at the first message that counts
# as ready: not a hold=True message not yet due (as HOLD_COUNTS has it), and not the head
# of a group whose lease, park or hold has not ended (as MESSAGE_COUNTS has it; a primary
# key seek into `groups` per entry). So it walks past the busy heads older than that
# message only (in-flight heads, parks, held dead letters), never the backlog. The walk
# ends at `now`: a hold=True message not yet due is stamped with its due time, later, so
# however many are scheduled none is walked. (A message stamped by a process whose clock
# runs ahead is not walked either until `now` passes its stamp: `Stats` ages it 0.)
_PRIORITIES = ", ".join(f"({p})" for p in range(MAX_PRIORITY + 1))
OLDEST_READY: Final = Statement(
    f"""
WITH p (priority) AS (VALUES {_PRIORITIES})
SELECT p.priority, (
    SELECT m.ready_at FROM messages m INDEXED BY messages_by_ready
     WHERE m.group_priority = p.priority AND m.ready_at <= :now
       AND (m.due IS NULL OR m.due < :now)
       AND NOT EXISTS (
           SELECT 1 FROM groups g
            WHERE g.group_id = m.group_id AND g.head_seq = m.seq
              AND g.locked_by IS NOT NULL AND g.lock_expiry >= :now)
     ORDER BY m.ready_at LIMIT 1)
  FROM p
""",
    ("now",),
    rows=True,
)

# The keys remembered, expired ones not yet forgotten included: a count of the smaller
# index, so it grows with the keys used within the window, not with the messages.
KEY_COUNT: Final = Statement("SELECT count(*) FROM keys", rows=True)

DEAD_COUNTS: Final = Statement(
    "SELECT priority, count(*) FROM dead_letters GROUP BY priority",
    rows=True,
)

DEEPEST_GROUPS: Final = Statement(
    """
SELECT group_id, priority, head_seq, last_claimed_at, locked_by, lock_expiry, depth,
       paused, tenant
  FROM groups
 ORDER BY depth DESC, head_seq
 LIMIT :limit
""",
    ("limit",),
    rows=True,
)

LIST_DEAD_LETTERS: Final = Statement(
    """
SELECT d.seq, d.group_id, d.priority, d.event, d.attempts, d.reason, d.dead_at,
       EXISTS (SELECT 1 FROM messages m WHERE m.seq = d.seq)
  FROM dead_letters d
 ORDER BY d.seq
 LIMIT :limit
""",
    ("limit",),
    rows=True,
)

LIST_HELD_GROUPS: Final = Statement(
    """
SELECT d.group_id, d.seq, d.dead_at, g.depth - 1
  FROM dead_letters d
  JOIN messages m ON m.seq = d.seq
  JOIN groups g ON g.group_id = d.group_id
 ORDER BY d.seq
""",
    rows=True,
)

COUNT_HELD_IN_GROUP: Final = Statement(
    """
SELECT count(*) FROM dead_letters d JOIN messages m ON m.seq = d.seq
 WHERE d.group_id = :group_id
""",
    ("group_id",),
    rows=True,
)
# A purge walks the group's chain for its seqs, at most its depth of steps (a promoted
# message may have a lower seq than the one before it, so the steps need not rise), then
# removes the group before its messages, so that the delete trigger has no head to move.
GROUP_CHAIN: Final = Statement(
    """
WITH RECURSIVE chain (seq, steps) AS (
    SELECT head_seq, 1 FROM groups WHERE group_id = :group_id
    UNION ALL
    SELECT m.next_seq, chain.steps + 1 FROM chain JOIN messages m ON m.seq = chain.seq
     WHERE m.next_seq IS NOT NULL
       AND chain.steps < (SELECT depth FROM groups WHERE group_id = :group_id)
)
SELECT seq FROM chain
""",
    ("group_id",),
    rows=True,
)
DROP_GROUP: Final = Statement("DELETE FROM groups WHERE group_id = :group_id", ("group_id",))
PURGE_GROUP_DEAD_LETTERS: Final = Statement(
    "DELETE FROM dead_letters WHERE group_id = :group_id",
    ("group_id",),
)
PURGE_GROUP_TIMERS: Final = Statement(
    "DELETE FROM timers WHERE group_id = :group_id", ("group_id",)
)

# --- timers, pauses and tenants, for the admin interface ----------------------------------

# Delayed messages not yet due: timers by their own priority (due ones count as ready,
# as the next claim promotes them, and have been since their due time), and hold=True
# messages by their group's (where `MESSAGE_COUNTS` counted them: as parked when at the
# head, which parks its group until due, as ready behind it).
TIMER_COUNTS: Final = Statement(
    """
SELECT priority, count(*) FILTER (WHERE due > :now), count(*) FILTER (WHERE due <= :now),
       min(due) FILTER (WHERE due <= :now)
  FROM timers GROUP BY priority
""",
    ("now",),
    rows=True,
)
# The groups that only due timers would open, counted where their promotion will put
# them (as TIMER_COUNTS counts those timers ready, before any claim or publish promotes
# them): under the priority of the first to be promoted (SQLite gives the bare column of
# the row with min(due); equal due times in one group, at different priorities, are left
# to chance), ready unless a pause is stored for the group. A range of `timers_by_due`
# (the due timers only, however many are scheduled later), each with a primary key seek
# into `groups`; `groups()` lists such a group only after the promotion.
TIMER_GROUPS: Final = Statement(
    """
SELECT first.priority, count(*),
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM paused p WHERE p.group_id = first.group_id))
  FROM (SELECT t.group_id, t.priority, min(t.due) FROM timers t INDEXED BY timers_by_due
         WHERE t.due <= :now
           AND NOT EXISTS (SELECT 1 FROM groups g WHERE g.group_id = t.group_id)
         GROUP BY t.group_id) AS first
 GROUP BY first.priority
""",
    ("now",),
    rows=True,
)
HOLD_COUNTS: Final = Statement(
    """
SELECT g.priority, count(*), count(*) FILTER (WHERE g.head_seq = m.seq)
  FROM messages m JOIN groups g ON g.group_id = m.group_id
 WHERE m.due >= :now
 GROUP BY g.priority
""",
    ("now",),
    rows=True,
)
PAUSED_COUNT: Final = Statement("SELECT count(*) FROM paused", rows=True)
# cancel: a timer goes at once; a message in a chain is looked up with its group's head
# and lease, and whether it is a dead letter (a held one stays in `messages`).
CANCEL_TIMER: Final = Statement("DELETE FROM timers WHERE seq = :seq", ("seq",))
CANCEL_TARGET: Final = Statement(
    """
SELECT m.group_id, m.next_seq, g.head_seq, g.tail_seq, g.locked_by, g.lock_expiry,
       EXISTS (SELECT 1 FROM dead_letters d WHERE d.seq = m.seq)
  FROM messages m JOIN groups g ON g.group_id = m.group_id
 WHERE m.seq = :seq
""",
    ("seq",),
    rows=True,
)
# The message before :seq in its group's chain: a walk from the head, at most the
# group's depth of steps.
CHAIN_BEFORE: Final = Statement(
    """
WITH RECURSIVE chain (seq, next_seq, steps) AS (
    SELECT seq, next_seq, 1 FROM messages
     WHERE seq = (SELECT head_seq FROM groups WHERE group_id = :group_id)
    UNION ALL
    SELECT m.seq, m.next_seq, chain.steps + 1 FROM chain JOIN messages m ON m.seq = chain.next_seq
     WHERE chain.next_seq != :seq
       AND chain.steps < (SELECT depth FROM groups WHERE group_id = :group_id)
)
SELECT seq FROM chain WHERE next_seq = :seq
""",
    ("group_id", "seq"),
    rows=True,
)
# A message taken out of the middle or the end of its chain: the one before it points
# past it, and its group is one shorter (with a new tail if it was the tail). Deleting it
# then moves no head (it is not one), and only `seqs` may change.
UNLINK: Final = Statement(
    "UPDATE messages SET next_seq = :next_seq WHERE seq = :before",
    ("next_seq", "before"),
)
SHORTEN_GROUP: Final = Statement(
    """
UPDATE groups SET depth = depth - 1,
       tail_seq = CASE WHEN tail_seq = :seq THEN :before ELSE tail_seq END
 WHERE group_id = :group_id
""",
    ("seq", "before", "group_id"),
)

PAUSE: Final = Statement(
    "INSERT INTO paused (group_id) VALUES (:group_id) ON CONFLICT (group_id) DO NOTHING",
    ("group_id",),
)
RESUME: Final = Statement("DELETE FROM paused WHERE group_id = :group_id", ("group_id",))
MARK_PAUSED: Final = Statement(
    "UPDATE groups SET paused = :paused WHERE group_id = :group_id", ("paused", "group_id")
)
LIST_PAUSED: Final = Statement("SELECT group_id FROM paused ORDER BY group_id", rows=True)

# peek: the group's head and lease, then its chain from the head (at most :limit), then
# its timers by (due, seq).
PEEK_GROUP: Final = Statement(
    """
SELECT head_seq, attempt, locked_by, lock_expiry FROM groups WHERE group_id = :group_id
""",
    ("group_id",),
    rows=True,
)
PEEK_CHAIN: Final = Statement(
    """
WITH RECURSIVE chain (seq, next_seq, steps) AS (
    SELECT seq, next_seq, 1 FROM messages
     WHERE seq = (SELECT head_seq FROM groups WHERE group_id = :group_id)
    UNION ALL
    SELECT m.seq, m.next_seq, chain.steps + 1 FROM chain JOIN messages m ON m.seq = chain.next_seq
     WHERE chain.steps < :limit
)
SELECT m.seq, m.priority, m.event, m.attempt, m.due
  FROM chain JOIN messages m ON m.seq = chain.seq
 ORDER BY chain.steps
""",
    ("group_id", "limit"),
    rows=True,
)
PEEK_TIMERS: Final = Statement(
    """
SELECT seq, priority, event, due FROM timers WHERE group_id = :group_id
 ORDER BY due, seq LIMIT :limit
""",
    ("group_id", "limit"),
    rows=True,
)

SET_WEIGHT: Final = Statement(
    """
INSERT INTO tenants (tenant, weight) VALUES (:tenant, :weight)
ON CONFLICT (tenant) DO UPDATE SET weight = excluded.weight
""",
    ("tenant", "weight"),
)
GROUPS_BY_TENANT: Final = Statement(
    "SELECT tenant, count(*) FROM groups GROUP BY tenant", rows=True
)
WEIGHTS: Final = Statement("SELECT tenant, weight FROM tenants WHERE weight IS NOT NULL", rows=True)

# --- WAL housekeeping -----------------------------------------------------------------------

# SQLite checkpoints the WAL into the database once it holds this many frames. Its default,
# 1,000, is 4 MiB of WAL with its default 4 KiB pages, but only 1 MiB with ours. Where
# commits are not flushed (`normal`, `off`), checkpointing after 4 MiB, as often by the
# byte as by default, lets a batch publish pay fewer of them. Where every commit is
# flushed (`full`, `extra`), the default stays: while the WAL file still grows (when new,
# or after an idle truncation), each flush also commits the file's new size, and a 4 MiB
# WAL grows for four times as long. The figures are in the commit log.
CHECKPOINT_PAGES: Final = {"off": 4096, "normal": 4096, "full": 1000, "extra": 1000}
# Under load, journal_size_limit trims the WAL to this size whenever SQLite restarts it.
# The auto-checkpoint keeps it near 4,096 frames of a 1 KiB page plus a header each at most,
# a little over 4 MiB: the limit sits well above that, so a normal cycle is never truncated.
WAL_LIMIT_BYTES: Final = 8 << 20
# When a claim finds nothing and the WAL is larger than this, the queue is idle: the WAL
# is checkpointed and truncated to nothing, without waiting for anybody.
IDLE_WAL_BYTES: Final = 64 << 10
# The async twin's connection checkpoints on its engine's thread, never in a commit (see
# `_async.LoopEngine`): it counts the commits of brief operations, which write a few
# pages each (a claim two, an ack four or five), and checkpoints once this many of them
# may have filled CHECKPOINT_PAGES.
BRIEF_COMMIT_PAGES: Final = 4

# Each answers (busy, frames in the WAL, frames copied into the database).
CHECKPOINT_PASSIVE: Final = "PRAGMA wal_checkpoint(PASSIVE)"
CHECKPOINT_TRUNCATE: Final = "PRAGMA wal_checkpoint(TRUNCATE)"

# Writes the file's header page again, changing nothing: the first commit into a WAL
# that a checkpoint has emptied starts it over and flushes its new header, and the async
# twin's engine makes that commit this one, on its own thread (see `_async.LoopEngine`).
REWRITE_HEADER: Final = Statement(f"PRAGMA user_version = {SCHEMA_VERSION}")


def busy_timeout(milliseconds: int) -> str:
    """Set how long a statement waits for another connection's lock (whitelisted int)."""
    return f"PRAGMA busy_timeout = {int(milliseconds)}"


READ_JOURNAL_MODE: Final = Statement("PRAGMA journal_mode", rows=True)


def wal_autocheckpoint(pages: int) -> str:
    """Checkpoint in a commit that leaves the WAL with this many frames (0: never)."""
    return f"PRAGMA wal_autocheckpoint = {int(pages)}"


def session_pragmas(
    synchronous: str, memory: bool, journal_mode: str, on_loop: bool = False
) -> tuple[Statement, ...]:
    """Per-connection settings, run after `setup` (WAL must never be switched on in a file
    before we know it is ours: it rewrites the header). ``synchronous`` is whitelisted.
    A connection whose transactions may run ``on_loop`` (the async twin's) never waits
    for a lock and never checkpoints in a commit unless its engine asks for it (see
    `_async.LoopEngine`).

    ``journal_mode`` is the file's current mode. Switching to WAL needs a moment alone
    with the file (SQLite answers "database is locked" at once, without its busy handler,
    while another connection writes), and the mode persists in the file: so it is only
    switched on a file not yet in WAL, and the runner retries it like any contention."""
    settings: tuple[str, ...] = ()
    if not memory:
        switch = () if journal_mode.lower() == "wal" else ("PRAGMA journal_mode = WAL",)
        settings = (
            *switch,
            wal_autocheckpoint(0 if on_loop else CHECKPOINT_PAGES[synchronous]),
            f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}",
        )
    if on_loop:
        settings = (*settings, busy_timeout(0))
    # Each of these answers with the value it set; `synchronous` answers nothing.
    return (
        *(Statement(pragma, rows=True) for pragma in settings),
        Statement(set_synchronous(synchronous)),
    )


def set_synchronous(level: str) -> str:
    """Set the connection's durability level (``level`` is whitelisted by the URL parser).
    SQLite refuses this inside a transaction."""
    return f"PRAGMA synchronous = {level.upper()}"


# --- transport.within(conn): on the caller's connection, in the caller's transaction ----

# The file of the connection's main database, by schema name ('' in memory, or for a
# temporary database): a caller's connection must be to the queue's own file.
DATABASE_LIST: Final = "PRAGMA database_list"

# A write that changes nothing. sqlite3, in its legacy transaction control, opens a
# transaction before a write, with the connection's own isolation_level; this lets it
# open the caller's transaction exactly as it would before the caller's first write of
# its own, so that the savepoint below is never the outermost (releasing that commits).
OPEN_CALLER_TRANSACTION: Final = "UPDATE seqs SET last = last WHERE 0"

# Each operation runs in a savepoint of its own inside the caller's transaction: one that
# fails (LeaseLost after a statement ran, an error half way through a batch) is undone
# alone, and the caller's transaction goes on as it was.
SAVEPOINT: Final = "SAVEPOINT durable_transports_op"
RELEASE_SAVEPOINT: Final = "RELEASE durable_transports_op"
ROLLBACK_TO_SAVEPOINT: Final = "ROLLBACK TO durable_transports_op"
