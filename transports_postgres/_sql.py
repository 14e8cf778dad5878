"""The PostgreSQL schema and every statement the backend runs; nothing else.

One schema is one queue. `groups` holds one row per group that has messages: its head,
depth, the head's lease or park, and its turn in the round-robin. `messages` holds every
unacked message under its group. A claim picks a group row through a small partial index
of free groups and locks it (`FOR NO KEY UPDATE SKIP LOCKED`), so claims on different
groups never wait for each other and never look at the backlog.

Each statement is a `Statement`: its text, with ``{s}`` where the schema goes and
``:name`` for each parameter, and the names of its parameters, declared once. Imports no
driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from transports_core.backend import RESERVED_PREFIX

# Stored in `meta`: a schema with another version is refused, but for UPGRADES_FROM.
# 2: the free groups' index is on the `free` column (1 had no released queues).
# 3: the `keys` table of idempotency keys.
# 4: timers, holds, pauses and tenants.
# 5: each message's ready-since time and its group's priority, for the backlog's age.
# (A store at 3 or 4 is upgraded in place: `UPGRADES`.)
SCHEMA_VERSION: Final = 5
# The older versions a store may be at and still be brought up to date: by
# `transports migrate`, or when opened with ?migrate=auto.
UPGRADES_FROM: Final = (3, 4)
# Written beside the version, so that a schema holding someone else's `meta` is refused too.
OWNER: Final = "durable-transports"

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
# A parameter cast to an array type (``:name::text[]``): psycopg sends it in binary.
_ARRAY = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)(?=::\w+\[\])")


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement as data: ``text`` and the ``names`` of its parameters, in the order an
    operation binds them. Raises ``ValueError`` unless the names are exactly the text's.

    An array parameter (``:name::text[]``, the cast written beside it) is sent in binary:
    in text, psycopg quotes and escapes every element on the client, which for a batch of
    events costs more than the server's whole insert."""

    text: str
    names: tuple[str, ...] = ()
    _rendered: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        used = set(_NAMED.findall(self.text))
        if len(set(self.names)) != len(self.names) or used != set(self.names):
            raise ValueError(f"parameters {sorted(used)} of the statement, named {self.names}")

    def render(self, schema: str) -> str:
        """The text psycopg runs for the queue in ``schema`` (its plain name); the
        notification channel is named after the schema too."""
        text = self._rendered.get(schema)
        if text is None:
            text = self.text.replace("%", "%%").replace("{s}", quote_ident(schema))
            text = text.replace("{channel}", quote_literal(schema))
            text = _ARRAY.sub(lambda match: f"%({match[1]})b", text)
            text = _NAMED.sub(lambda match: f"%({match[1]})s", text)
            self._rendered[schema] = text
        return text


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (the URL parser has whitelisted it already)."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as a SQL string literal (a whitelisted schema name)."""
    return "'" + text.replace("'", "''") + "'"


# The holder of a parked head, where a worker's id would be: inside core's reserved prefix.
PARKED: Final = RESERVED_PREFIX + "parked__"
# The holder of a head published with ``hold=True`` that is not due yet: it holds its
# group as a park does, and is told apart from a nack's park by admin reads.
DELAYED: Final = RESERVED_PREFIX + "delayed__"
# At most this many delayed messages join their groups per claim (in due order).
PROMOTE_BATCH: Final = 100
# A held dead letter's lock_expiry: later than any clock, so its group is never ready.
HELD: Final = float("inf")

# The transaction's "now": the injected clock's reading, else the server's clock, which is
# one clock for every host. date_part gives double precision (extract gives numeric).
_NOW = "coalesce(:now::float8, date_part('epoch', statement_timestamp()))"

# A transaction that only moves a lease (a claim, nack or extend) commits without waiting
# for its WAL to reach the disk when the transport is opened with lease_commit=async
# (:lease_commit is then 'off'): the next flushed commit, from any session, or the WAL
# writer a moment later, writes it. NULL (the default, flush) leaves the session's own
# synchronous_commit alone. In the FROM list of the statement, so it runs once.
_LEASE_COMMIT = (
    "(SELECT CASE WHEN :lease_commit::text IS NOT NULL "
    "THEN set_config('synchronous_commit', :lease_commit::text, true) END) AS lease_commit"
)

