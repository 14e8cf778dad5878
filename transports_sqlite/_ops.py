"""Every SQLite operation, sans-I/O, shared by the sync and async drivers.

Each operation (`Op`) is core's `Operation` whose steps are statements (`Stmt`) and whose
replies are their `Result`s. It validates its arguments when it is built, so bad input
never takes the write lock. Given the transaction's ``now``, it may offer one statement
first, and say from its rows whether that was all (or `MORE`); otherwise its steps are a
generator that yields statements and returns the value or raises `LeaseLost`. No
operation does I/O, reads a clock or imports a driver: the engine opens the transaction,
has core's `drive` run the statements, and commits once the operation has its value.
The builders of the public methods' operations go by the names of core's `Operations`
(`Ack`, `Stats`, ...), whether they are classes or functions.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, NamedTuple, TypeVar

import transports_core as dt
from transports_core import backend as core
from transports_core.backend import MORE, More

from . import _sql as sql

T = TypeVar("T")
LastDelivery = Literal["lapsed", "nacked"]

# An operation gives a statement's values by name; the statement binds them in its own
# order (`_sql.Statement.bind`).
Params = Mapping[str, Any]


# Stmt and Op are built on every call, so they are plain (not frozen) slotted classes:
# a frozen dataclass costs three times as much to build. Nothing changes them.
@dataclass(slots=True)
class Stmt:
    """A statement and its values by name; or, with ``many``, run once for each row of
    values (each a tuple in the order of the statement's `names`: a batch is too large
    to name every row's values)."""

    statement: sql.Statement
    params: Params = field(default_factory=dict)
    many: Sequence[Sequence[Any]] | None = field(default=None)


class Result(NamedTuple):
    """What a statement gave back: its rows (only a statement that returns rows has any)
    and its row count, sqlite3's: the rows it inserted, updated or deleted, -1 for a
    query."""

    rows: list[Any]
    rowcount: int


Steps = Generator[Stmt, Result, T]

# How an operation runs: in a write transaction (the default), in a read transaction, or
# with each statement committing on its own (AUTOCOMMIT). An operation that writes with a
# single statement runs in AUTOCOMMIT: the statement and its triggers are atomic, and it
# takes the write lock when it starts, exactly as BEGIN IMMEDIATE would, but without the
# two extra statements. Its `now` is read just
# before the statement, so a write that waits for the lock keeps the time it was asked at.
# Pragmas that must run outside a transaction use it too.
AUTOCOMMIT = None


class Op(core.Operation[Stmt, Result, T]):
    """An operation, checked and ready to run in one transaction, opened with `begin`
    (None: AUTOCOMMIT). An op that only moves a lease is not `durable` (see
    `lease_durability`); one that cannot make a message deliverable does not `wake`
    waiting claims; one that runs a few statements on a few pages is `brief` (the async
    twin may run it on the event loop's thread: see `commit_flushes`).

    The calls on a worker's path (publish, claim, ack, nack, extend) are usually one
    statement: `first` gives it and `done` makes the value of its rows and row count, or
    says `MORE`. Every other op, and those when `done` says `MORE`, run their `steps`.
    These are plain slotted objects holding their checked arguments, so a call on a
    worker's path builds no generator.

    The engine always reads its clock for ``now`` (SQLite has no clock of its own that
    a statement could use instead), so an op that needs it asserts it is there."""

    __slots__ = ()
    begin: str | None = sql.BEGIN_WRITE
    durable: bool = True
    wakes: bool = True
    brief: bool = True


class Plan(Op[T]):
    """An op that is only steps: ``steps(now)`` gives them, for the transaction's `now`.
    Not `brief` unless it says so: a batch, the admin calls and the setup."""

    __slots__ = ("_steps", "begin", "brief", "durable", "wakes")

    def __init__(
        self,
        steps: Callable[[float], Steps[T]],
        begin: str | None = sql.BEGIN_WRITE,
        *,
        durable: bool = True,
        wakes: bool = True,
        brief: bool = False,
    ) -> None:
        self._steps = steps
        self.begin, self.durable, self.wakes, self.brief = begin, durable, wakes, brief

    def steps(self, now: float | None) -> Steps[T]:
        assert now is not None  # see `Op`
        return self._steps(now)


# The schema version `needs_setup` gives for an empty database.
EMPTY = 0


def _version(path: str, identity: Result) -> int:
    """The schema version of a queue of ours: `SCHEMA_VERSION`, or an older one that
    `upgrade` knows; `EMPTY` for an empty database. Any other database raises, naming
    the file."""
    ((tables, app_id, version),) = identity.rows
    # Only a pristine database is adopted: one with no tables may still carry another
    # application's application_id or user_version, which the schema would overwrite.
    if (tables, app_id, version) == (0, 0, 0):
        return EMPTY
    if app_id != sql.APPLICATION_ID:
        raise dt.TransportError(
            f"{path} is a SQLite database of another application "
            f"(application_id {app_id}); refusing to use it as a queue"
        )
    if version != sql.SCHEMA_VERSION and version not in sql.UPGRADES:
        raise dt.TransportError(
            f"{path} has queue schema version {version}; this version of "
            f"durable-transports knows version {sql.SCHEMA_VERSION}"
        )
    return int(version)


def may_change(path: str, migrate: str, version: int) -> None:
    """Raise unless ``migrate`` (the option) lets opening create (``version`` `EMPTY`)
    or upgrade (an older version) the queue in the file at ``path``; the refusal names
    the command that does it."""
    found = None if version == EMPTY else version
    why = core.migrate_refusal(migrate, found, sql.SCHEMA_VERSION)
    if why is None:
        return
    url = shlex.quote(f"sqlite:///{path}")
    raise dt.TransportError(
        f"{path} {why}: run `transports migrate {url}` "
        "(`transports migrate --sql` prints the statements for review)"
    )


def needs_setup(path: str) -> Plan[int]:
    """Read-only: the database's schema version (`EMPTY`: none yet). Refuse a foreign or
    unknown one. Run first, in a read transaction, so that a read-only queue opens
    without asking for the write lock."""

    def steps(now: float) -> Steps[int]:
        return _version(path, (yield Stmt(sql.READ_IDENTITY)))

    return Plan(steps, sql.BEGIN_READ, wakes=False)


def setup(path: str) -> Op[None]:
    """Create the schema in an empty database (checked again under the write lock, as
    another process may have created it since `needs_setup`)."""

    def steps(now: float) -> Steps[None]:
        if _version(path, (yield Stmt(sql.READ_IDENTITY))) == EMPTY:
            for statement in sql.SCHEMA:
                yield Stmt(statement)

    return Plan(steps)


def upgrade(path: str) -> Op[None]:
    """Bring a queue at an older schema version up to `SCHEMA_VERSION`, in one write
    transaction (checked again under the write lock: another process may have upgraded
    it since `needs_setup`), so a crash leaves the old version whole."""

    def steps(now: float) -> Steps[None]:
        version = _version(path, (yield Stmt(sql.READ_IDENTITY)))
        stamp = {"now": now}  # the upgrade's time, for the messages it finds (`_sql._V7`)
        for statement in sql.UPGRADES.get(version, ()):
            yield Stmt(statement, stamp)

    return Plan(steps, wakes=False)


def new_file() -> Op[None]:
    """Settings that only a file without tables takes; run outside a transaction."""

    def steps(now: float) -> Steps[None]:
        yield Stmt(sql.NEW_FILE_PAGE_SIZE)

    return Plan(steps, AUTOCOMMIT)


def session(synchronous: str, memory: bool, on_loop: bool = False) -> Op[None]:
    """Per-connection settings; they must run outside a transaction. See
    `_sql.session_pragmas` for ``on_loop``."""

    def steps(now: float) -> Steps[None]:
        ((mode,),) = (yield Stmt(sql.READ_JOURNAL_MODE)).rows
        for pragma in sql.session_pragmas(synchronous, memory, mode, on_loop):
            yield Stmt(pragma)

    return Plan(steps, AUTOCOMMIT)


class Publish(Op[int]):
    """A publish without a key, delay or tenant."""

    __slots__ = ("params",)
    begin = AUTOCOMMIT

    def __init__(
        self, codec: core.EventCodec[Any], group_id: str, event: object, priority: int
    ) -> None:
        self.params = {
            "group_id": core.check_group_id(group_id),
            "priority": core.check_priority(priority),
            "event": codec.encode(event),
            "now": None,
        }

    def first(self, now: float | None) -> Stmt:
        # `now`: its group's due timers are promoted before it (see `_sql.publish`).
        self.params["now"] = now
        return Stmt(sql.PUBLISH, self.params)

    def done(self, reply: Result, now: float | None) -> int:
        seq: int = reply.rows[0][0]
        return seq


class PublishKeyed(Op[int]):
    """A publish with a key and nothing else: one statement too (see
    `_sql.PUBLISH_KEYED`), which stores the message unless the key is live in its group,
    and gives the seq either way."""

    __slots__ = ("params", "window")
    begin = AUTOCOMMIT

    def __init__(self, item: core.Item, window: float) -> None:
        self.params = {
            "group_id": item.group_id,
            "priority": item.priority,
            "event": item.event,
            "key": item.key,
        }
        self.window = window

    def first(self, now: float | None) -> Stmt:
        assert now is not None  # see `Op`
        return Stmt(sql.PUBLISH_KEYED, self.params | {"now": now, "expires_at": now + self.window})

    def done(self, reply: Result, now: float | None) -> int:
        seq, kept = reply.rows[0]
        return int(seq) if kept == seq else dt.Duplicate(kept)


def PublishWith(item: core.Item, window: float) -> Op[int]:
    """A publish with a key, a delay or a tenant (``item`` checked by core). A keyed one
    and nothing else is one statement; the others are a batch of one."""
    if not item.delay and item.tenant is None:
        return PublishKeyed(item, window)

    def steps(now: float) -> Steps[int]:
        seqs = yield from _publish_batch([item], window, now)
        return seqs[0]

    return Plan(steps, brief=True)


def PublishMany(
    codec: core.EventCodec[Any],
    items: Iterable[tuple[str, Any, int] | dt.Message[Any]],
    window: float = core.DEDUP_WINDOW,
) -> Op[list[int]]:
    encoded = codec.encode_items(items)
    return Plan(partial(_publish_batch, encoded, window))


def _publish_batch(encoded: list[core.Item], window: float, now: float) -> Steps[list[int]]:
    """publish_many, under the write lock held from the start: an item is stored unless
    its key is live in its group or used by an earlier item of the batch; the stored ones
    are numbered in order, the others get the seq their key points to, as a `Duplicate`.

    The batch is numbered as if no key were live, and its keys remembered with those
    seqs first: a live key's row is left alone and not counted (see `_sql.REMEMBER_KEY`).
    Only when the count falls short are the live keys read, the batch numbered again
    and the remembered keys moved to their new seqs; then the messages are stored."""
    if not encoded:
        return []
    first: int = (yield Stmt(sql.LAST_SEQ)).rows[0][0] + 1
    expiry = (now + window, now)
    seqs, stored, remembered = _number(encoded, first, {}, expiry)
    if remembered:
        limit = len(remembered) + sql.FORGET_PER_PUBLISH
        yield Stmt(sql.FORGET_EXPIRED, {"now": now, "limit": limit})
        kept = (yield Stmt(sql.REMEMBER_KEY, many=remembered)).rowcount
        if kept != len(remembered):  # some key was live: its row kept its seq from before
            pairs = [(group_id, key) for group_id, key, *_ in remembered]
            found = yield Stmt(sql.LIVE_KEYS, {"pairs": json.dumps(pairs), "first": first})
            live: dict[tuple[str, str], int] = {(g, k): dt.Duplicate(s) for g, k, s in found.rows}
            guessed = {(g, k): s for g, k, s, *_ in remembered}
            seqs, stored, remembered = _number(encoded, first, live, expiry)
            moved = [(seq, k, g) for g, k, seq, *_ in remembered if guessed[g, k] != seq]
            if moved:
                yield Stmt(sql.RENUMBER_KEY, many=moved)
    if stored:
        yield from _append(first, stored, now)
    return seqs


# A row of REMEMBER_KEY: (group_id, key, seq, expires_at, now).
Remembered = tuple[str, str, int, float, float]


def _number(
    encoded: list[core.Item],
    first: int,
    live: dict[tuple[str, str], int],
    expiry: tuple[float, float],
) -> tuple[list[int], list[core.Item], list[Remembered]]:
    """Number the items of a batch from ``first``, given its ``live`` keys (each with its
    `Duplicate`): what each item gets, the items to store, and the keys to remember,
    each with ``expiry``, (expires_at, now)."""
    seqs: list[int] = []
    stored: list[core.Item] = []
    remembered: list[Remembered] = []
    taken = dict(live)
    seq = first
    for row in encoded:
        group_id, key = row.group_id, row.key
        if key is not None:
            original = taken.get((group_id, key))
            if original is not None:
                seqs.append(original)
                continue
            taken[group_id, key] = dt.Duplicate(seq)
            remembered.append((group_id, key, seq, *expiry))
        stored.append(row)
        seqs.append(seq)
        seq += 1
    return seqs, stored, remembered


def _append(first: int, encoded: list[core.Item], now: float) -> Steps[None]:
    """Store ``encoded`` items as seqs ``first`` on, in one pass per table: delayed ones
    without hold as timers, the others at the end of their groups' chains, behind the
    due timers of those groups."""
    last = first + len(encoded) - 1
    # Built from the back, so that each row knows the next seq of its group in the
    # batch. In the end `following` holds each group's first seq in the batch, and
    # `tails` its last.
    rows: list[tuple[int, str, int, str, int | None, float | None, float]] = []  # INSERT_ROW's
    timers: list[tuple[int, str, int, str, str | None, float]] = []  # INSERT_TIMER's
    following: dict[str, int] = {}
    tails: dict[str, int] = {}
    opening: dict[str, tuple[int, str | None, float | None]] = {}
    append, after = rows.append, following.get
    seq = last
    for group_id, raw, priority, _, delay, hold, tenant in reversed(encoded):
        if delay and not hold:
            timers.append((seq, group_id, priority, raw, tenant, now + delay))
            seq -= 1
            continue
        due = now + delay if delay else None
        next_seq = after(group_id)
        if next_seq is None:
            tails[group_id] = seq
        append((seq, group_id, priority, raw, next_seq, due, due or now))
        following[group_id] = seq
        opening[group_id] = (priority, tenant, due)
        seq -= 1
    rows.reverse()
    if timers:
        yield Stmt(sql.INSERT_TIMER, many=timers)
        yield Stmt(sql.RAISE_LAST_SEQ, {"seq": last})
    tenants = {item.tenant for item in encoded if item.tenant is not None}
    if tenants:
        yield Stmt(sql.REGISTER_TENANT, many=[(tenant,) for tenant in tenants])
    if not rows:
        return
    if (yield Stmt(sql.ANY_DUE, {"now": now})).rows[0][0]:
        yield Stmt(sql.PROMOTE_GROUP, many=[(group_id, now) for group_id in following])
    depth = Counter(row[1] for row in rows)
    yield Stmt(sql.LINK_TAIL, many=[(seq, group_id) for group_id, seq in following.items()])
    # Each group of the batch, with the priority, tenant and hold of its first message in
    # the batch, its head, tail and depth. A new group opens with them; an existing one
    # keeps its head, priority and tenant and takes the tail and the added depth.
    yield Stmt(
        sql.OPEN_GROUP,
        many=[
            (
                group_id,
                opening[group_id][0],
                seq,
                tails[group_id],
                depth[group_id],
                opening[group_id][1],
                opening[group_id][2],
            )
            for group_id, seq in following.items()
        ],
    )
    yield Stmt(sql.INSERT_ROW, many=rows)


# No head has this many deliveries: CLAIM_READY's guard when there is no max_attempts.
_UNLIMITED = 2**62


class Claim(Op[core.Claimed | None], core.Claiming[core.Claimed | None]):
    """Lease the next ready head. With ``max_attempts``, a head that has had that many
    deliveries is buried instead (see `_bury`) and the claim goes on to the next one.

    Usually one statement does it all (CLAIM_READY: nothing has lapsed, no burial is
    due); when that claims nothing, the claim wakes lapsed groups and goes on in full.
    It runs in a write transaction even so: its `now` is read once the write lock is
    held, so a claim that waited for the lock still leases from the moment it got it."""

    __slots__ = ()
    begin = sql.BEGIN_WRITE
    durable = False
    wakes = False  # a claim takes a message; what it frees on the way is due by the clock

    def first(self, now: float | None) -> Stmt:
        assert now is not None  # see `Op`
        return Stmt(
            sql.CLAIM_READY,
            {
                "worker_id": self.worker_id,
                "expires_at": now + self.visibility,
                "min_priority": self.min_priority,
                "now": now,
                "max_attempts": _UNLIMITED if self.max_attempts is None else self.max_attempts,
            },
        )

    def done(self, reply: Result, now: float | None) -> core.Claimed | More:
        rows = reply.rows
        return self._claimed(rows, now) if rows else MORE

    def _claimed(self, rows: list[Any], now: float | None) -> core.Claimed:
        assert now is not None  # see `Op`
        seq, group_id, raw, attempt = rows[0]
        return core.Claimed(seq, group_id, raw, self.worker_id, attempt, now + self.visibility)

    def steps(self, now: float | None) -> Steps[core.Claimed | None]:
        assert now is not None  # see `Op`
        max_attempts = self.max_attempts
        lease = {"worker_id": self.worker_id, "expires_at": now + self.visibility, "now": now}
        floor = {"min_priority": self.min_priority}
        yield Stmt(sql.PROMOTE_DUE, {"now": now})
        yield Stmt(sql.WAKE_LAPSED, {"now": now})
        tenanted = bool((yield Stmt(sql.ANY_TENANT)).rows[0][0])
        # Each pass buries one message for good, so this ends.
        while True:
            if tenanted:
                turn = (yield Stmt(sql.TENANT_TURN, floor)).rows
                if not turn:
                    return None
                tenant, start, weight = turn[0]
                if tenant:
                    pick = Stmt(sql.NEXT_FREE_OF_TENANT, floor | {"tenant": tenant})
                else:
                    pick = Stmt(sql.NEXT_FREE_UNTENANTED, floor)
            else:
                pick = Stmt(sql.NEXT_FREE, floor)
            rows = (yield pick).rows
            if not rows:
                return None
            group_id, seq, delivered, holder, requeued_at = rows[0]
            if max_attempts is not None and delivered - (requeued_at or 0) >= max_attempts:
                last: LastDelivery = "nacked" if holder in (None, sql.PARKED) else "lapsed"
                reason = core.exhausted_reason(delivered - (requeued_at or 0), max_attempts, last)
                yield from _bury(now, group_id, seq, delivered, reason, self.on_dead)
                continue
            found = (yield Stmt(sql.CLAIM_GROUP, lease | {"group_id": group_id})).rows
            if found and tenanted:
                set_v, set_pass = sql.TAKE_TURN
                yield Stmt(set_v, {"start": start})
                yield Stmt(set_pass, {"tenant": tenant, "pass": start + 1.0 / weight})
            return self._claimed(found, now) if found else None


def _bury(
    now: float, group_id: str, seq: int, delivered: int, reason: str, on_dead: str
) -> Steps[None]:
    """Make head ``seq`` of ``group_id`` a dead letter after ``delivered`` deliveries."""
    yield Stmt(sql.BURY, {"seq": seq, "attempts": delivered, "reason": reason, "now": now})
    if on_dead == "hold":
        yield Stmt(
            sql.HOLD_GROUP,
            {"group_id": group_id, "parked": sql.PARKED, "held": sql.HELD, "attempts": delivered},
        )
    else:
        yield Stmt(sql.DROP_MESSAGE, {"seq": seq})
    yield Stmt(sql.FORGET_REQUEUED, {"seq": seq})


def BuryLease(lease: dt.Lease[object], reason: str, on_dead: str) -> Op[None]:
    """Dead-letter the leased head now, fenced like an ack."""
    lease = core.check_lease(lease)
    stored = core.buried_reason(core.check_reason(reason))
    fence = _fence(lease)

    def steps(now: float) -> Steps[None]:
        if not (yield Stmt(sql.HOLDS_LEASE, fence)).rows:
            raise dt.LeaseLost(lease)
        yield from _bury(now, lease.group_id, lease.seq, lease.attempt, stored, on_dead)

    return Plan(steps)


# --- batches: core's steps over the single ops, in one transaction -------------------------


def ClaimMany(claim: Claim, limit: int) -> Op[list[core.Claimed]]:
    """Up to ``limit`` successive claims, in one transaction and one commit."""
    return Plan(partial(core.claiming_many, claim, limit), durable=claim.durable, wakes=False)


def SettleMany(settles: list[Op[None]]) -> Op[list[dt.LeaseLost]]:
    """Acks, nacks and buries, each fenced by its lease, in one transaction."""
    return Plan(
        partial(core.settling_many, settles),
        durable=any(op.durable for op in settles),
        wakes=any(op.wakes for op in settles),
    )


def AckAndClaim(ack: Op[None], claim: Claim) -> Op[core.Claimed | None]:
    """An ack and the next claim, in one transaction and one commit: brief, as each is."""
    return Plan(
        partial(core.then_claiming, ack, claim),
        durable=ack.durable,
        wakes=ack.wakes,
        brief=ack.brief and claim.brief,
    )


def _fence(lease: dt.Lease[object]) -> dict[str, Any]:
    """The values by which a statement matches the current lease (see _LEASE_HOLDER)."""
    return {
        "group_id": lease.group_id,
        "seq": lease.seq,
        "worker_id": lease.worker_id,
        "attempt": lease.attempt,
    }


class _Settle(Op[T], core.Settle[T]):
    """ack, nack and extend: one statement fenced by the lease (see _LEASE_HOLDER), which
    changes its one row while the lease is current."""

    __slots__ = ("fence",)
    begin = AUTOCOMMIT

    def __init__(self, lease: dt.Lease[Any]) -> None:
        # Settle's own check, inline: every ack builds one, and super() is a call more.
        self.lease = core.check_lease(lease)
        self.fence = _fence(lease)


class Ack(_Settle[None]):
    __slots__ = ()

    def first(self, now: float | None) -> Stmt:
        return Stmt(sql.ACK, self.fence)

    def done(self, reply: Result, now: float | None) -> None:
        self.held(reply.rowcount == 1)


_FREED: dict[str, Any] = {"locked_by": None, "lock_expiry": None}


class Nack(_Settle[None]):
    __slots__ = ("delay",)
    durable = False

    def __init__(self, lease: dt.Lease[Any], delay: float) -> None:
        super().__init__(lease)
        self.delay = core.check_delay(delay)

    def first(self, now: float | None) -> Stmt:
        if self.delay > 0:  # park: the group stays held until the delay has passed
            assert now is not None  # see `Op`
            parked = {"locked_by": sql.PARKED, "lock_expiry": now + self.delay}
            return Stmt(sql.RELEASE, self.fence | parked)
        return Stmt(sql.RELEASE, self.fence | _FREED)

    def done(self, reply: Result, now: float | None) -> None:
        self.held(reply.rowcount == 1)


class Unclaim(_Settle[None]):
    """Undo a claim whose lease never reached its caller (a cancelled async claim)."""

    __slots__ = ()
    durable = False

    def first(self, now: float | None) -> Stmt:
        return Stmt(sql.UNCLAIM, self.fence)

    def done(self, reply: Result, now: float | None) -> None:
        return None  # settled meanwhile (it lapsed and was taken): nothing to give back


class Extend(_Settle[dt.Lease[T]]):
    __slots__ = ("visibility",)
    durable = False
    lease: dt.Lease[T]

    def __init__(self, lease: dt.Lease[T], visibility: float) -> None:
        super().__init__(lease)
        self.visibility = core.check_visibility(visibility)

    def first(self, now: float | None) -> Stmt:
        assert now is not None  # see `Op`
        return Stmt(sql.EXTEND, self.fence | {"lock_expiry": now + self.visibility})

    def done(self, reply: Result, now: float | None) -> dt.Lease[T]:
        assert now is not None  # see `Op`
        self.held(reply.rowcount == 1)
        return self.renewed(now + self.visibility)


class Relax(NamedTuple):
    """The statements a runner runs around an op that needs no flush of its own."""

    before: str
    after: str


def lease_durability(synchronous: str, memory: bool) -> Relax | None:
    """How the runner brackets an op that is not `durable`, at this durability level.

    A claim, nack or extend only moves a lease. If a power cut loses one, the message is
    due again at once, exactly as if the lease had lapsed, and the worker that held it
    died in the same power cut; nothing acked comes back and nothing published is lost.
    So at ``full`` such an op commits at ``normal``, without a flush of its own: its
    commit reaches the disk with the next publish or ack, which flush the whole WAL. That
    halves the flushes of a claim+ack. ``extra`` flushes every commit, leases included;
    ``normal`` and ``off`` flush none anyway, and a database in memory has no disk. The
    bracket runs outside the transaction (SQLite refuses to change the level inside one):
    two statements more, on the engine both twins run. See docs/sqlite.md, "Durability of
    leases"."""
    if synchronous != "full" or memory:
        return None
    return Relax(sql.set_synchronous("normal"), sql.set_synchronous(synchronous))


def commit_flushes(op: Op[Any], synchronous: str, memory: bool) -> bool:
    """Whether the commit of ``op`` waits for the disk (a flush) at this durability level:
    every commit at ``extra``; at ``full``, those of durable ops (see `lease_durability`);
    none at ``normal`` or ``off``, nor in memory. (A checkpoint flushes too, which the
    async twin's engine keeps out of its commits: see `_async.LoopEngine`.)"""
    if memory or synchronous in ("normal", "off") or op.begin == sql.BEGIN_READ:
        return False
    return synchronous == "extra" or op.durable


class RewriteHeader(Op[None]):
    """A write that changes nothing (see `_sql.REWRITE_HEADER`)."""

    __slots__ = ()
    begin = AUTOCOMMIT
    durable = False
    wakes = False

    def first(self, now: float | None) -> Stmt:
        return Stmt(sql.REWRITE_HEADER)

    def done(self, reply: Result, now: float | None) -> None:
        return None


def checkpoint_due(wal_bytes: int) -> bool:
    """Whether a claim that found nothing should checkpoint and truncate a WAL this big."""
    return wal_bytes > sql.IDLE_WAL_BYTES


# --- admin: reads run in a deferred (read) transaction, writes under the write lock ------


# Admin reads take no write lock, so they promote nothing: stats and peek count a due
# timer where its promotion will put it (ready, at the end of its group), and groups and
# tenants show the groups as they are stored (a group that only a due timer would open
# shows from the next claim or publish, which promote it).
def _admin_read(steps: Callable[[float], Steps[T]]) -> Op[T]:
    return Plan(steps, sql.BEGIN_READ, wakes=False)


def Stats() -> Op[dt.QueueStats]:
    def steps(now: float) -> Steps[dt.QueueStats]:
        markers = {"now": now, "parked": sql.PARKED, "held": sql.HELD}
        counted = yield Stmt(sql.MESSAGE_COUNTS, markers)
        # By priority: ready, in flight, parked, delayed, ready groups, busy groups.
        live = {
            p: [ready, in_flight, parked, 0, free, listed - free]
            for p, ready, in_flight, parked, free, listed in counted.rows
        }
        # A not-due hold=True message counts as delayed only: at the head it parks its
        # group (counted parked above), behind the head it was counted ready.
        for p, held, heads in (yield Stmt(sql.HOLD_COUNTS, {"now": now})).rows:
            row = live.setdefault(p, [0, 0, 0, 0, 0, 0])
            row[0] -= held - heads
            row[2] -= heads
            row[3] += held
        oldest = {
            p: at for p, at in (yield Stmt(sql.OLDEST_READY, {"now": now})).rows if at is not None
        }
        # A due timer is ready since its due time, whether or not a claim promoted it yet;
        # a group that only due timers would open counts as it will once they are.
        for p, delayed, due, first_due in (yield Stmt(sql.TIMER_COUNTS, {"now": now})).rows:
            row = live.setdefault(p, [0, 0, 0, 0, 0, 0])
            row[0] += due
            row[3] += delayed
            if first_due is not None:
                oldest[p] = min(oldest.get(p, first_due), first_due)
        for p, opening, paused_ones in (yield Stmt(sql.TIMER_GROUPS, {"now": now})).rows:
            row = live.setdefault(p, [0, 0, 0, 0, 0, 0])
            row[4] += opening - paused_ones
            row[5] += paused_ones
        dead = dict((yield Stmt(sql.DEAD_COUNTS)).rows)
        ((keys,),) = (yield Stmt(sql.KEY_COUNT)).rows
        ((paused,),) = (yield Stmt(sql.PAUSED_COUNT)).rows
        zero = [0, 0, 0, 0, 0, 0]

        def by_priority(p: int) -> dt.PriorityStats:
            ready, in_flight, parked, delayed, free, busy = live.get(p, zero)
            # Never below 0, and 0 when only messages stamped later than `now` are ready
            # (see `_sql.OLDEST_READY`): another process's clock may run a little ahead.
            since = oldest.get(p, now)
            return dt.PriorityStats(
                p,
                ready=ready,
                in_flight=in_flight,
                parked=parked,
                dead=dead.get(p, 0),
                delayed=delayed,
                oldest_ready_age=max(0.0, now - since) if ready else None,
                ready_groups=free,
                busy_groups=busy,
            )

        return core.queue_stats(
            map(by_priority, sorted(live.keys() | dead.keys())), keys=keys, paused=paused
        )

    return _admin_read(steps)


def Groups(limit: int) -> Op[list[dt.GroupInfo]]:
    limit = core.check_limit(limit)

    def steps(now: float) -> Steps[list[dt.GroupInfo]]:
        rows = (yield Stmt(sql.DEEPEST_GROUPS, {"limit": limit})).rows
        return [
            core.group_info(
                row[:7],
                now,
                parked=sql.PARKED,
                held=sql.HELD,
                paused=bool(row[7]),
                tenant=row[8],
            )
            for row in rows
        ]

    return _admin_read(steps)


def DeadLetters(limit: int | None) -> Op[list[dt.DeadLetter]]:
    params = {"limit": -1 if limit is None else core.check_limit(limit)}  # LIMIT -1: no limit

    def steps(now: float) -> Steps[list[dt.DeadLetter]]:
        return list(map(core.dead_letter, (yield Stmt(sql.LIST_DEAD_LETTERS, params)).rows))

    return Plan(steps, sql.BEGIN_READ, wakes=False)


def HeldGroups() -> Op[list[dt.HeldGroup]]:
    def steps(now: float) -> Steps[list[dt.HeldGroup]]:
        return list(map(core.held_group, (yield Stmt(sql.LIST_HELD_GROUPS)).rows))

    return Plan(steps, sql.BEGIN_READ, wakes=False)


def _on_dead_letter(seq: int, act: Callable[[float, int, str, int, bool], Steps[None]]) -> Op[bool]:
    """Requeue and discard: find dead letter ``seq`` and ``act`` on it, given the
    transaction's `now`, its seq, its group, its attempts and whether it holds the group;
    False when there is none."""
    seq = core.check_seq(seq)

    def steps(now: float) -> Steps[bool]:
        rows = (yield Stmt(sql.DEAD_LETTER, {"seq": seq})).rows
        if not rows:
            return False
        group_id, attempts, held = rows[0]
        yield from act(now, seq, group_id, attempts, bool(held))
        return True

    return Plan(steps)


def _requeue(now: float, seq: int, group_id: str, attempts: int, held: bool) -> Steps[None]:
    message = {"group_id": group_id, "seq": seq}
    if held:
        yield Stmt(sql.UNHOLD_GROUP, message | {"held": sql.HELD})
        yield Stmt(sql.READY_AGAIN, {"now": now, "seq": seq})
    else:
        holder = (
            yield Stmt(
                sql.GROUP_HOLDER, {"group_id": group_id, "parked": sql.PARKED, "held": sql.HELD}
            )
        ).rows
        if holder:
            locked_by, head = holder[0]
            if locked_by == sql.PARKED:  # held by another dead letter at its head
                raise dt.RequeueRefused(seq, group_id, None, head)
            raise dt.RequeueRefused(seq, group_id, locked_by)
        yield Stmt(sql.STASH_HEAD_ATTEMPT, message)
        ((after,),) = (yield Stmt(sql.PREDECESSOR, message)).rows
        yield Stmt(sql.RESTORE_MESSAGE, message | {"after": after, "now": now})
        if after is not None:
            yield Stmt(sql.LINK_AFTER, {"seq": seq, "after": after})
        yield Stmt(sql.RESTORE_HEAD, {"seq": seq})
    yield Stmt(sql.PRUNE_REQUEUED)
    yield Stmt(sql.MARK_REQUEUED, message | {"attempts": attempts})
    yield Stmt(sql.FORGET_DEAD_LETTER, {"seq": seq})


def _discard(now: float, seq: int, group_id: str, attempts: int, held: bool) -> Steps[None]:
    yield Stmt(sql.FORGET_DEAD_LETTER, {"seq": seq})
    if held:  # its row in `messages` goes too, which frees the group
        yield Stmt(sql.DROP_MESSAGE, {"seq": seq})
    yield Stmt(sql.FORGET_REQUEUED, {"seq": seq})


def Requeue(seq: int) -> Op[bool]:
    return _on_dead_letter(seq, _requeue)


def Discard(seq: int) -> Op[bool]:
    return _on_dead_letter(seq, _discard)


def PurgeGroup(group_id: str) -> Op[int]:
    params = {"group_id": core.check_group_id(group_id)}

    def steps(now: float) -> Steps[int]:
        # A held dead letter is in both tables; count it once.
        ((held,),) = (yield Stmt(sql.COUNT_HELD_IN_GROUP, params)).rows
        chain = (yield Stmt(sql.GROUP_CHAIN, params)).rows
        yield Stmt(sql.DROP_GROUP, params)
        if chain:
            yield Stmt(sql.DROP_MESSAGE, many=chain)  # rows of (seq,)
        dead = (yield Stmt(sql.PURGE_GROUP_DEAD_LETTERS, params)).rowcount
        timers = (yield Stmt(sql.PURGE_GROUP_TIMERS, params)).rowcount
        return int(len(chain) + dead + timers - held)

    return Plan(steps)


# --- timers, pauses and tenants: core checked the arguments ------------------------------


def Cancel(seq: int) -> Op[bool]:
    """Remove message ``seq`` unless a worker holds it (a lease not lapsed) or it is a
    dead letter; a head removed lets its group go on (the delete trigger)."""
    params = {"seq": seq}

    def steps(now: float) -> Steps[bool]:
        if (yield Stmt(sql.CANCEL_TIMER, params)).rowcount:
            return True
        rows = (yield Stmt(sql.CANCEL_TARGET, params)).rows
        if not rows:
            return False
        group_id, next_seq, head, _, locked_by, lock_expiry, dead = rows[0]
        if dead:
            return False
        if seq == head:
            if locked_by not in (None, sql.PARKED) and lock_expiry >= now:
                return False
        else:
            where = {"group_id": group_id, "seq": seq}
            ((before,),) = (yield Stmt(sql.CHAIN_BEFORE, where)).rows
            yield Stmt(sql.UNLINK, {"next_seq": next_seq, "before": before})
            yield Stmt(sql.SHORTEN_GROUP, where | {"before": before})
        yield Stmt(sql.DROP_MESSAGE, params)
        yield Stmt(sql.FORGET_REQUEUED, params)
        return True

    return Plan(steps)


def Pause(group_id: str, paused: bool) -> Op[bool]:
    params = {"group_id": group_id}

    def steps(now: float) -> Steps[bool]:
        changed = (yield Stmt(sql.PAUSE if paused else sql.RESUME, params)).rowcount
        if changed:
            yield Stmt(sql.MARK_PAUSED, params | {"paused": int(paused)})
        return bool(changed)

    # A resume may make a group claimable; a pause never does.
    return Plan(steps, wakes=not paused, brief=True)


def PausedGroups() -> Op[list[str]]:
    def steps(now: float) -> Steps[list[str]]:
        return [group_id for (group_id,) in (yield Stmt(sql.LIST_PAUSED)).rows]

    return Plan(steps, sql.BEGIN_READ, wakes=False)


def Peek(group_id: str, limit: int) -> Op[list[dt.QueuedMessage]]:
    def steps(now: float) -> Steps[list[dt.QueuedMessage]]:
        where = {"group_id": group_id, "limit": limit}
        shown: list[dt.QueuedMessage] = []
        group = (yield Stmt(sql.PEEK_GROUP, {"group_id": group_id})).rows
        if group:
            head, attempt, locked_by, lock_expiry = group[0]
            for seq, priority, event, attempts, due in (yield Stmt(sql.PEEK_CHAIN, where)).rows:
                state: dt.MessageState = "queued"
                due_at = None
                if due is not None and due >= now:
                    state, due_at = "delayed", due
                elif seq == head:
                    attempts = attempt
                    if lock_expiry == sql.HELD:  # a held dead letter, listed as such
                        continue
                    if locked_by is None or lock_expiry < now:
                        state = "ready"
                    else:
                        state = "parked" if locked_by == sql.PARKED else "in_flight"
                        due_at = lock_expiry
                shown.append(
                    dt.QueuedMessage(seq, group_id, priority, event, attempts, state, due_at)
                )
        if len(shown) < limit:
            later = yield Stmt(sql.PEEK_TIMERS, where | {"limit": limit - len(shown)})
            for seq, priority, event, due in later.rows:
                # A due timer is where its promotion will put it: at the end of the chain.
                if due > now:
                    state, due_at = "delayed", due
                else:
                    state, due_at = ("queued" if shown else "ready"), None
                shown.append(dt.QueuedMessage(seq, group_id, priority, event, 0, state, due_at))
        return shown

    return _admin_read(steps)


def SetTenantWeight(tenant: str, weight: int) -> Op[None]:
    def steps(now: float) -> Steps[None]:
        yield Stmt(sql.SET_WEIGHT, {"tenant": tenant, "weight": weight})

    return Plan(steps, wakes=False, brief=True)


def Tenants() -> Op[list[dt.TenantInfo]]:
    def steps(now: float) -> Steps[list[dt.TenantInfo]]:
        counts: dict[str | None, int] = dict((yield Stmt(sql.GROUPS_BY_TENANT)).rows)
        weights: dict[str | None, int] = {
            tenant or None: weight for tenant, weight in (yield Stmt(sql.WEIGHTS)).rows
        }
        names = counts.keys() | weights.keys()
        return [
            dt.TenantInfo(name, weights.get(name, 1), counts.get(name, 0))
            for name in sorted(names, key=lambda name: (name is not None, name or ""))
        ]

    return _admin_read(steps)


# --- waiting claims -------------------------------------------------------------------------


def wait_state(min_priority: int) -> Op[tuple[int, float | None]]:
    params = {"min_priority": min_priority}

    def steps(now: float) -> Steps[tuple[int, float | None]]:
        ((version, busy, timer),) = (yield Stmt(sql.WAIT_STATE, params)).rows
        dues = [due for due in (busy, timer) if due is not None]
        return version, min(dues) if dues else None

    # A read transaction around its one statement, so that no runner mistakes it for a
    # write (see `commit_flushes`).
    return Plan(steps, sql.BEGIN_READ, wakes=False, brief=True)


# --- the builders a transport runs --------------------------------------------------------