BEGIN: Final = Statement("BEGIN")
# Admin reads: one consistent snapshot, and never a write.
BEGIN_READ: Final = Statement("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
COMMIT: Final = Statement("COMMIT")
ROLLBACK: Final = Statement("ROLLBACK")

# --- the schema ---------------------------------------------------------------------------

# What the schema holds now: whether it exists, how many relations it has, and whether
# it has a `meta` table (read without locking, then again under the advisory lock before
# anything is created); and whether this role may create what a new queue needs (the
# schema, or tables in an empty one), and its name: an opener that may not is refused
# with a message naming `transports migrate`, before it tries. Reads the catalogs only.
READ_IDENTITY: Final = Statement(
    """
SELECT n.oid IS NOT NULL,
       (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid),
       to_regclass(quote_ident(:schema) || '.meta') IS NOT NULL,
       CASE WHEN n.oid IS NULL THEN has_database_privilege(current_database(), 'CREATE')
            ELSE has_schema_privilege(n.oid, 'CREATE') END,
       current_user::text
  FROM (SELECT :schema::text AS name) want
  LEFT JOIN pg_namespace n ON n.nspname = want.name
""",
    ("schema",),
)
READ_META: Final = Statement("SELECT key, value FROM {s}.meta")

# Two openers of a new queue on any hosts: the second waits here, then finds the schema.
SETUP_LOCK: Final = Statement(
    "SELECT pg_advisory_xact_lock(hashtext('durable-transports'), hashtext(:schema))",
    ("schema",),
)

# Only for a schema that is not there: CREATE SCHEMA asks for the database's CREATE
# privilege even with IF NOT EXISTS, which a role given an empty schema lacks.
CREATE_SCHEMA: Final = Statement("CREATE SCHEMA IF NOT EXISTS {s}")

# What version 3 added, written so that it runs on a new schema and on one at version 2.
KEYS_SCHEMA: Final = (
    # The idempotency keys a queue remembers, each scoped to its group, with the seq of the
    # message first published with it. The primary key is what makes racing publishes of
    # one key store one message: the second INSERT ... ON CONFLICT waits for the first to
    # commit or roll back, then takes the row it left. A row whose expires_at has passed
    # counts as absent (a publish overwrites it), and is deleted a few at a time through
    # keys_expiry, so forgetting never reads more than it deletes.
    Statement(
        """
CREATE TABLE IF NOT EXISTS {s}.keys (
    group_id   text   NOT NULL,
    key        text   NOT NULL,
    seq        bigint NOT NULL,
    expires_at float8 NOT NULL,
    PRIMARY KEY (group_id, key)
)"""
    ),
    Statement("CREATE INDEX IF NOT EXISTS keys_expiry ON {s}.keys (expires_at)"),
)

# What version 4 added, written so that it runs on a new schema and on one at version 3.
TIMERS_SCHEMA: Final = (
    # Delayed messages without hold, outside their groups until due: a claim reads the
    # front of timers_due and nothing else; a publish looks up its own group's due ones
    # through timers_group. `seq` is the seq the publish returned, kept for good.
    Statement(
        """
CREATE TABLE IF NOT EXISTS {s}.timers (
    seq      bigint   PRIMARY KEY,
    group_id text     NOT NULL,
    priority smallint NOT NULL,
    tenant   text,
    event    text     NOT NULL,
    due      float8   NOT NULL
)"""
    ),
    Statement("CREATE INDEX IF NOT EXISTS timers_due ON {s}.timers (due, seq)"),
    Statement("CREATE INDEX IF NOT EXISTS timers_group ON {s}.timers (group_id, due, seq)"),
    # `seq` in `messages` is the message's place in its group's FIFO. It is the seq its
    # publish returned, except for a delayed message that joined a group with messages:
    # it takes a place drawn from `seqs` when it joins (after everything there), and
    # `id` keeps its own seq until it becomes the head, when it is moved back under its
    # own seq (nothing is left before it then), so a head's place is always its seq.
    # `not_before`: a publish with hold=True, not deliverable before then.
    Statement(
        "ALTER TABLE {s}.messages ADD COLUMN IF NOT EXISTS id bigint, "
        "ADD COLUMN IF NOT EXISTS not_before float8"
    ),
    Statement(
        "CREATE INDEX IF NOT EXISTS messages_held ON {s}.messages (group_id) "
        "WHERE not_before IS NOT NULL"
    ),
    Statement(
        "CREATE INDEX IF NOT EXISTS messages_moved ON {s}.messages (id) WHERE id IS NOT NULL"
    ),
    # A pause is stored apart from the group, whose row goes when it drains; the row's
    # `paused` copies it (set by pause and resume, and when a group is made), so that
    # claims skip paused groups through their index at no cost.
    Statement("CREATE TABLE IF NOT EXISTS {s}.paused (group_id text PRIMARY KEY)"),
    Statement(
        "ALTER TABLE {s}.groups ADD COLUMN IF NOT EXISTS paused boolean NOT NULL DEFAULT false, "
        "ADD COLUMN IF NOT EXISTS tenant text"
    ),
    Statement("DROP INDEX IF EXISTS {s}.groups_ready"),
    Statement(
        "CREATE INDEX groups_ready ON {s}.groups (last_claimed_at, head_seq) "
        "WHERE free AND NOT paused"
    ),
    # The groups that have a tenant: empty (and never written) while no group has one,
    # which is what lets a claim skip the tenants' bookkeeping. The ready ones by tenant,
    # in round-robin order: a claim in a tenant's turn reads the front of its part.
    Statement(
        "CREATE INDEX IF NOT EXISTS groups_tenanted ON {s}.groups (tenant) WHERE tenant IS NOT NULL"
    ),
    Statement(
        "CREATE INDEX IF NOT EXISTS groups_tenant_ready ON {s}.groups "
        "(tenant, last_claimed_at, head_seq) WHERE free AND NOT paused AND tenant IS NOT NULL"
    ),
    # Each tenant's stored weight (NULL: never set, 1) and pass; '' stands for the
    # groups without a tenant (a tenant's name has one character at least).
    Statement(
        """
CREATE TABLE IF NOT EXISTS {s}.tenants (
    tenant text    PRIMARY KEY,
    weight integer,
    pass   float8  NOT NULL DEFAULT 0
)"""
    ),
    # The virtual time V: one row, locked by a claim that takes a tenant's turn.
    Statement(
        "CREATE TABLE IF NOT EXISTS {s}.vclock "
        "(one boolean PRIMARY KEY DEFAULT true CHECK (one), v float8 NOT NULL)"
    ),
    Statement("INSERT INTO {s}.vclock (v) VALUES (0) ON CONFLICT DO NOTHING"),
)

# What version 5 added, written so that it runs on a new schema and on one at version 4
# (or at 3 after TIMERS_SCHEMA). `ready_at`: when the message became ready, on the clock
# of `_NOW`: its publish, its due time (a delayed message, hold or not: a held one not
# due yet is later than now), its requeue (a dead letter), or 'Infinity' while it is a
# held dead letter (counted as dead, never ready). A lapsed lease, a nack or an ended park
# leave it alone. `group_priority`: the priority of its group, under which the stats
# count it (a group's priority is set when it is made, with no message in it, and kept
# while it has any, so a message's copy never goes stale). A store upgraded from 4 gets
# the upgrade's time for every message already ready (each row is written once: the
# upgrade takes time in proportion to the backlog).
# messages_ready serves the stats' oldest ready message per priority: the front of the
# priority's part, up to now, skipping only heads that are leased or parked (see
# MESSAGE_COUNTS). Publishes append near its right end (ready_at grows with time).
READY_SCHEMA: Final = (
    Statement(
        "ALTER TABLE {s}.messages ADD COLUMN IF NOT EXISTS group_priority smallint, "
        "ADD COLUMN IF NOT EXISTS ready_at float8"
    ),
    Statement(
        f"""
UPDATE {{s}}.messages m
   SET group_priority = g.priority,
       ready_at = CASE WHEN g.head_seq = m.seq AND g.lock_expiry = 'Infinity' THEN 'Infinity'
                       WHEN m.not_before > t.now THEN m.not_before
                       ELSE t.now END
  FROM {{s}}.groups g, (SELECT {_NOW} AS now) t
 WHERE g.group_id = m.group_id AND m.ready_at IS NULL
""",
        ("now",),
    ),
    Statement(
        "ALTER TABLE {s}.messages ALTER COLUMN group_priority SET NOT NULL, "
        "ALTER COLUMN ready_at SET NOT NULL"
    ),
    Statement(
        "CREATE INDEX IF NOT EXISTS messages_ready ON {s}.messages (group_priority, ready_at)"
    ),
)

SCHEMA: Final = (
    Statement("CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)"),
    Statement(
        "INSERT INTO {s}.meta (key, value) VALUES ('owner', :owner), ('version', :version)",
        ("owner", "version"),
    ),
    # Seqs are drawn from a sequence, which never hands a value out twice (not even after
    # a crash), and always under the group's row lock, so a group's seq order is its
    # commit order.
    Statement("CREATE SEQUENCE {s}.seqs AS bigint"),
    # A group's messages in seq order, found by the primary key: the next head is the
    # first seq above the acked one. Events are text, byte for byte (jsonb rewrites them).
    # `attempt`: deliveries before it became a head again (a requeued or displaced head);
    # `base`: deliveries it had when last requeued (max_attempts counts from there).
    Statement(
        """
CREATE TABLE {s}.messages (
    group_id text     NOT NULL,
    seq      bigint   NOT NULL,
    priority smallint NOT NULL,
    event    text     NOT NULL,
    attempt  integer  NOT NULL DEFAULT 0,
    base     integer  NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id, seq)
)"""
    ),
    # One row per group with messages. `locked_by` is the worker holding the head's lease,
    # PARKED, or NULL; `lock_expiry` when that lease or park ends (HELD: a held dead
    # letter); `busy_until` is lock_expiry while it runs, NULL once free or lapsed.
    # `free` says the same as busy_until IS NULL, in a form the planner can judge without
    # statistics: it takes half the rows of a boolean to match (of an IS NULL, one in
    # two hundred, which makes it sort the free groups rather than read the front of
    # their index).
    Statement(
        """
CREATE TABLE {s}.groups (
    group_id        text     PRIMARY KEY,
    priority        smallint NOT NULL,
    head_seq        bigint   NOT NULL,
    depth           integer  NOT NULL,
    attempt         integer  NOT NULL DEFAULT 0,
    locked_by       text,
    lock_expiry     float8,
    busy_until      float8,
    last_claimed_at float8   NOT NULL DEFAULT 0,
    free            boolean  GENERATED ALWAYS AS (busy_until IS NULL) STORED
)"""
    ),
    # The free groups in round-robin order (0: never claimed, so first): a claim reads the
    # front of this index and nothing else (made in TIMERS_SCHEMA, paused groups left out).
    # The busy groups by when they come free: the wake-up and a waiting claim's timer.
    Statement("CREATE INDEX groups_busy ON {s}.groups (busy_until) WHERE busy_until IS NOT NULL"),
    Statement(
        """
CREATE TABLE {s}.dead_letters (
    seq      bigint   PRIMARY KEY,
    group_id text     NOT NULL,
    priority smallint NOT NULL,
    event    text     NOT NULL,
    attempts integer  NOT NULL,
    reason   text     NOT NULL,
    dead_at  float8   NOT NULL
)"""
    ),
    Statement("CREATE INDEX dead_letters_by_group ON {s}.dead_letters (group_id, seq)"),
    # Backends (by pid) of listeners with a claim blocked right now. A change that makes a
    # group ready notifies only while this is not empty: a NOTIFY serializes commits
    # database-wide, so a queue nobody waits on must never pay for one.
    Statement("CREATE UNLOGGED TABLE {s}.waiters (pid integer PRIMARY KEY)"),
    # Every claim and ack rewrites a group row and both its index entries: vacuum the
    # small, hot table after a fixed number of dead rows, not a fraction of its size.
    Statement(
        "ALTER TABLE {s}.groups SET (autovacuum_vacuum_scale_factor = 0, "
        "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)"
    ),
    Statement(
        "ALTER TABLE {s}.messages SET (autovacuum_vacuum_scale_factor = 0.02, "
        "autovacuum_vacuum_insert_scale_factor = 0.05)"
    ),
    *KEYS_SCHEMA,
    *TIMERS_SCHEMA,
    *READY_SCHEMA,
)

# A store at a version of UPGRADES_FROM brought to SCHEMA_VERSION, additively, in the
# transaction of its opener that holds SETUP_LOCK: the version moves only with the tables
# it names.
SET_VERSION: Final = Statement(
    "UPDATE {s}.meta SET value = :version WHERE key = 'version'", ("version",)
)
UPGRADES: Final = {
    3: (*TIMERS_SCHEMA, *READY_SCHEMA, SET_VERSION),
    4: (*READY_SCHEMA, SET_VERSION),
}

# --- notifications ------------------------------------------------------------------------

# A NOTIFY, sent at commit, only when some listener has a claim blocked.
_NOTIFY = "pg_notify({channel}, '')"
_ANY_WAITER = "EXISTS (SELECT 1 FROM {s}.waiters)"

LISTEN_PID: Final = Statement("SELECT pg_backend_pid()")

# Stale rows (a killed process) are cleared by the next registration.
REGISTER_WAITER: Final = Statement(
    """
WITH stale AS (
    DELETE FROM {s}.waiters w
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)
)
INSERT INTO {s}.waiters (pid) VALUES (:pid) ON CONFLICT DO NOTHING
""",
    ("pid",),
)
UNREGISTER_WAITER: Final = Statement("DELETE FROM {s}.waiters WHERE pid = :pid", ("pid",))

# What a blocked claim looks at between its tries: when the next lease or park ends
# (seconds from now), for its timer, and whether a group is ready at or above its floor.
# The second is for a change whose notification never came: one made by a transaction
# whose snapshot was taken just before the claim registered as a waiter, so that it saw
# nobody to notify, and that committed just after the claim's try had looked. (Read off
# the front of groups_ready, in its order, as a claim reads it: an EXISTS is planned as a
# scan of the table.)
NEXT_DUE: Final = Statement(
    f"""
SELECT least((SELECT min(busy_until) FROM {{s}}.groups
               WHERE busy_until IS NOT NULL AND busy_until < 'Infinity'),
              (SELECT min(due) FROM {{s}}.timers)) - {_NOW},
       (SELECT 1 FROM {{s}}.groups WHERE free AND NOT paused AND priority >= :min_priority
         ORDER BY last_claimed_at, head_seq LIMIT 1) IS NOT NULL
""",
    ("now", "min_priority"),
)

# --- publish --------------------------------------------------------------------------------

# Lock the group row first (creating it, empty, if it is new): a conflicting row is
# locked even though the WHERE updates nothing. Everything after runs under that lock.
LOCK_GROUP: Final = Statement(
    """
INSERT INTO {s}.groups (group_id, priority, head_seq, depth) VALUES (:group_id, :priority, 0, 0)
ON CONFLICT (group_id) DO UPDATE SET depth = {s}.groups.depth WHERE false
""",
    ("group_id", "priority"),
)

# A published message (CTE `m`, its seq) counted into its locked group: a group that was
# empty (new) gets it as its head.
# A group made now takes the stored pause of its name (read only then).
_PAUSED_NOW = "EXISTS (SELECT 1 FROM {s}.paused p WHERE p.group_id = :group_id)"
_COUNT_IN = f"""UPDATE {{s}}.groups g
       SET depth = g.depth + 1,
           head_seq = CASE WHEN g.depth = 0 THEN m.seq ELSE g.head_seq END,
           paused = CASE WHEN g.depth = 0 THEN {_PAUSED_NOW} ELSE g.paused END
      FROM m
     WHERE g.group_id = :group_id"""

# Whether the group has delayed messages that are due: they join it before anything is
# appended, so a publish that finds some stores nothing and goes on in `PublishWith`
# (a one-time filter: the publish's own cost is one probe of timers_group).
_DUE_HERE = f"""due AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM {{s}}.timers
                    WHERE group_id = :group_id AND due <= {_NOW}) AS found
)"""
_FOUND = "(SELECT found FROM due)"
# The priority of the locked group a message joins (see READY_SCHEMA): one probe of its key.
_GROUP_PRIORITY = "(SELECT priority FROM {s}.groups WHERE group_id = :group_id)"

# In a fresh statement, under the lock: draw the seq, store the message, count it in; a
# group that was empty (new) gets it as its head, and a blocked claim is woken.
APPEND: Final = Statement(
    f"""
WITH {_DUE_HERE}, m AS (
    INSERT INTO {{s}}.messages (group_id, seq, priority, event, group_priority, ready_at)
    SELECT :group_id, nextval('{{s}}.seqs'), :priority, :event, {_GROUP_PRIORITY}, {_NOW}
     WHERE NOT {_FOUND}
    RETURNING seq
), g AS (
    {_COUNT_IN}
    RETURNING m.seq, g.depth
), dropped AS (
    DELETE FROM {{s}}.groups WHERE group_id = :group_id AND depth = 0 AND {_FOUND}
)
SELECT (SELECT seq FROM g),
       (SELECT {_NOTIFY} FROM g WHERE depth = 1 AND {_ANY_WAITER}), {_FOUND}
""",
    ("group_id", "now", "priority", "event"),
)

# publish_many, first: lock every group of the batch, in group order (so two batches never
# deadlock), creating the new ones, and count the batch in. A new group gets its head
# once its seqs are drawn; head_seq 0 marks it until then (seqs start at 1).
LOCK_GROUPS: Final = Statement(
    """
INSERT INTO {s}.groups (group_id, priority, head_seq, depth)
SELECT g, p, 0, n
  FROM unnest(:group_ids::text[], :priorities::smallint[], :counts::integer[]) AS b (g, p, n)
 ORDER BY g
ON CONFLICT (group_id) DO UPDATE SET depth = {s}.groups.depth + excluded.depth
""",
    ("group_ids", "priorities", "counts"),
)
# A batch's seqs, one for each of its events, in order (`s.seqs`): the k-th smallest
# drawn is for its k-th message, whatever order the sequence was read in, so a group's
# seq order is the batch's order.
_DRAW_SEQS = """SELECT array_agg(seq ORDER BY seq) AS seqs
      FROM (SELECT nextval('{s}.seqs') AS seq
              FROM generate_series(1, cardinality(:events::text[]))) drawn"""
# Every message of the batch stored under its seq.
_STORE_BATCH = f"""INSERT INTO {{s}}.messages (group_id, seq, priority, event, group_priority,
                                ready_at)
    SELECT b.g, s.seqs[b.n], b.p, b.e,
           (SELECT priority FROM {{s}}.groups x WHERE x.group_id = b.g), {_NOW}
      FROM s, unnest(:group_ids::text[], :priorities::smallint[], :events::text[])
              WITH ORDINALITY AS b (g, p, e, n)"""


def _new_heads(gate: str = "") -> str:
    # Each new group of the batch (head_seq 0) given the seq of its first message
    # (:firsts, its place in the batch) as its head (see APPEND_MANY), if ``gate``.
    return f"""INSERT INTO {{s}}.groups (group_id, priority, head_seq, depth, paused)
    SELECT f.g, 0, s.seqs[f.i], 0,
           EXISTS (SELECT 1 FROM {{s}}.paused p WHERE p.group_id = f.g)
      FROM s, unnest(:groups::text[], :firsts::integer[]) AS f (g, i)
     WHERE {gate}(SELECT head_seq FROM {{s}}.groups WHERE group_id = f.g) = 0
    ON CONFLICT (group_id) DO UPDATE SET head_seq = excluded.head_seq, paused = excluded.paused
    RETURNING 1"""


# Then, in a fresh statement under those locks: a seq for each message of the batch, the
# k-th smallest drawn for its k-th message, whatever order the sequence was read in (so
# a group's seq order is the batch's order); the messages stored; each new group's head
# set to the seq of its first message (:firsts, its place in the batch), and a blocked
# claim woken. The seqs come back in the batch's order. Every group of the batch has its
# row by now, locked: the new ones (head_seq 0, each looked up by its key) go through an
# INSERT that only ever conflicts, and so finds each row through the key; an UPDATE
# joined to the batch would trade that for a scan of the whole table when the planner
# has no statistics.
APPEND_MANY: Final = Statement(
    f"""
WITH s AS (
    {_DRAW_SEQS}
), m AS (
    {_STORE_BATCH}
), h AS (
    {_new_heads()}
)
SELECT s.seqs, (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM h) AND {_ANY_WAITER})
  FROM s
""",
    ("events", "group_ids", "priorities", "groups", "firsts", "now"),
)

# --- idempotency keys ------------------------------------------------------------------------

# The key's row after an INSERT ... ON CONFLICT that proposed a new one: a row that has
# outlived its window counts as absent and takes the proposed seq and expiry; a live one
# keeps its own, so its seq (the original message's) comes back. An unconditional DO
# UPDATE, not DO NOTHING: a conflicting row committed after the statement's snapshot was
# taken (by a publish this one waited for) is invisible to a plain read in the same
# statement, while the row an upsert locks and returns is always the newest.
_KEY_UPSERT = f"""
    ON CONFLICT (group_id, key) DO UPDATE
    SET seq = CASE WHEN k.expires_at <= {_NOW} THEN excluded.seq ELSE k.seq END,
        expires_at = CASE WHEN k.expires_at <= {_NOW}
                          THEN excluded.expires_at ELSE k.expires_at END
    RETURNING k.group_id, k.key, k.seq"""

# Every keyed publish forgets a few keys that have outlived their window, oldest first,
# through keys_expiry, so the table never needs a sweep and a publish never reads more
# than it deletes. Rows another transaction has locked (a publish overwriting its expired
# key) are skipped, not waited for. The selection waits for the publish's own upsert (`k`)
# to finish first (the one-time filter that counts its rows runs before the scan): a
# transaction then waits for another's key row only while upserting and never once it is
# forgetting, so two publishes forgetting each other's expired keys cannot deadlock. The
# rows are deleted through their keys as arrays and the ctids their lock pinned, a TID
# scan whatever the table's size when the plan was made (joined to the selection, a
# generic plan made while the table was small hashes the whole table on every publish).
FORGET_BATCH: Final = 8
_FORGET_KEYS = f"""
), old AS MATERIALIZED (
    SELECT group_id, key, ctid FROM {{s}}.keys
     WHERE expires_at <= {_NOW} AND (SELECT count(*) FROM k) >= 0
     ORDER BY expires_at LIMIT {FORGET_BATCH}
       FOR UPDATE SKIP LOCKED
), forgot AS (
    DELETE FROM {{s}}.keys
     WHERE group_id = ANY (ARRAY(SELECT group_id FROM old))
       AND key = ANY (ARRAY(SELECT key FROM old))
       AND ctid = ANY (ARRAY(SELECT ctid FROM old))"""

# A keyed publish, in a fresh statement under the group's lock (LOCK_GROUP), so a
# publish of the same key is either committed and seen or waiting for this one. The seq
# is drawn first and offered with the key; if the key's row keeps another seq, the
# publish is a duplicate of it: no message is stored, and a group row that LOCK_GROUP
# created for it (depth 0: a committed group always has a message) goes again. The
# drawn seq is then never used, a gap like a rollback's.
KEYED_APPEND: Final = Statement(
    f"""
WITH {_DUE_HERE}, t AS MATERIALIZED (
    SELECT nextval('{{s}}.seqs') AS seq WHERE NOT {_FOUND}
), k AS (
    INSERT INTO {{s}}.keys AS k (group_id, key, seq, expires_at)
    SELECT :group_id, :key, t.seq, {_NOW} + :window FROM t{_KEY_UPSERT}
), new AS (
    SELECT k.seq FROM k, t WHERE k.seq = t.seq
), m AS (
    INSERT INTO {{s}}.messages (group_id, seq, priority, event, group_priority, ready_at)
    SELECT :group_id, new.seq, :priority, :event, {_GROUP_PRIORITY}, {_NOW} FROM new
    RETURNING seq
), g AS (
    {_COUNT_IN}
    RETURNING g.depth
), dropped AS (
    DELETE FROM {{s}}.groups
     WHERE group_id = :group_id AND depth = 0 AND NOT EXISTS (SELECT 1 FROM new){_FORGET_KEYS}
)
SELECT (SELECT seq FROM k), EXISTS (SELECT 1 FROM new),
       (SELECT {_NOTIFY} FROM g WHERE g.depth = 1 AND {_ANY_WAITER}), {_FOUND}
""",
    ("group_id", "now", "key", "window", "priority", "event"),
)

# A publish_many with keys, after LOCK_GROUPS, which counted every message sent in (the
# batch holds no key twice: the caller keeps the first, since one statement may not
# upsert a row twice). Every message draws a seq, in the batch's order (see APPEND_MANY);
# the keyed ones offer theirs with their keys, and a message is stored unless its key's
# row kept another seq. Only a group that needs it is written again: a new one (head_seq
# 0) gets its first stored message as its head, one with duplicates is counted down by
# them, and a new one that stored nothing goes again (never written twice: one statement
# may not). The seqs come back twice in the batch's order: as drawn, and as each
# message's key kept it (where they differ, a duplicate).
APPEND_MANY_KEYED: Final = Statement(
    f"""
WITH s AS (
    {_DRAW_SEQS}
), b AS MATERIALIZED (
    SELECT b.g, b.p, b.e, b.k, b.n, s.seqs[b.n] AS seq
      FROM s, unnest(:group_ids::text[], :priorities::smallint[], :events::text[],
                     :keys::text[]) WITH ORDINALITY AS b (g, p, e, k, n)
), k AS (
    INSERT INTO {{s}}.keys AS k (group_id, key, seq, expires_at)
    SELECT b.g, b.k, b.seq, {_NOW} + :window FROM b WHERE b.k IS NOT NULL{_KEY_UPSERT}
), kept AS MATERIALIZED (
    SELECT b.g, b.p, b.e, b.seq, b.k IS NULL OR b.seq IN (SELECT k.seq FROM k) AS stored
      FROM b
), m AS (
    INSERT INTO {{s}}.messages (group_id, seq, priority, event, group_priority, ready_at)
    SELECT g, seq, p, e, (SELECT priority FROM {{s}}.groups x WHERE x.group_id = kept.g),
           {_NOW}
      FROM kept WHERE stored
), per AS MATERIALIZED (
    SELECT kept.g, min(kept.seq) FILTER (WHERE kept.stored) AS head,
           count(*) FILTER (WHERE NOT kept.stored) AS dups,
           (SELECT head_seq = 0 FROM {{s}}.groups WHERE group_id = kept.g) AS fresh
      FROM kept GROUP BY kept.g
), fixed AS (
    INSERT INTO {{s}}.groups (group_id, priority, head_seq, depth, paused)
    SELECT g, 0, coalesce(head, 0), dups,
           EXISTS (SELECT 1 FROM {{s}}.paused p WHERE p.group_id = per.g) FROM per
     WHERE (fresh AND head IS NOT NULL) OR (dups > 0 AND NOT fresh)
    ON CONFLICT (group_id) DO UPDATE
    SET depth = {{s}}.groups.depth - excluded.depth,
        head_seq = CASE WHEN {{s}}.groups.head_seq = 0 THEN excluded.head_seq
                        ELSE {{s}}.groups.head_seq END,
        paused = CASE WHEN {{s}}.groups.head_seq = 0 THEN excluded.paused
                      ELSE {{s}}.groups.paused END
), dropped AS (
    DELETE FROM {{s}}.groups
     WHERE group_id IN (SELECT g FROM per WHERE fresh AND head IS NULL){_FORGET_KEYS}
)
SELECT (SELECT array_agg(b.seq ORDER BY b.n) FROM b),
       (SELECT array_agg(coalesce(k.seq, b.seq) ORDER BY b.n)
          FROM b LEFT JOIN k ON k.group_id = b.g AND k.key = b.k),
       (SELECT {_NOTIFY}
         WHERE EXISTS (SELECT 1 FROM per WHERE fresh AND head IS NOT NULL) AND {_ANY_WAITER})
""",
    ("events", "group_ids", "priorities", "keys", "now", "window"),
)

# A publish_many with keys, first try, after LOCK_GROUPS: the common batch, whose keys are
# all new, in the shape of APPEND_MANY, each key stored by a plain INSERT beside its
# message. Under the batch's group locks the keys are looked up first (`seen`): a key is
# only ever stored under its group's lock, so in a fresh statement (read committed) a key
# that is not found cannot appear before this transaction ends, and the plain INSERT
# stores it without the conflict check of an upsert. (In a caller's repeatable read or
# serializable transaction, a key committed after the snapshot is not found: its INSERT
# then fails on the primary key, which `within` reports as a serialization failure.)
# If any key of the batch is already there, live or expired, nothing is stored: the
# counts LOCK_GROUPS added are taken back (the groups it created, head_seq 0, go again),
# and the batch runs again as LOCK_GROUPS then APPEND_MANY_KEYED. Every gate is a
# one-time filter, so the branch not taken costs nothing. Each key is looked up through
# the primary key, by a subquery per item: joined to the batch, a generic plan made while
# the table was small reads the whole table.
_SEEN = "(SELECT found FROM seen)"
APPEND_MANY_NEW_KEYS: Final = Statement(
    f"""
WITH seen AS MATERIALIZED (
    SELECT EXISTS (
        SELECT 1 FROM unnest(:group_ids::text[], :keys::text[]) AS b (g, k)
         WHERE (SELECT true FROM {{s}}.keys x WHERE x.group_id = b.g AND x.key = b.k)
    ) AS found
), s AS (
    {_DRAW_SEQS}
     WHERE NOT {_SEEN}
), m AS (
    {_STORE_BATCH}
     WHERE NOT {_SEEN}
), k AS (
    INSERT INTO {{s}}.keys (group_id, key, seq, expires_at)
    SELECT b.g, b.k, s.seqs[b.n], {_NOW} + :window
      FROM s, unnest(:group_ids::text[], :keys::text[]) WITH ORDINALITY AS b (g, k, n)
     WHERE NOT {_SEEN} AND b.k IS NOT NULL
    RETURNING 1
), h AS (
    {_new_heads(f"NOT {_SEEN} AND ")}
), undone AS (
    UPDATE {{s}}.groups g
       SET depth = g.depth - (:counts::integer[])[array_position(:groups::text[], g.group_id)]
     WHERE {_SEEN} AND g.group_id = ANY (:groups::text[]) AND g.head_seq <> 0
), unmade AS (
    DELETE FROM {{s}}.groups
     WHERE {_SEEN} AND group_id = ANY (:groups::text[]) AND head_seq = 0{_FORGET_KEYS}
)
SELECT {_SEEN}, (SELECT seqs FROM s),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM h) AND {_ANY_WAITER})
""",
    ("group_ids", "keys", "events", "priorities", "now", "window", "groups", "firsts", "counts"),
)

# --- claim ------------------------------------------------------------------------------------

# At most this many groups are woken per claim: a bound the planner sees (so a generic
# plan seeks the index rather than hashing the table), and the next claim wakes the rest.
WAKE_BATCH: Final = 64

# Lapsed leases and ended parks make their groups free again. Only busy_until changes: the
# lease columns stay, so the lapsed worker's ack, nack or extend still matches until the
# group is claimed again. Groups another claimer is waking are skipped, not waited for.
# The locked rows are updated by their key, an index seek: matched by ctid instead, the
# planner scans the whole table for every claim, lapsed groups or none.
WAKE_LAPSED: Final = Statement(
    f"""
UPDATE {{s}}.groups SET busy_until = NULL
 WHERE group_id = ANY (ARRAY(
    SELECT group_id FROM {{s}}.groups WHERE busy_until < {_NOW}
     ORDER BY busy_until LIMIT {WAKE_BATCH}
       FOR NO KEY UPDATE SKIP LOCKED))
""",
    ("now",),
)


def _claim(guard: str, names: tuple[str, ...] = ()) -> Statement:
    # The oldest-served free group at or above the floor, locked, or skipped if another
    # claimer holds it: exclusivity is the row lock, never a unique violation or an
    # advisory lock. Its head is leased and the group goes to the back of the round-robin.
    # What comes back: the lease, the head's event and requeue base, and who held the group
    # before (a worker whose lease lapsed, or not), for the dead-letter reason.
    return Statement(
        f"""
WITH c AS (
    SELECT group_id, locked_by FROM {{s}}.groups
     WHERE free AND NOT paused AND priority >= :min_priority{guard}
     ORDER BY last_claimed_at, head_seq
     LIMIT 1
     FOR NO KEY UPDATE SKIP LOCKED
), t AS (SELECT {_NOW} AS now)
UPDATE {{s}}.groups g
   SET locked_by = :worker_id, lock_expiry = t.now + :visibility,
       busy_until = t.now + :visibility, attempt = g.attempt + 1, last_claimed_at = t.now
  FROM c, t, {{s}}.messages m, {_LEASE_COMMIT}
 WHERE g.group_id = c.group_id AND m.group_id = g.group_id AND m.seq = g.head_seq
RETURNING g.head_seq, g.group_id, m.event, g.attempt, g.lock_expiry, m.base, c.locked_by
""",
        ("min_priority", *names, "now", "worker_id", "visibility", "lease_commit"),
    )


# A claim's first try, one statement: only while no lapsed lease or ended park waits to
# be woken (the first entry of groups_busy), since a woken group may come before every
# free one in the round-robin. Finding nothing, the claim wakes the lapsed groups, then
# runs CLAIM.
# A claim needs more than one statement while a delayed message is due (it joins its
# group first) or a group has a tenant (the tenants take turns): both are one probe of
# an index that is empty while no such message or group exists.
# No group has a tenant: min() over the partial index groups_tenanted, one probe. (An
# EXISTS over the same rows was planned as a scan of the whole groups table whenever its
# statistics were missing or old, which made every claim slower as the table grew.)
_NO_TENANTS = "(SELECT min(tenant) FROM {s}.groups WHERE tenant IS NOT NULL) IS NULL"
_SIMPLE = f"""
       AND coalesce((SELECT min(due) FROM {{s}}.timers), 'Infinity') > {_NOW}
       AND {_NO_TENANTS}"""
_READY = (
    f"\n       AND coalesce((SELECT min(busy_until) FROM {{s}}.groups), 'Infinity') >= {_NOW}"
    + _SIMPLE
)
CLAIM_READY: Final = _claim(_READY)
CLAIM_SIMPLE: Final = _claim(_SIMPLE)
CLAIM: Final = _claim("")
# A claim in one tenant's turn: only its groups (through groups_tenant_ready), or only
# those without a tenant (through groups_ready).
CLAIM_TENANT: Final = _claim("\n       AND tenant = :tenant", ("tenant",))
CLAIM_NO_TENANT: Final = _claim("\n       AND tenant IS NULL")
# Why a claim's one-statement tries found nothing: a delayed message is due, a group has
# a tenant.
CLAIM_NEEDS: Final = Statement(
    f"""
SELECT coalesce((SELECT min(due) FROM {{s}}.timers), 'Infinity') <= {_NOW},
       NOT {_NO_TENANTS}
""",
    ("now",),
)

# claim_many's first try, one statement, for what CLAIM_READY's guard allows: the first
# :limit free groups at or above the floor in round-robin order, locked (those another
# claimer holds are skipped, as CLAIM skips them), which is the order :limit successive
# claims would take them in, since each claimed group stops being free. Each head is
# leased as CLAIM leases it; the turns are stamped :step apart (a microsecond on the
# server's clock, none with an injected one, where successive claims stamp one reading),
# so the next claim goes on with the rotation in the batch's order. With :max_attempts,
# the batch stops at the first head out of deliveries, which is leased all the same
# (that claim buries it under its fence and claims again: see `_ops.ClaimMany`). The
# heads are found one probe each. The rows are leased through the row ids their locks
# returned (and their keys, checked again on the row updated), a fetch each whatever
# the planner believes of the table's size: joined by key alone, a plan made while the
# table was small scans all of it once per group of the batch. A row that a commit
# changed after the statement's snapshot was taken is locked in its new version, which
# the snapshot does not see: it is left as it is, as if the lock had been taken by the
# one who changed it a moment before (SKIP LOCKED passes over such a row too), and the
# next claim takes it. The leases come back in the order they were taken.
CLAIM_MANY: Final = Statement(
    f"""
WITH c AS MATERIALIZED (
    SELECT ctid AS at, group_id, locked_by, head_seq, attempt, last_claimed_at
      FROM {{s}}.groups
     WHERE free AND NOT paused AND priority >= :min_priority
       AND coalesce((SELECT min(busy_until) FROM {{s}}.groups), 'Infinity') >= {_NOW}{_SIMPLE}
     ORDER BY last_claimed_at, head_seq
     LIMIT :limit
     FOR NO KEY UPDATE SKIP LOCKED
), o AS MATERIALIZED (
    SELECT c.at, c.group_id, c.locked_by, m.event, m.base,
           row_number() OVER (ORDER BY c.last_claimed_at, c.head_seq) AS n,
           c.attempt - m.base >= :max_attempts::integer AS spent
      FROM c CROSS JOIN LATERAL (
        SELECT event, base FROM {{s}}.messages m
         WHERE m.group_id = c.group_id AND m.seq = c.head_seq LIMIT 1) m
), k AS MATERIALIZED (
    SELECT o.* FROM o
     WHERE o.n <= coalesce((SELECT min(n) FROM o WHERE spent), :limit)
), t AS (SELECT {_NOW} AS now), u AS (
    UPDATE {{s}}.groups g
       SET locked_by = :worker_id, lock_expiry = t.now + :visibility,
           busy_until = t.now + :visibility, attempt = g.attempt + 1,
           last_claimed_at = t.now + (k.n - 1) * :step::float8
      FROM k, t, {_LEASE_COMMIT}
     WHERE g.ctid = ANY (ARRAY(SELECT at FROM k)) AND g.ctid = k.at AND g.group_id = k.group_id
    RETURNING g.head_seq, g.group_id, k.event, g.attempt, g.lock_expiry, k.base, k.locked_by, k.n
)
SELECT head_seq, group_id, event, attempt, lock_expiry, base, locked_by FROM u ORDER BY n
""",
    (
        "min_priority",
        "now",
        "limit",
        "max_attempts",
        "worker_id",
        "visibility",
        "step",
        "lease_commit",
    ),
)

# --- settle -------------------------------------------------------------------------------------

# ack, nack, extend and bury act only on the current lease: the group's head is that seq,
# held by the same worker with the same attempt. A re-claim bumps attempt, so a stale
# worker matches no row.
_FENCE = (
    "group_id = :group_id AND head_seq = :seq AND locked_by = :worker_id AND attempt = :attempt"
)
FENCE_NAMES: Final = ("group_id", "seq", "worker_id", "attempt")
# The same, on the groups row named g in a statement that joins it.
_G_FENCE = "g." + _FENCE.replace(" AND ", " AND g.")

# First lock the group, fenced: a publish to it that is committing now finishes first.
LOCK_LEASE: Final = Statement(f"SELECT 1 FROM {{s}}.groups WHERE {_FENCE} FOR UPDATE", FENCE_NAMES)


# An acked head's group moves to its next message (`nxt`), free, with the deliveries it had.
# A next head published with hold=True and not due yet holds its group as a park does,
# until it is due (see DELAYED).
_HELD_UNTIL = f"CASE WHEN nxt.not_before > {_NOW} THEN nxt.not_before END"
_TO_NEXT = f"""SET head_seq = coalesce(nxt.id, nxt.seq), attempt = nxt.attempt,
           depth = g.depth - 1,
           locked_by = CASE WHEN nxt.not_before > {_NOW} THEN '{DELAYED}' END,
           lock_expiry = {_HELD_UNTIL}, busy_until = {_HELD_UNTIL}"""
# A next head that joined its group when due (under a later place) moves back under its
# own seq: nothing is left before it (see TIMERS_SCHEMA).
_MOVE_BACK = """UPDATE {s}.messages m SET seq = nxt.id, id = NULL
      FROM nxt
     WHERE nxt.id IS NOT NULL AND m.group_id = :group_id AND m.seq = nxt.seq"""


def _remove_head(holds: str, names: tuple[str, ...]) -> Statement:
    # Run in a fresh statement once the group row is locked, so its snapshot includes any
    # publish that committed meanwhile: the head goes, and the next message (the first seq
    # above it) becomes the head, free, with the deliveries it had; a group with none left
    # goes too. A blocked claim is woken when a group becomes ready.
    return Statement(
        f"""
WITH lease AS (
    SELECT 1 FROM {{s}}.groups WHERE {holds}
), gone AS (
    DELETE FROM {{s}}.messages
     WHERE group_id = :group_id AND seq = :seq AND EXISTS (SELECT 1 FROM lease)
    RETURNING seq
), nxt AS (
    SELECT seq, attempt, id, not_before FROM {{s}}.messages
     WHERE group_id = :group_id AND seq > :seq AND EXISTS (SELECT 1 FROM lease)
     ORDER BY seq LIMIT 1
), moved AS (
    UPDATE {{s}}.groups g {_TO_NEXT}
      FROM nxt
     WHERE g.group_id = :group_id
    RETURNING g.busy_until IS NULL AS ready
), back AS (
    {_MOVE_BACK}
), dropped AS (
    DELETE FROM {{s}}.groups
     WHERE group_id = :group_id AND EXISTS (SELECT 1 FROM lease)
       AND NOT EXISTS (SELECT 1 FROM nxt)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM moved) AND {_ANY_WAITER}),
       (SELECT count(*) FROM dropped)
""",
        (*names, "now"),
    )


ACK: Final = _remove_head(_FENCE, FENCE_NAMES)

# An ack's first try, one statement that takes no lock beforehand. Its UPDATE or DELETE of
# the group row waits for a publish that holds the row, then works on the row as that
# publish committed it: PostgreSQL evaluates the WHERE and SET of a row it had to wait
# for again, on the row's newest version. The statement's snapshot, older, can miss only
# that publish's message, whose seq is above all the group had: the next head it finds is
# the right one. Finding none, it drops the group only if the row still has one message;
# otherwise it changes nothing and says whether the lease was held when it began, and the
# ack runs again as LOCK_LEASE then ACK.
def _ack_at_once(mark: str = "") -> Statement:
    return Statement(
        f"""
WITH nxt AS (
    SELECT seq, attempt, id, not_before FROM {{s}}.messages
     WHERE group_id = :group_id AND seq > :seq
     ORDER BY seq LIMIT 1
), moved AS (
    UPDATE {{s}}.groups g {_TO_NEXT}
      FROM nxt
     WHERE {_G_FENCE}
    RETURNING 1
), back AS (
    {_MOVE_BACK} AND EXISTS (SELECT 1 FROM moved)
), dropped AS (
    DELETE FROM {{s}}.groups
     WHERE {_FENCE} AND depth = 1 AND NOT EXISTS (SELECT 1 FROM nxt)
    RETURNING 1
), gone AS (
    DELETE FROM {{s}}.messages
     WHERE group_id = :group_id AND seq = :seq
       AND EXISTS (SELECT 1 FROM moved UNION ALL SELECT 1 FROM dropped)
    RETURNING 1
)
SELECT g.n, (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM moved) AND {_ANY_WAITER}),
       CASE WHEN g.n = 0 THEN EXISTS (SELECT 1 FROM {{s}}.groups WHERE {_FENCE}) END{mark}
  FROM (SELECT count(*) AS n FROM gone) g
""",
        (*FENCE_NAMES, "now"),
    )


ACK_AT_ONCE: Final = _ack_at_once()
# ack_and_claim's first try, in one transaction and one round trip: ACK_AT_ONCE, which
# also notes in a setting local to the transaction whether it removed the head, then
# CLAIM_AFTER_ACK, which claims only if it did. A stale lease (or an ack that must run
# again under the group's lock) so claims nothing, with no round trip to ask in between.
_ACKED = "transports.acked"
ACK_AT_ONCE_MARKED: Final = _ack_at_once(
    f",\n       set_config('{_ACKED}', CASE WHEN g.n = 1 THEN 'yes' ELSE 'no' END, true)"
)
CLAIM_AFTER_ACK: Final = _claim(
    _READY + f"\n       AND current_setting('{_ACKED}', true) IS NOT DISTINCT FROM 'yes'"
)

# ack_many, first: every group of the batch locked, in group order (as publish_many locks
# its groups, so the two never deadlock), by key whatever its lease (as a settle in a
# caller's transaction locks its group: in repeatable read, a group changed since the
# snapshot then fails with a serialization error, where its fence read in the snapshot
# would report a current lease as lost). Then ACK_MANY, in a fresh statement whose
# snapshot sees any publish that committed before these locks were granted. Each group
# is locked by a probe of its key, one after the other in the sorted list's order (a
# nested loop keeps its outer order): a plan that found them all at once, by a scan of
# the table and a sort, is what the planner picks while the table is small.
LOCK_BATCH_GROUPS: Final = Statement(
    """
SELECT 1
  FROM (SELECT group_id FROM unnest(:group_ids::text[]) AS b (group_id) ORDER BY group_id) b
 CROSS JOIN LATERAL (
    SELECT 1 FROM {s}.groups g WHERE g.group_id = b.group_id FOR UPDATE) x
""",
    ("group_ids",),
)
_BATCH_FENCES = (
    "unnest(:group_ids::text[], :seqs::bigint[], :worker_ids::text[], :attempts::integer[]) "
    "WITH ORDINALITY AS b (group_id, seq, worker_id, attempt, n)"
)
BATCH_FENCE_NAMES: Final = ("group_ids", "seqs", "worker_ids", "attempts")
# Every current lease of the batch (its groups distinct, locked by LOCK_BATCH_GROUPS) acked as
# ACK acks one: its head goes, the next message becomes the head, free, with the
# deliveries it had (moved back under its own seq if it joined when due; held if not
# due), and a group with none left goes. Each group row, head and next message is found
# by a probe of its key (a lateral subquery with LIMIT 1: the planner cannot turn it
# into a join that reads the whole table, as it does while a table is small), and every
# row is then changed through the row id found: under their groups' locks, taken before
# this statement's snapshot, none of them can move (the keys are checked again on the
# rows changed all the same). What comes back: the places (1-based) in the batch of the
# leases acked; a blocked claim is woken.
ACK_MANY: Final = Statement(
    f"""
WITH lease AS MATERIALIZED (
    SELECT b.group_id, b.seq, b.n, g.at, h.head
      FROM {_BATCH_FENCES}
     CROSS JOIN LATERAL (
        SELECT g.ctid AS at FROM {{s}}.groups g
         WHERE g.group_id = b.group_id AND g.head_seq = b.seq AND g.locked_by = b.worker_id
           AND g.attempt = b.attempt
         LIMIT 1) g
     CROSS JOIN LATERAL (
        SELECT m.ctid AS head FROM {{s}}.messages m
         WHERE m.group_id = b.group_id AND m.seq = b.seq LIMIT 1) h
), nxt AS MATERIALIZED (
    SELECT lease.group_id, lease.at AS g_at, x.*
      FROM lease LEFT JOIN LATERAL (
        SELECT m.ctid AS at, m.seq, m.attempt, m.id, m.not_before FROM {{s}}.messages m
         WHERE m.group_id = lease.group_id AND m.seq > lease.seq
         ORDER BY m.seq LIMIT 1) x ON true
), gone AS (
    DELETE FROM {{s}}.messages
     WHERE ctid = ANY (ARRAY(SELECT head FROM lease))
       AND group_id = ANY (ARRAY(SELECT group_id FROM lease))
), moved AS (
    UPDATE {{s}}.groups g {_TO_NEXT}
      FROM nxt
     WHERE g.ctid = ANY (ARRAY(SELECT g_at FROM nxt WHERE seq IS NOT NULL))
       AND g.ctid = nxt.g_at AND g.group_id = nxt.group_id AND nxt.seq IS NOT NULL
    RETURNING 1
), back AS (
    UPDATE {{s}}.messages m SET seq = nxt.id, id = NULL
      FROM nxt
     WHERE m.ctid = ANY (ARRAY(SELECT at FROM nxt WHERE id IS NOT NULL))
       AND m.ctid = nxt.at AND m.group_id = nxt.group_id AND nxt.id IS NOT NULL
), dropped AS (
    DELETE FROM {{s}}.groups
     WHERE ctid = ANY (ARRAY(SELECT g_at FROM nxt WHERE seq IS NULL))
       AND group_id = ANY (ARRAY(SELECT group_id FROM nxt WHERE seq IS NULL))
)
SELECT (SELECT coalesce(array_agg(n ORDER BY n), '{{}}') FROM lease),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM moved) AND {_ANY_WAITER})
""",
    (*BATCH_FENCE_NAMES, "now"),
)

# A nack with a delay parks the head until then, holding the group.
RELEASE: Final = Statement(
    f"""
UPDATE {{s}}.groups g SET locked_by = :locked_by, lock_expiry = {_NOW} + :delay,
       busy_until = {_NOW} + :delay
  FROM {_LEASE_COMMIT}
 WHERE {_G_FENCE}
""",
    (*FENCE_NAMES, "locked_by", "now", "delay", "lease_commit"),
)
# A nack with no delay frees the group: lock_expiry and busy_until go NULL.
FREE: Final = Statement(
    f"""
WITH r AS (
    UPDATE {{s}}.groups g SET locked_by = NULL, lock_expiry = NULL, busy_until = NULL
      FROM {_LEASE_COMMIT}
     WHERE {_G_FENCE}
    RETURNING 1
)
SELECT (SELECT count(*) FROM r),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM r) AND {_ANY_WAITER})
""",
    (*FENCE_NAMES, "lease_commit"),
)

# A lease that an async claim took after its task was cancelled, given back by the runner
# that took it: the group is free at once, and the claim's increment of attempt is undone
# (it was not a delivery: nobody saw the message), so the next claim's lease carries the
# same attempt number. Fenced like a settle, so a lease that lapsed and was claimed again
# meanwhile is left alone. The turn in the round-robin the claim took is not given back.
# A blocked claim is woken.
UNCLAIM: Final = Statement(
    f"""
WITH r AS (
    UPDATE {{s}}.groups g SET locked_by = NULL, lock_expiry = NULL, busy_until = NULL,
           attempt = g.attempt - 1
     WHERE {_G_FENCE}
    RETURNING 1
)
SELECT (SELECT count(*) FROM r),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM r) AND {_ANY_WAITER})
""",
    FENCE_NAMES,
)

EXTEND: Final = Statement(
    f"""
UPDATE {{s}}.groups g SET lock_expiry = {_NOW} + :visibility, busy_until = {_NOW} + :visibility
  FROM {_LEASE_COMMIT}
 WHERE {_G_FENCE}
RETURNING g.lock_expiry
""",
    (*FENCE_NAMES, "now", "visibility", "lease_commit"),
)

# --- dead letters -----------------------------------------------------------------------------

# The head, fenced by the lease that delivered it, copied to the dead letters.
BURY: Final = Statement(
    f"""
INSERT INTO {{s}}.dead_letters (seq, group_id, priority, event, attempts, reason, dead_at)
SELECT m.seq, m.group_id, m.priority, m.event, :attempts, :reason, {_NOW}
  FROM {{s}}.messages m JOIN {{s}}.groups g ON g.group_id = m.group_id AND g.head_seq = m.seq
 WHERE {_G_FENCE}
""",
    (*FENCE_NAMES, "attempts", "reason", "now"),
)

# on_dead=hold: the dead letter stays its group's head, parked for ever, so nothing later
# in the group is delivered. Its attempt is the deliveries it really had. It is never
# ready while held: its ready_at goes to 'Infinity', past every stats read's range.
HOLD_GROUP: Final = Statement(
    f"""
WITH g AS (
    UPDATE {{s}}.groups SET locked_by = :parked, lock_expiry = 'Infinity',
           busy_until = 'Infinity', attempt = :attempts
     WHERE {_FENCE}
    RETURNING group_id, head_seq
)
UPDATE {{s}}.messages m SET ready_at = 'Infinity'
  FROM g
 WHERE m.group_id = g.group_id AND m.seq = g.head_seq
""",
    (*FENCE_NAMES, "parked", "attempts"),
)

_HELD_HEAD = "group_id = :group_id AND head_seq = :seq AND lock_expiry = 'Infinity'"
# A discarded held dead letter leaves its group, which goes on with its next message.
DROP_HELD_HEAD: Final = _remove_head(_HELD_HEAD, ("group_id", "seq"))

# A requeued held dead letter is still its group's head: freed, with a fresh allowance,
# ready from now.
UNHOLD_GROUP: Final = Statement(
    f"""
WITH g AS (
    UPDATE {{s}}.groups SET locked_by = NULL, lock_expiry = NULL, busy_until = NULL
     WHERE {_HELD_HEAD}
    RETURNING group_id, head_seq, attempt
), m AS (
    UPDATE {{s}}.messages m SET base = g.attempt, ready_at = {_NOW} FROM g
     WHERE m.group_id = g.group_id AND m.seq = g.head_seq
)
SELECT (SELECT count(*) FROM g),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM g) AND {_ANY_WAITER})
""",
    ("group_id", "seq", "now"),
)

# The dead letter, locked, and whether it holds its group (it is still in `messages`).
DEAD_LETTER: Final = Statement(
    """
SELECT d.group_id, d.attempts,
       EXISTS (SELECT 1 FROM {s}.messages m WHERE m.group_id = d.group_id AND m.seq = d.seq)
  FROM {s}.dead_letters d WHERE d.seq = :seq
   FOR UPDATE
""",
    ("seq",),
)

# Who holds the group, locked: a worker's lease (lapsed ones included: they can still be
# acked, which would act on the new head) or a held dead letter. A park is fine.
GROUP_HOLDER: Final = Statement(
    f"""
SELECT locked_by, head_seq, lock_expiry = 'Infinity' FROM {{s}}.groups
 WHERE group_id = :group_id
   AND (locked_by NOT IN (:parked, '{DELAYED}') OR lock_expiry = 'Infinity')
   FOR UPDATE
""",
    ("group_id", "parked"),
)
LOCK_GROUP_ROW: Final = Statement(
    "SELECT 1 FROM {s}.groups WHERE group_id = :group_id FOR UPDATE", ("group_id",)
)

# A displaced head keeps its deliveries in its own row, for when it is the head again.
STASH_HEAD_ATTEMPT: Final = Statement(
    """
UPDATE {s}.messages m SET attempt = g.attempt
  FROM {s}.groups g
 WHERE g.group_id = :group_id AND g.head_seq > :seq
   AND m.group_id = g.group_id AND m.seq = g.head_seq
""",
    ("group_id", "seq"),
)
# The dead letter back under its own seq, in its place, ready from now; the group
# (re)opened around it (RESTORE_HEAD, next), keeping its priority if it has messages.
RESTORE_MESSAGE: Final = Statement(
    f"""
INSERT INTO {{s}}.messages (group_id, seq, priority, event, attempt, base, group_priority,
                           ready_at)
SELECT d.group_id, d.seq, d.priority, d.event, d.attempts, d.attempts,
       coalesce((SELECT g.priority FROM {{s}}.groups g WHERE g.group_id = d.group_id),
                d.priority),
       {_NOW}
  FROM {{s}}.dead_letters d
 WHERE d.seq = :seq
""",
    ("seq", "now"),
)
RESTORE_HEAD: Final = Statement(
    f"""
WITH g AS (
    INSERT INTO {{s}}.groups (group_id, priority, head_seq, depth, attempt, paused)
    SELECT d.group_id, d.priority, d.seq, 1, d.attempts,
           EXISTS (SELECT 1 FROM {{s}}.paused p WHERE p.group_id = d.group_id)
      FROM {{s}}.dead_letters d WHERE d.seq = :seq
    ON CONFLICT (group_id) DO UPDATE
    SET head_seq = least({{s}}.groups.head_seq, excluded.head_seq),
        attempt = CASE WHEN excluded.head_seq < {{s}}.groups.head_seq
                       THEN excluded.attempt ELSE {{s}}.groups.attempt END,
        depth = {{s}}.groups.depth + 1
    RETURNING busy_until IS NULL AS ready
)
SELECT (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM g WHERE ready) AND {_ANY_WAITER})
""",
    ("seq",),
)
FORGET_DEAD_LETTER: Final = Statement("DELETE FROM {s}.dead_letters WHERE seq = :seq", ("seq",))

# --- admin ------------------------------------------------------------------------------------

# Per group priority. Only a head can be leased or parked; the messages behind it count as
# ready. A held dead letter is counted as dead only. One scan of `groups` (as groups()
# reads it), which also counts the groups: ready, those whose head a claim may take now
# (free, or its lease lapsed or park ended; not paused; not a held dead letter, not a
# hold=True head not due), and busy, the others with a queued message (a held dead letter
# with nothing behind it has none). A group opened only by a delayed message that is due
# but has not joined it yet is not here: every admin read first lets due messages join
# (`_ops._Read`), so only one that came due since is missed, and its message with it.
# Then, per priority found, the age of its oldest ready message: the front of that
# priority's part of messages_ready, up to now (a held message not due, and a held dead
# letter, lie past now), passing over the heads leased or parked, each checked by a probe
# of its group's key; so it reads one entry, plus one per such head older than the
# oldest ready message (at most the in-flight and parked counts), never the backlog.
_OPEN = "(locked_by IS NULL OR lock_expiry < t.now)"
MESSAGE_COUNTS: Final = Statement(
    f"""
WITH t AS MATERIALIZED (SELECT {_NOW} AS now), c AS (
    SELECT priority,
           sum(depth - (locked_by IS NOT NULL AND locked_by <> '{DELAYED}'
                        AND lock_expiry >= t.now)::int)::bigint AS ready,
           count(*) FILTER (WHERE locked_by NOT IN (:parked, '{DELAYED}')
                              AND lock_expiry >= t.now) AS leased,
           count(*) FILTER (WHERE locked_by = :parked AND lock_expiry >= t.now
                              AND lock_expiry < 'Infinity') AS parked,
           count(*) FILTER (WHERE depth > 0 AND NOT paused AND {_OPEN}) AS open,
           count(*) FILTER (WHERE depth > CASE WHEN lock_expiry = 'Infinity' THEN 1 ELSE 0 END)
               AS queued
      FROM {{s}}.groups, t
     GROUP BY priority
)
SELECT c.priority, c.ready, c.leased, c.parked, c.open, c.queued - c.open,
       t.now - (
        SELECT m.ready_at FROM {{s}}.messages m JOIN {{s}}.groups g ON g.group_id = m.group_id
         WHERE m.group_priority = c.priority AND m.ready_at <= t.now
           AND NOT (m.seq = g.head_seq AND g.locked_by IS NOT NULL
                    AND g.locked_by <> '{DELAYED}' AND g.lock_expiry >= t.now)
         ORDER BY m.ready_at
         LIMIT 1)
  FROM c, t
""",
    ("parked", "now"),
)
DEAD_COUNTS: Final = Statement("SELECT priority, count(*) FROM {s}.dead_letters GROUP BY priority")
# The keys still remembered (an expired row waiting to be forgotten is not): read through
# keys_expiry, so it costs one index entry per key in the window.
KEY_COUNT: Final = Statement(f"SELECT count(*) FROM {{s}}.keys WHERE expires_at > {_NOW}", ("now",))
SERVER_NOW: Final = Statement(f"SELECT {_NOW}", ("now",))
DEEPEST_GROUPS: Final = Statement(
    f"""
SELECT group_id, priority, head_seq, last_claimed_at,
       CASE WHEN locked_by = '{DELAYED}' THEN :parked ELSE locked_by END, lock_expiry, depth,
       paused, tenant
  FROM {{s}}.groups
 WHERE depth > 0
 ORDER BY depth DESC, head_seq
 LIMIT :limit
""",
    ("parked", "limit"),
)
LIST_DEAD_LETTERS: Final = Statement(
    """
SELECT d.seq, d.group_id, d.priority, d.event, d.attempts, d.reason, d.dead_at,
       EXISTS (SELECT 1 FROM {s}.messages m WHERE m.group_id = d.group_id AND m.seq = d.seq)
  FROM {s}.dead_letters d
 ORDER BY d.seq
 LIMIT :limit
""",
    ("limit",),
)
LIST_HELD_GROUPS: Final = Statement(
    """
SELECT d.group_id, d.seq, d.dead_at, g.depth - 1
  FROM {s}.dead_letters d
  JOIN {s}.groups g ON g.group_id = d.group_id AND g.head_seq = d.seq
 WHERE g.lock_expiry = 'Infinity'
 ORDER BY d.seq
""",
)
# A purge takes its locks in the order requeue and discard do (dead letters, then the
# group), so the two never deadlock.
LOCK_GROUP_DEAD_LETTERS: Final = Statement(
    "SELECT 1 FROM {s}.dead_letters WHERE group_id = :group_id ORDER BY seq FOR UPDATE",
    ("group_id",),
)
PURGE_MESSAGES: Final = Statement(
    "DELETE FROM {s}.messages WHERE group_id = :group_id RETURNING coalesce(id, seq)",
    ("group_id",),
)
PURGE_TIMERS: Final = Statement(
    "DELETE FROM {s}.timers WHERE group_id = :group_id RETURNING seq", ("group_id",)
)
PURGE_DEAD_LETTERS: Final = Statement(
    "DELETE FROM {s}.dead_letters WHERE group_id = :group_id RETURNING seq", ("group_id",)
)
DROP_GROUP: Final = Statement("DELETE FROM {s}.groups WHERE group_id = :group_id", ("group_id",))

# --- within: the caller's transaction -----------------------------------------------------------

# Which store a connection reaches: its database, its server (by when it started, which a
# restart changes) and the queue's `meta` table there (NULL: no such queue). Read on the
# transport's pool and on the caller's connection, compared before `within` writes.
IDENTITY: Final = Statement(
    """
SELECT current_database(), pg_postmaster_start_time(),
       to_regclass(quote_ident(:schema) || '.meta')::oid
""",
    ("schema",),
)

# Each operation run in a caller's transaction runs in a savepoint of ours: a failed one
# (LeaseLost included) is rolled back to it and leaves the caller's transaction usable.
SAVEPOINT: Final = Statement("SAVEPOINT durable_transports")
RELEASE_SAVEPOINT: Final = Statement("RELEASE SAVEPOINT durable_transports")
ROLLBACK_TO_SAVEPOINT: Final = Statement("ROLLBACK TO SAVEPOINT durable_transports")

# In a repeatable read or serializable transaction, the statements' own test for a waiter
# reads the snapshot, which misses a claim that began waiting after it was taken: such a
# transaction notifies unconditionally (once: PostgreSQL folds a transaction's equal
# notifications into one, delivered at its commit, and drops those of a rolled back
# savepoint).
NOTIFY_IF_SNAPSHOT: Final = Statement(
    f"""
SELECT CASE WHEN current_setting('transaction_isolation') IN ('repeatable read', 'serializable')
            THEN {_NOTIFY} END
"""
)

# --- timers, holds, pauses, tenants -----------------------------------------------------------

# The groups of the first due delayed messages (at most PROMOTE_BATCH), made (empty) if
# missing, in group order as every statement that makes several groups makes them.
# Then, in a fresh statement, TAKE_DUE_GROUPS locks those that no one else holds (a
# claim skips a group a worker's transaction holds, as CLAIM does), and their messages
# join them in another (PROMOTE). A delayed message is only ever moved or deleted under
# its group's lock.
MAKE_DUE_GROUPS: Final = Statement(
    f"""
WITH d AS MATERIALIZED (
    SELECT DISTINCT group_id FROM (
        SELECT group_id FROM {{s}}.timers WHERE due <= {_NOW}
         ORDER BY due, seq LIMIT {PROMOTE_BATCH}) first
), made AS (
    INSERT INTO {{s}}.groups (group_id, priority, head_seq, depth, paused)
    SELECT group_id, 0, 0, 0, true FROM d ORDER BY group_id
    ON CONFLICT (group_id) DO NOTHING
)
SELECT array(SELECT group_id FROM d)
""",
    ("now",),
)
TAKE_DUE_GROUPS: Final = Statement(
    """
SELECT array(SELECT group_id FROM {s}.groups WHERE group_id = ANY (:groups::text[])
              ORDER BY group_id FOR NO KEY UPDATE SKIP LOCKED)
""",
    ("groups",),
)

# The due delayed messages of the locked groups :groups (at most :limit; NULL: all) join
# the end of their groups in (due, seq) order, as if published when due: each takes a
# place drawn now, except the first of a group with no messages (new, depth 0), which
# becomes its head under its own seq, and sets the group's priority and tenant as a
# publish that made it would. Each is ready since its due time, however late it joins,
# under its group's priority (the first joiner's, for a group it opens). A group made for
# nothing (its messages joined it before) is left to DROP_EMPTY. A blocked claim is woken.
PROMOTE: Final = Statement(
    f"""
WITH t AS (
    DELETE FROM {{s}}.timers
     WHERE seq = ANY (ARRAY(
        SELECT seq FROM {{s}}.timers
         WHERE group_id = ANY (:groups::text[]) AND due <= {_NOW}
         ORDER BY due, seq LIMIT :limit))
    RETURNING seq, group_id, priority, tenant, event, due
), r AS MATERIALIZED (
    SELECT t.*, row_number() OVER (ORDER BY due, seq) AS n,
           row_number() OVER (PARTITION BY group_id ORDER BY due, seq) AS k,
           first_value(t.priority) OVER (PARTITION BY group_id ORDER BY due, seq) AS opening,
           g.depth, g.priority AS kept
      FROM t CROSS JOIN LATERAL (
        SELECT depth, priority FROM {{s}}.groups g WHERE g.group_id = t.group_id) g
), s AS (
    SELECT array_agg(x ORDER BY x) AS places
      FROM (SELECT nextval('{{s}}.seqs') AS x FROM r) drawn
), p AS MATERIALIZED (
    SELECT r.*, CASE WHEN r.depth = 0 AND r.k = 1 THEN r.seq ELSE s.places[r.n] END AS at
      FROM r, s
), m AS (
    INSERT INTO {{s}}.messages (group_id, seq, priority, event, id, group_priority, ready_at)
    SELECT group_id, at, priority, event, CASE WHEN at <> seq THEN seq END,
           CASE WHEN depth = 0 THEN opening ELSE kept END, due
      FROM p
), c AS (
    SELECT group_id, count(*) AS n, min(at) FILTER (WHERE k = 1) AS head,
           min(priority) FILTER (WHERE k = 1) AS priority,
           min(tenant) FILTER (WHERE k = 1) AS tenant
      FROM p GROUP BY group_id
), g AS (
    UPDATE {{s}}.groups g
       SET depth = g.depth + c.n,
           head_seq = CASE WHEN g.depth = 0 THEN c.head ELSE g.head_seq END,
           priority = CASE WHEN g.depth = 0 THEN c.priority ELSE g.priority END,
           tenant = CASE WHEN g.depth = 0 THEN c.tenant ELSE g.tenant END,
           paused = CASE WHEN g.depth = 0
                         THEN EXISTS (SELECT 1 FROM {{s}}.paused x WHERE x.group_id = g.group_id)
                         ELSE g.paused END
      FROM c
     WHERE g.group_id = c.group_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM p),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM g) AND {_ANY_WAITER})
""",
    ("groups", "now", "limit"),
)

# Every group of a batch locked (made empty if new), in group order, adding nothing. A
# group made here is marked paused until a message joins it (which sets its pause as
# stored), so that it enters none of the partial indexes that claims read (groups_ready,
# groups_busy): one made for a delayed message alone is dropped again (DROP_EMPTY), and
# its dead entry would otherwise sit at the front of groups_ready, where every claim
# reads, until a vacuum.
LOCK_GROUP_LIST: Final = Statement(
    """
INSERT INTO {s}.groups (group_id, priority, head_seq, depth, paused)
SELECT g, 0, 0, 0, true FROM unnest(:groups::text[]) AS b (g) ORDER BY g
ON CONFLICT (group_id) DO UPDATE SET depth = {s}.groups.depth WHERE false
""",
    ("groups",),
)
# A locked group left with no message (made for a delayed message or a duplicate) goes.
DROP_EMPTY: Final = Statement(
    "DELETE FROM {s}.groups WHERE group_id = ANY (:groups::text[]) AND depth = 0",
    ("groups",),
)

# A publish with any of a key, a delay, a hold or a tenant, in a fresh statement under
# its group's lock, after the group's due delayed messages have joined it (PROMOTE). The
# seq is drawn and offered with the key (if any) as KEYED_APPEND does; a message the
# key takes is stored as a delayed message (:due without :hold), or appended to its group
# with its not-before time (:hold). A group this makes (depth 0) takes the publish's
# priority, tenant and stored pause; a held head not due holds it as a park (DELAYED).
# The group row, made by the lock, is never dropped here: DROP_EMPTY runs after the
# batch. A blocked claim is woken: its deadline may be this message's due time.
STORE_WITH: Final = Statement(
    f"""
WITH t AS MATERIALIZED (
    SELECT nextval('{{s}}.seqs') AS seq
), k AS (
    INSERT INTO {{s}}.keys AS k (group_id, key, seq, expires_at)
    SELECT :group_id, :key, t.seq, {_NOW} + :window FROM t
     WHERE :key::text IS NOT NULL{_KEY_UPSERT}
), new AS MATERIALIZED (
    SELECT t.seq FROM t
     WHERE :key::text IS NULL OR t.seq IN (SELECT k.seq FROM k)
), tm AS (
    INSERT INTO {{s}}.timers (seq, group_id, priority, tenant, event, due)
    SELECT new.seq, :group_id, :priority, :tenant, :event, {_NOW} + :delay FROM new
     WHERE :delay::float8 > 0 AND NOT :hold::boolean
), m AS (
    INSERT INTO {{s}}.messages (group_id, seq, priority, event, not_before, group_priority,
                                ready_at)
    SELECT :group_id, new.seq, :priority, :event,
           CASE WHEN :delay::float8 > 0 THEN {_NOW} + :delay END,
           (SELECT CASE WHEN depth = 0 THEN :priority ELSE priority END FROM {{s}}.groups
             WHERE group_id = :group_id),
           {_NOW} + :delay
      FROM new
     WHERE :delay::float8 = 0 OR :hold::boolean
    RETURNING seq, not_before
), g AS (
    UPDATE {{s}}.groups g
       SET depth = g.depth + 1,
           head_seq = CASE WHEN g.depth = 0 THEN m.seq ELSE g.head_seq END,
           priority = CASE WHEN g.depth = 0 THEN :priority ELSE g.priority END,
           tenant = CASE WHEN g.depth = 0 THEN :tenant ELSE g.tenant END,
           paused = CASE WHEN g.depth = 0 THEN {_PAUSED_NOW} ELSE g.paused END,
           locked_by = CASE WHEN g.depth = 0 AND m.not_before IS NOT NULL
                            THEN '{DELAYED}' ELSE g.locked_by END,
           lock_expiry = CASE WHEN g.depth = 0 THEN m.not_before ELSE g.lock_expiry END,
           busy_until = CASE WHEN g.depth = 0 THEN m.not_before ELSE g.busy_until END
      FROM m
     WHERE g.group_id = :group_id
    RETURNING 1{_FORGET_KEYS}
)
SELECT coalesce((SELECT seq FROM k), (SELECT seq FROM t)), EXISTS (SELECT 1 FROM new),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM new) AND {_ANY_WAITER})
""",
    ("group_id", "key", "now", "window", "priority", "tenant", "event", "delay", "hold"),
)

# --- tenants ------------------------------------------------------------------------------------

# A claim's tenant turn, under the lock of the one `vclock` row (claims that take turns
# go one at a time; a queue whose groups have no tenant never takes it): every tenant
# with a ready group (found by skipping through groups_tenant_ready, one probe per
# tenant; the claim tries them in turn, so one with nothing at or above its floor is
# passed over), with its start max(pass, V), in turn order (least start; ties by
# name, '' for no tenant first).
TENANT_TURNS: Final = Statement(
    """
WITH RECURSIVE v AS MATERIALIZED (
    SELECT v FROM {s}.vclock FOR UPDATE
), r (tenant) AS (
    (SELECT tenant FROM {s}.groups WHERE free AND NOT paused AND tenant IS NOT NULL
      ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT g.tenant FROM {s}.groups g
             WHERE g.free AND NOT g.paused AND g.tenant IS NOT NULL AND g.tenant > r.tenant
             ORDER BY g.tenant LIMIT 1)
      FROM r WHERE r.tenant IS NOT NULL
), c AS (
    SELECT tenant FROM r WHERE tenant IS NOT NULL
    UNION ALL
    SELECT '' WHERE (
        SELECT 1 FROM {s}.groups WHERE free AND NOT paused AND tenant IS NULL
         ORDER BY last_claimed_at, head_seq LIMIT 1) IS NOT NULL
)
SELECT c.tenant, greatest(coalesce(t.pass, 0), v.v) AS start, coalesce(t.weight, 1)
  FROM c CROSS JOIN v LEFT JOIN {s}.tenants t ON t.tenant = c.tenant
 ORDER BY start, c.tenant <> '', c.tenant COLLATE "C"
"""
)
# The turn taken: V moves to the tenant's start, its pass to start + 1 / weight.
TAKE_TURN: Final = Statement(
    """
WITH v AS (UPDATE {s}.vclock SET v = :start)
INSERT INTO {s}.tenants (tenant, pass) VALUES (:tenant, :start + 1::float8 / :weight)
ON CONFLICT (tenant) DO UPDATE SET pass = excluded.pass
""",
    ("start", "tenant", "weight"),
)
SET_WEIGHT: Final = Statement(
    """
INSERT INTO {s}.tenants (tenant, weight) VALUES (:tenant, :weight)
ON CONFLICT (tenant) DO UPDATE SET weight = excluded.weight
""",
    ("tenant", "weight"),
)
# Tenants with groups or a stored weight, None ('') first, then by name.
LIST_TENANTS: Final = Statement(
    """
SELECT nullif(n.tenant, ''), coalesce(t.weight, 1), coalesce(c.n, 0)
  FROM (SELECT coalesce(tenant, '') AS tenant FROM {s}.groups WHERE depth > 0
        UNION SELECT tenant FROM {s}.tenants WHERE weight IS NOT NULL) n
  LEFT JOIN {s}.tenants t ON t.tenant = n.tenant
  LEFT JOIN (SELECT coalesce(tenant, '') AS tenant, count(*) AS n FROM {s}.groups
              WHERE depth > 0 GROUP BY 1) c ON c.tenant = n.tenant
 ORDER BY n.tenant <> '', n.tenant COLLATE "C"
""",
)

# --- pause --------------------------------------------------------------------------------------

# A pause is stored, then copied onto the group's row, locked first (LOCK_GROUP: a publish
# making the group now finishes first, or reads the stored pause when it makes it).
PAUSE: Final = Statement(
    """
WITH p AS (
    INSERT INTO {s}.paused (group_id) VALUES (:group_id) ON CONFLICT DO NOTHING
    RETURNING 1
), g AS (
    UPDATE {s}.groups SET paused = true WHERE group_id = :group_id AND depth > 0
)
SELECT count(*) FROM p
""",
    ("group_id",),
)
RESUME: Final = Statement(
    f"""
WITH p AS (
    DELETE FROM {{s}}.paused WHERE group_id = :group_id RETURNING 1
), g AS (
    UPDATE {{s}}.groups SET paused = false WHERE group_id = :group_id AND depth > 0
    RETURNING free
)
SELECT (SELECT count(*) FROM p),
       (SELECT {_NOTIFY} WHERE EXISTS (SELECT 1 FROM g WHERE free) AND {_ANY_WAITER})
""",
    ("group_id",),
)
LIST_PAUSED: Final = Statement('SELECT group_id FROM {s}.paused ORDER BY group_id COLLATE "C"')
PAUSED_COUNT: Final = Statement("SELECT count(*) FROM {s}.paused")

# Whether a delayed message is due (read only: an admin read promotes only then).
DUE_EXISTS: Final = Statement(
    f"SELECT EXISTS (SELECT 1 FROM {{s}}.timers WHERE due <= {_NOW})", ("now",)
)

# --- cancel and peek ----------------------------------------------------------------------------

# A delayed message is cancelled by its key; a message in a group is found by its seq
# (a moved one by `id`), and its group locked, before anything is removed.
CANCEL_TIMER: Final = Statement("DELETE FROM {s}.timers WHERE seq = :seq", ("seq",))
FIND_MESSAGE: Final = Statement(
    """
SELECT group_id FROM {s}.messages WHERE seq = :seq AND coalesce(id, seq) = :seq
UNION ALL
SELECT group_id FROM {s}.messages WHERE id = :seq
""",
    ("seq",),
)
# The message as the locked group has it: whether it is the head, and whether a worker's
# lease on it is running (such a message is not cancelled).
CANCEL_STATE: Final = Statement(
    f"""
SELECT m.seq, g.head_seq = coalesce(m.id, m.seq),
       g.head_seq = coalesce(m.id, m.seq)
           AND g.locked_by IS NOT NULL AND g.locked_by NOT IN ('{PARKED}', '{DELAYED}')
           AND g.lock_expiry >= {_NOW}
  FROM {{s}}.messages m JOIN {{s}}.groups g ON g.group_id = m.group_id
 WHERE m.group_id = :group_id AND (m.seq = :seq OR m.id = :seq)
""",
    ("now", "group_id", "seq"),
)
# A message behind the head (at place :place) leaves its group.
CANCEL_QUEUED: Final = Statement(
    """
WITH gone AS (
    DELETE FROM {s}.messages WHERE group_id = :group_id AND seq = :place RETURNING 1
)
UPDATE {s}.groups SET depth = depth - (SELECT count(*) FROM gone) WHERE group_id = :group_id
""",
    ("group_id", "place"),
)
# A head that is not leased leaves its group, which goes on with its next message.
CANCEL_HEAD: Final = _remove_head(
    "group_id = :group_id AND head_seq = :seq AND lock_expiry IS DISTINCT FROM 'Infinity'",
    ("group_id", "seq"),
)

# A group's FIFO from its head, with each message's state at :now, then its delayed
# messages not due, by (due, seq).
PEEK: Final = Statement(
    f"""
WITH n AS (SELECT {_NOW} AS now)
(SELECT coalesce(m.id, m.seq), m.group_id, m.priority, m.event,
        CASE WHEN m.seq = g.head_seq THEN g.attempt ELSE m.attempt END,
        CASE WHEN m.not_before > n.now THEN 'delayed'
             WHEN m.seq <> g.head_seq THEN 'queued'
             WHEN g.locked_by IS NULL OR g.lock_expiry < n.now THEN 'ready'
             WHEN g.locked_by = '{PARKED}' THEN 'parked'
             ELSE 'in_flight' END,
        CASE WHEN m.not_before > n.now THEN m.not_before
             WHEN m.seq = g.head_seq AND g.locked_by IS NOT NULL AND g.lock_expiry >= n.now
                  AND g.lock_expiry < 'Infinity' THEN g.lock_expiry END
   FROM {{s}}.messages m JOIN {{s}}.groups g ON g.group_id = m.group_id, n
  WHERE m.group_id = :group_id
    -- a held dead letter stays its group's head here, but it is a dead letter, not one
    -- of the group's messages: the messages behind it show as queued
    AND NOT EXISTS (SELECT 1 FROM {{s}}.dead_letters d
                     WHERE d.group_id = m.group_id AND d.seq = m.seq)
  ORDER BY m.seq LIMIT :limit)
UNION ALL
(SELECT seq, group_id, priority, event, 0, 'delayed', due FROM {{s}}.timers
  WHERE group_id = :group_id ORDER BY due, seq LIMIT :limit)
""",
    ("now", "group_id", "limit"),
)

# --- admin counts -------------------------------------------------------------------------------

# Delayed messages not due, by priority: those outside their groups (by their own), and
# those with hold in them (by their group's).
TIMER_COUNTS: Final = Statement("SELECT priority, count(*) FROM {s}.timers GROUP BY priority")
HELD_COUNTS: Final = Statement(
    f"""
SELECT g.priority, count(*)
  FROM {{s}}.messages m JOIN {{s}}.groups g ON g.group_id = m.group_id
 WHERE m.not_before IS NOT NULL AND m.not_before > {_NOW}
 GROUP BY g.priority
""",
    ("now",),
)
