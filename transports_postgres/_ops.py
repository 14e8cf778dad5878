"""Every PostgreSQL operation, sans-I/O, shared by the sync and async runners.

Each is a `transports_core.backend.Operation` whose step is a `Batch`: statements that go
to the server pipelined, in one round trip, and whose reply is their results. The
optional one-round-trip path, `first` and `done`, runs in the implicit transaction of its
pipeline (its closing Sync commits it), so it writes no BEGIN or COMMIT. `steps` runs
the operation's `body` in one explicit transaction (see `transaction`). Core's `drive`
and `drive_async` run them; the runners only send batches and roll back on an error.
No I/O, no clock (the runner passes ``now``: the injected clock's reading, or None for
the server's clock), no driver.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Final, Literal, NamedTuple, TypeVar

import transports_core as dt
from transports_core import backend as core
from transports_core.backend import MORE, More

from . import _sql as sql
from ._sql import Statement

T = TypeVar("T")


class Stmt(NamedTuple):
    """A statement and its parameter values, in the order of ``statement.names``."""

    statement: Statement
    params: Sequence[Any] = ()


class Result(NamedTuple):
    rows: list[Any]
    rowcount: int


Batch = tuple[Stmt, ...]
Steps = core.Steps[Batch, list[Result], T]


class Operation(core.Operation[Batch, list[Result], T]):
    """One call, checked and ready to run. ``call`` names it in errors; ``writes`` says
    whether a lost connection leaves its outcome unknown; ``begin`` opens the transaction
    its `body` runs in."""

    __slots__ = ()
    call: ClassVar[str] = "call"
    writes: ClassVar[bool] = True
    begin: ClassVar[Statement] = sql.BEGIN

    def steps(self, now: float | None) -> Steps[T]:
        return transaction(self.begin, self.body(now))

    def body(self, now: float | None) -> Steps[T]:
        """The batches of the call, run in one transaction."""
        raise NotImplementedError(f"{type(self).__name__} has no steps")


def transaction(begin: Statement, body: Steps[T]) -> Steps[T]:
    """``body`` in one transaction, its bracket at the cost of one round trip, not two:
    ``begin`` goes in the pipeline of the first batch (its result is not passed on), the
    COMMIT once ``body`` has returned. A runner that stops early rolls back."""
    try:
        batch = next(body)
    except StopIteration as stop:  # nothing to send: no transaction either
        value: T = stop.value
        return value
    results = (yield (Stmt(begin), *batch))[1:]
    try:
        while True:
            results = yield body.send(results)
    except StopIteration as stop:
        value = stop.value
    yield (Stmt(sql.COMMIT),)
    return value


# --- the schema -----------------------------------------------------------------------------


class Found(NamedTuple):
    """What `sql.READ_IDENTITY` read of a schema."""

    exists: bool
    relations: int
    has_meta: bool
    can_create: bool
    role: str


def _found(identity: Result) -> Found:
    ((exists, relations, has_meta, can_create, role),) = identity.rows
    return Found(bool(exists), int(relations or 0), bool(has_meta), bool(can_create), str(role))


def _is_ours(schema: str, found: Found) -> bool | None:
    """True: our schema (at some version); None: nothing there yet (or an empty schema);
    otherwise raise, naming the schema."""
    if not found.exists or found.relations == 0:
        return None
    if not found.has_meta:
        raise dt.TransportError(
            f"schema {schema!r} holds {found.relations} relations that are not a "
            "durable-transports queue; refusing to touch it (choose another with ?schema=NAME)"
        )
    return True


def _check_meta(schema: str, rows: list[Any]) -> int | None:
    """The version our schema must be upgraded from first (one of `sql.UPGRADES_FROM`),
    or None if it is current; raise for a `meta` that belongs to someone else or a
    version this code cannot open."""
    meta = dict(rows)
    if meta.get("owner") != sql.OWNER:
        raise dt.TransportError(
            f"schema {schema!r} is not a durable-transports queue (its meta table belongs "
            "to something else); refusing to touch it"
        )
    version = meta.get("version")
    if version == str(sql.SCHEMA_VERSION):
        return None
    for old in sql.UPGRADES_FROM:
        if version == str(old):
            return old
    raise dt.TransportError(
        f"schema {schema!r} has queue schema version {version}; this "
        f"version of durable-transports knows version {sql.SCHEMA_VERSION}"
    )


def _bound(statements: Iterable[Statement], now: float | None) -> Batch:
    """``statements`` of the schema with their values: the owner, this code's version,
    and ``now`` (the time an upgrade gives the messages it finds ready)."""
    values = {"owner": sql.OWNER, "version": str(sql.SCHEMA_VERSION), "now": now}
    return tuple(Stmt(s, tuple(values[name] for name in s.names)) for s in statements)


def _upgrade(version: int, now: float | None) -> Batch:
    """The statements that bring a store at ``version`` to `sql.SCHEMA_VERSION`."""
    return _bound(sql.UPGRADES[version], now)


def _create(exists: bool, now: float | None) -> Batch:
    """The statements that make a new queue, in a schema that ``exists`` (empty) or not."""
    made = _bound(sql.SCHEMA, now)
    return made if exists else (Stmt(sql.CREATE_SCHEMA), *made)


class Opening(NamedTuple):
    """What an opener may change in the schema (`PostgresOptions.migrate`), and the URL
    (redacted) that its refusals tell the reader to migrate."""

    schema: str
    migrate: str
    url: str

    def refuse(self, why: str) -> dt.TransportError:
        return dt.TransportError(
            f"schema {self.schema!r} {why}: run `transports migrate {shlex.quote(self.url)}` "
            "as a role "
            "that may change it (`transports migrate --sql` prints the DDL for review)"
        )

    def may_create(self, found: Found, now: float | None) -> Batch:
        """The statements that create the queue, or raise if this opener may not."""
        why = core.migrate_refusal(self.migrate, None, sql.SCHEMA_VERSION)
        if why is not None:
            raise self.refuse(why)
        if not found.can_create:
            where = "in it" if found.exists else "in this database"
            raise self.refuse(
                f"has no queue yet, and role {found.role!r} may not create one (it lacks the "
                f"CREATE privilege {where})"
            )
        return _create(found.exists, now)

    def may_upgrade(self, version: int, now: float | None) -> Batch:
        """The statements that upgrade the queue from ``version``, or raise if this opener
        may not."""
        why = core.migrate_refusal(self.migrate, version, sql.SCHEMA_VERSION)
        if why is not None:
            raise self.refuse(why)
        return _upgrade(version, now)


class Setup(Operation[None]):
    """Check the schema; create it under the advisory lock if it is not there (when the
    opener may: see `Opening`)."""

    __slots__ = ("opening",)
    call = "open"

    def __init__(self, opening: Opening) -> None:
        self.opening = opening

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.READ_IDENTITY, (self.opening.schema,)),)

    def done(self, results: list[Result], now: float | None) -> More | None:
        # Ours already: only its meta is read, no lock taken. Else: create, under the lock.
        found = _found(results[0])
        if _is_ours(self.opening.schema, found):
            return More(CheckMeta(self.opening))
        self.opening.may_create(found, now)  # refused before any lock or transaction
        return MORE

    def body(self, now: float | None) -> Steps[None]:
        schema = self.opening.schema
        (_, identity) = yield (
            Stmt(sql.SETUP_LOCK, (schema,)),
            Stmt(sql.READ_IDENTITY, (schema,)),
        )
        found = _found(identity)
        if _is_ours(schema, found):
            (meta,) = yield (Stmt(sql.READ_META),)
            old = _check_meta(schema, meta.rows)
            if old is not None:
                yield self.opening.may_upgrade(old, now)
            return
        yield self.opening.may_create(found, now)


class CheckMeta(Operation[None]):
    """Refuse our schema at another version, or a `meta` that belongs to someone else;
    at the version before ours, go on to `UpgradeSchema` if the opener may."""

    __slots__ = ("opening",)
    call = "open"
    writes = False

    def __init__(self, opening: Opening) -> None:
        self.opening = opening

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.READ_META),)

    def done(self, results: list[Result], now: float | None) -> More | None:
        old = _check_meta(self.opening.schema, results[0].rows)
        if old is None:
            return None
        self.opening.may_upgrade(old, now)
        return More(UpgradeSchema(self.opening))


class UpgradeSchema(Operation[None]):
    """Bring a store at `sql.UPGRADES_FROM` to `sql.SCHEMA_VERSION` in one transaction,
    under the setup lock, so that concurrent openers upgrade it once (the others find it
    done). Additive only: the messages stay as they are."""

    __slots__ = ("opening",)
    call = "open"

    def __init__(self, opening: Opening) -> None:
        self.opening = opening

    def body(self, now: float | None) -> Steps[None]:
        schema = self.opening.schema
        (_, meta) = yield (Stmt(sql.SETUP_LOCK, (schema,)), Stmt(sql.READ_META))
        old = _check_meta(schema, meta.rows)
        if old is not None:
            yield self.opening.may_upgrade(old, now)


Plan = tuple[Literal["missing", "old", "current"], int | None, Batch]


class Migrate(Operation[Plan]):
    """What ``transports migrate`` does: under the setup lock (so that no opener creates
    or upgrades the schema meanwhile), find the schema's state and the statements that
    bring it to `sql.SCHEMA_VERSION`, the lock first; run them too if ``apply``. Without
    ``apply`` it writes nothing: the lock goes with its transaction."""

    __slots__ = ("apply", "schema")
    call = "migrate"

    def __init__(self, schema: str, apply: bool) -> None:
        self.schema, self.apply = schema, apply

    def body(self, now: float | None) -> Steps[Plan]:
        lock = Stmt(sql.SETUP_LOCK, (self.schema,))
        (_, identity) = yield (lock, Stmt(sql.READ_IDENTITY, (self.schema,)))
        found = _found(identity)
        plan: Plan
        if _is_ours(self.schema, found):
            (meta,) = yield (Stmt(sql.READ_META),)
            old = _check_meta(self.schema, meta.rows)
            if old is None:
                return ("current", sql.SCHEMA_VERSION, ())
            plan = ("old", old, _upgrade(old, now))
        else:
            plan = ("missing", None, _create(found.exists, now))
        if self.apply:
            yield plan[2]
        return (plan[0], plan[1], (lock, *plan[2]))


# --- publish --------------------------------------------------------------------------------


class Publish(Operation[int]):
    """Lock the group, then draw the seq and append under that lock: one round trip."""

    __slots__ = ("group_id", "params")
    call = "publish"

    def __init__(
        self, codec: core.EventCodec[Any], group_id: str, event: object, priority: int
    ) -> None:
        self.group_id = core.check_group_id(group_id)
        priority = core.check_priority(priority)
        self.params = (self.group_id, priority, codec.encode(event))

    def first(self, now: float | None) -> Batch:
        group_id, priority, raw = self.params
        return (
            Stmt(sql.LOCK_GROUP, (group_id, priority)),
            Stmt(sql.APPEND, (group_id, now, priority, raw)),
        )

    def done(self, results: list[Result], now: float | None) -> int | More:
        seq, _, due = results[1].rows[0]
        if due:  # delayed messages of the group came due: they join it first
            group_id, priority, raw = self.params
            return More(PublishWith(core.Item(group_id, raw, priority, None, 0, False, None), 0))
        return int(seq)


class PublishWith(Operation[int]):
    """A publish with any of a key, a delay, a hold or a tenant (``item``, checked and
    encoded by core). With a key alone: lock the group, then offer the key with a new
    seq and store the message only if the key takes it (`sql.KEYED_APPEND`): one round
    trip, unless delayed messages of the group are due. Otherwise, and then: lock the
    group, let its due delayed messages join it (`sql.PROMOTE`), and store this one
    (`sql.STORE_WITH`). A `Duplicate` of the original seq when the key is known."""

    __slots__ = ("item", "window")
    call = "publish"

    def __init__(self, item: core.Item, window: float) -> None:
        self.item, self.window = item, window

    def first(self, now: float | None) -> Batch | None:
        item = self.item
        if item.delay or item.tenant is not None or item.key is None:
            return None
        return (
            Stmt(sql.LOCK_GROUP, (item.group_id, item.priority)),
            Stmt(
                sql.KEYED_APPEND,
                (item.group_id, now, item.key, self.window, item.priority, item.event),
            ),
        )

    def done(self, results: list[Result], now: float | None) -> int | More:
        seq, stored, _, due = results[1].rows[0]
        if due:
            return MORE
        return int(seq) if stored else dt.Duplicate(seq)

    def body(self, now: float | None) -> Steps[int]:
        (stored,) = yield from _storing([self.item], self.window, now)
        return stored


def _store(item: core.Item, window: float, now: float | None) -> Stmt:
    return Stmt(
        sql.STORE_WITH,
        (
            item.group_id,
            item.key,
            now,
            window,
            item.priority,
            item.tenant,
            item.event,
            float(item.delay),
            bool(item.hold),
        ),
    )


def _storing(items: Sequence[core.Item], window: float, now: float | None) -> Steps[list[int]]:
    """Lock the groups that ``items`` join now in order, let their due delayed messages
    join them, store ``items`` one by one, and drop the groups left empty: one round
    trip; the seqs (or `Duplicate` values), in order. A message delayed without ``hold``
    joins no group until it is due (it waits in the timers, under its key if it has one),
    so its group is neither locked nor made: a group row made to lock a group and dropped
    again would leave a dead entry in the groups' indexes until a vacuum, one per delayed
    publish to a group without messages, which slowed every claim (and its planning) on
    a queue of many timers. What the lock would order it against, a publish to its group
    after it came due, is ordered by the commits: the message joins when it is due and
    its publish has committed."""
    groups = sorted({item.group_id for item in items if not (item.delay and not item.hold)})
    locking = (
        (Stmt(sql.LOCK_GROUP_LIST, (groups,)), Stmt(sql.PROMOTE, (groups, now, None)))
        if groups
        else ()
    )
    stores = tuple(_store(item, window, now) for item in items)
    dropping = (Stmt(sql.DROP_EMPTY, (groups,)),) if groups else ()
    results = yield (*locking, *stores, *dropping)
    first = len(locking)
    return [_stored(result) for result in results[first : first + len(stores)]]


def _stored(result: Result) -> int:
    seq, stored, _ = result.rows[0]
    return int(seq) if stored else dt.Duplicate(seq)


class PublishManyWith(Operation[list[int]]):
    """A batch with a delay, a hold or a tenant somewhere: every item stored as
    `PublishWith` stores one, under the locks of all the batch's groups, in one round
    trip and one transaction."""

    __slots__ = ("items", "window")
    call = "publish_many"

    def __init__(self, items: list[core.Item], window: float) -> None:
        self.items, self.window = items, window

    def body(self, now: float | None) -> Steps[list[int]]:
        return (yield from _storing(self.items, self.window, now))


class PublishMany(Operation[list[int]]):
    """Lock (or create) every group of the batch and count it in, then draw the seqs
    under those locks and store the batch: one round trip, one transaction, whatever its
    size. With keys, see `PublishKeyedMany`."""

    __slots__ = ("appended", "locked")
    call = "publish_many"

    def __init__(self, encoded: list[core.Item]) -> None:
        # Each group of the batch: its priority (its first message's), its count, and the
        # place of its first message (1-based).
        seen: dict[str, list[int]] = {}
        for place, (group_id, _, priority, *_) in enumerate(encoded, 1):
            found = seen.get(group_id)
            if found is None:
                seen[group_id] = [priority, 1, place]
            else:
                found[1] += 1
        groups = list(seen)
        self.locked = (
            groups,
            [found[0] for found in seen.values()],
            [found[1] for found in seen.values()],
        )
        self.appended = (
            [item[1] for item in encoded],
            [item[0] for item in encoded],
            [item[2] for item in encoded],
            groups,
            [found[2] for found in seen.values()],
        )

    def first(self, now: float | None) -> Batch:
        if not self.locked[0]:
            return ()
        return (
            Stmt(sql.LOCK_GROUPS, self.locked),
            Stmt(sql.PROMOTE, (self.locked[0], now, None)),
            Stmt(sql.APPEND_MANY, (*self.appended, now)),
        )

    def done(self, results: list[Result], now: float | None) -> list[int]:
        return list(results[2].rows[0][0]) if results else []


class PublishKeyedMany(Operation[list[int]]):
    """A batch with keys: lock every group of it, counting it in, then store it
    (`sql.APPEND_MANY_NEW_KEYS`): one round trip while all its keys are new. If one is
    known already, that try stores nothing and the batch runs again in `PublishKnownKeys`,
    which stores each message whose key is new or expired. An item repeating an earlier
    item's group and key is not sent: it is a `Duplicate` of whatever that earlier item's
    seq turns out to be."""

    __slots__ = ("appended", "firsts", "locked", "repeats")
    call = "publish_many"

    def __init__(self, encoded: list[core.Item], window: float) -> None:
        # Each group's priority (its first message's), count of messages sent, and the
        # place (1-based, among those sent) of its first.
        groups_seen: dict[str, list[int]] = {}
        # The place (0-based, among the items sent) of each key's first item, and for
        # every item its place among those sent, or, for a repeat, its first's, negated
        # and less one (so that 0 stays unambiguous).
        firsts: dict[tuple[str, str], int] = {}
        places: list[int] = []
        sent: list[core.Item] = []
        for item in encoded:
            group_id, _, priority, key, *_ = item
            if key is not None:
                first = firsts.setdefault((group_id, key), len(sent))
                if first != len(sent):
                    places.append(-first - 1)
                    continue
            places.append(len(sent))
            sent.append(item)
            groups_seen.setdefault(group_id, [priority, 0, len(sent)])[1] += 1
        self.repeats = places
        self.locked = (
            list(groups_seen),
            [found[0] for found in groups_seen.values()],
            [found[1] for found in groups_seen.values()],
        )
        self.firsts = [found[2] for found in groups_seen.values()]
        self.appended = (
            [item[1] for item in sent],
            [item[0] for item in sent],
            [item[2] for item in sent],
            [item[3] for item in sent],
            window,
        )

    def first(self, now: float | None) -> Batch:
        events, group_ids, priorities, keys, window = self.appended
        groups, _, counts = self.locked
        params = (group_ids, keys, events, priorities, now, window, groups, self.firsts, counts)
        return (
            Stmt(sql.LOCK_GROUPS, self.locked),
            Stmt(sql.PROMOTE, (groups, now, None)),
            Stmt(sql.APPEND_MANY_NEW_KEYS, params),
        )

    def done(self, results: list[Result], now: float | None) -> list[int] | More:
        seen, seqs, _ = results[2].rows[0]
        if seen:
            return More(PublishKnownKeys(self))
        return self.answer(seqs, seqs)

    def answer(self, drawn: Sequence[int], kept: Sequence[int]) -> list[int]:
        """Each item's seq, or a `Duplicate` of its key's: ``drawn`` for each message sent,
        ``kept`` what its key kept (another seq: a duplicate)."""
        sent = [
            int(seq) if seq == mine else dt.Duplicate(seq)
            for seq, mine in zip(kept, drawn, strict=True)
        ]
        return [sent[p] if p >= 0 else dt.Duplicate(sent[-p - 1]) for p in self.repeats]


class PublishKnownKeys(Operation[list[int]]):
    """A keyed batch with a key known already: lock every group of it, counting it in,
    then store each message whose key is new or expired and forget a few expired keys
    (`sql.APPEND_MANY_KEYED`): one round trip."""

    __slots__ = ("batch",)
    call = "publish_many"

    def __init__(self, batch: PublishKeyedMany) -> None:
        self.batch = batch

    def first(self, now: float | None) -> Batch:
        events, group_ids, priorities, keys, window = self.batch.appended
        return (
            Stmt(sql.LOCK_GROUPS, self.batch.locked),
            Stmt(sql.PROMOTE, (self.batch.locked[0], now, None)),
            Stmt(sql.APPEND_MANY_KEYED, (events, group_ids, priorities, keys, now, window)),
        )

    def done(self, results: list[Result], now: float | None) -> list[int]:
        drawn, kept, _ = results[2].rows[0]
        return self.batch.answer(drawn, kept)


def publish_many(
    codec: core.EventCodec[Any],
    items: Iterable[tuple[str, Any, int] | dt.Message[Any]],
    window: float,
) -> PublishMany | PublishKeyedMany | PublishManyWith:
    """The operation of one publish_many: a plain `PublishMany` unless an item has a key."""
    encoded = codec.encode_items(items)
    if any(item.delay or item.tenant is not None for item in encoded):
        return PublishManyWith(encoded, window)
    for item in encoded:
        if item.key is not None:
            return PublishKeyedMany(encoded, window)
    return PublishMany(encoded)


# --- claim --------------------------------------------------------------------------------------


class Claim(Operation[core.Claimed | None], core.Claiming[core.Claimed | None]):
    """Lease the next ready head: one statement while no lapsed group waits to be woken.
    Otherwise (or finding nothing), and with ``max_attempts`` when the head has had its
    deliveries, the claim goes on in `ClaimRest`."""

    __slots__ = ()
    call = "claim"
    # The `synchronous_commit` of the first try (None: the session's); see `LeaseClaim`.
    lease_commit: ClassVar[str | None] = None

    def _claim(
        self, now: float | None, statement: Statement = sql.CLAIM, commit: str | None = None
    ) -> Stmt:
        return Stmt(statement, (self.min_priority, now, self.worker_id, self.visibility, commit))

    def first(self, now: float | None) -> Batch:
        # Only the first try may skip the flush: the rest of a claim may bury a message.
        return (self._claim(now, sql.CLAIM_READY, self.lease_commit),)

    def _due(self, row: Sequence[Any]) -> bool:
        # The claim's own increment of attempt is not a delivery.
        return self.max_attempts is not None and row[3] - 1 - row[5] >= self.max_attempts

    def done(self, results: list[Result], now: float | None) -> core.Claimed | More:
        rows = results[0].rows
        if not rows or self._due(rows[0]):
            return More(ClaimRest(self, rows[0] if rows else None))
        return self._claimed(rows[0])

    def _claimed(self, row: Sequence[Any]) -> core.Claimed:
        seq, group_id, raw, attempt, expires_at, _, _ = row
        return core.Claimed(seq, group_id, raw, self.worker_id, attempt, expires_at)


class LeaseClaim(Claim):
    """A `Claim` of a transport opened with ``lease_commit=async``: its first try, which
    only moves a lease, commits without waiting for its WAL flush (`sql._LEASE_COMMIT`)."""

    __slots__ = ()
    lease_commit = "off"


class ClaimRest(Operation[core.Claimed | None]):
    """The rest of a `Claim` whose first try found nothing (``row`` None: wake the lapsed
    groups and claim again) or leased a head due for burial (bury it, fenced by the lease
    just taken, and claim again)."""

    __slots__ = ("claim", "row")
    call = "claim"

    def __init__(self, claim: Claim, row: Sequence[Any] | None) -> None:
        self.claim, self.row = claim, row

    def first(self, now: float | None) -> Batch | None:
        # Found nothing: wake and claim again, one round trip, one transaction, unless a
        # delayed message is due or a group has a tenant (`ClaimTurn`).
        if self.row is None:
            return (
                Stmt(sql.WAKE_LAPSED, (now,)),
                self.claim._claim(now, sql.CLAIM_SIMPLE),
                Stmt(sql.CLAIM_NEEDS, (now,)),
            )
        return None

    def done(self, results: list[Result], now: float | None) -> core.Claimed | More | None:
        rows = results[1].rows
        if not rows:
            due, tenanted = results[2].rows[0]
            return More(ClaimTurn(self.claim)) if due or tenanted else None
        if self.claim._due(rows[0]):
            return More(ClaimRest(self.claim, rows[0]))
        return self.claim._claimed(rows[0])

    def body(self, now: float | None) -> Steps[core.Claimed | None]:
        assert self.row is not None  # `first` took the other case
        return (yield from _bury_and_claim(self.claim, self.row, now))


def _bury_and_claim(
    claim: Claim, row: Sequence[Any], now: float | None
) -> Steps[core.Claimed | None]:
    """Bury the head ``row`` leased while it is due for burial and claim again."""
    while claim._due(row):
        yield from _bury_and_claim_once(claim, row, now)
        (result,) = yield (claim._claim(now),)
        if not result.rows:
            return None
        row = result.rows[0]
    return claim._claimed(row)


class ClaimTurn(Operation[core.Claimed | None]):
    """A claim while delayed messages are due or groups have tenants, in one transaction:
    the first due delayed messages join their groups (`sql.LOCK_DUE_GROUPS`, then
    `sql.PROMOTE`), and then, with tenants, the tenant whose turn it is is chosen under
    the lock of the virtual time (`sql.TENANT_TURNS`) and one of its groups claimed, the
    turn recorded (`sql.TAKE_TURN`); without, a claim as `ClaimRest`'s."""

    __slots__ = ("claim",)
    call = "claim"

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def body(self, now: float | None) -> Steps[core.Claimed | None]:
        claim = self.claim
        yield from _promote(now, sql.PROMOTE_BATCH)
        _, needs = yield (Stmt(sql.WAKE_LAPSED, (now,)), Stmt(sql.CLAIM_NEEDS, (now,)))
        if not needs.rows[0][1]:
            (result,) = yield (claim._claim(now),)
            if not result.rows:
                return None
            return (yield from _bury_and_claim(claim, result.rows[0], now))
        while True:
            (turns,) = yield (Stmt(sql.TENANT_TURNS),)
            for turn in turns.rows:
                lease = (now, claim.worker_id, claim.visibility, None)
                (result,) = yield (
                    Stmt(sql.CLAIM_TENANT, (claim.min_priority, turn[0], *lease))
                    if turn[0]
                    else Stmt(sql.CLAIM_NO_TENANT, (claim.min_priority, *lease)),
                )
                if result.rows:
                    break
            else:
                return None
            row = result.rows[0]
            if claim._due(row):  # buried: no turn taken, the tenants are looked at again
                yield from _bury_and_claim_once(claim, row, now)
                continue
            tenant, start, weight = turn
            yield (Stmt(sql.TAKE_TURN, (start, tenant, weight)),)
            return claim._claimed(row)


def _bury_and_claim_once(claim: Claim, row: Sequence[Any], now: float | None) -> Steps[None]:
    """Bury the head ``row`` leased, which is due for burial."""
    assert claim.max_attempts is not None
    seq, group_id, _, attempt, _, base, before = row
    delivered = attempt - 1
    last: Literal["lapsed", "nacked"] = (
        "nacked" if before is None or before in (sql.PARKED, sql.DELAYED) else "lapsed"
    )
    reason = core.exhausted_reason(delivered - base, claim.max_attempts, last)
    yield from _bury(
        (group_id, seq, claim.worker_id, attempt), delivered, reason, claim.on_dead, now
    )


def _bury(
    fence: tuple[str, int, str, int], attempts: int, reason: str, on_dead: str, now: float | None
) -> Steps[bool]:
    """Make the fenced head a dead letter (in a transaction); False if not current."""
    (_, buried) = yield (
        Stmt(sql.LOCK_LEASE, fence),
        Stmt(sql.BURY, (*fence, attempts, reason, now)),
    )
    if buried.rowcount != 1:
        return False
    if on_dead == "hold":
        yield (Stmt(sql.HOLD_GROUP, (*fence, sql.PARKED, attempts)),)
    else:
        yield (Stmt(sql.ACK, (*fence, now)),)
    return True


class NextDue(Operation[tuple[float | None, bool]]):
    """A blocked claim's look: seconds until the next lease or park ends (None: none is
    running), and whether a group is ready at or above ``min_priority``."""

    __slots__ = ("min_priority",)
    call = "claim"
    writes = False

    def __init__(self, min_priority: int) -> None:
        self.min_priority = min_priority

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.NEXT_DUE, (now, self.min_priority)),)

    def done(self, results: list[Result], now: float | None) -> tuple[float | None, bool]:
        due, ready = results[0].rows[0]
        return due, ready


class Waiter(Operation[None]):
    """Register (or unregister) a listener's backend as having a claim blocked."""

    __slots__ = ("pid", "present")
    call = "claim"
    writes = False

    def __init__(self, pid: int, present: bool) -> None:
        self.pid, self.present = pid, present

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.REGISTER_WAITER if self.present else sql.UNREGISTER_WAITER, (self.pid,)),)

    def done(self, results: list[Result], now: float | None) -> None:
        return None


class Unclaim(Operation[bool]):
    """Give back what a claim leased, its delivery uncounted (`sql.UNCLAIM`): for an async
    claim whose task was cancelled (see `GiveBack`). False if the lease was not current."""

    __slots__ = ("fence",)
    call = "claim"

    def __init__(self, claimed: core.Claimed) -> None:
        self.fence = (claimed.group_id, claimed.seq, claimed.worker_id, claimed.attempt)

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.UNCLAIM, self.fence),)

    def done(self, results: list[Result], now: float | None) -> bool:
        given: bool = results[0].rows[0][0] == 1
        return given


# --- settle ------------------------------------------------------------------------------------


def _fence(lease: dt.Lease[object]) -> tuple[str, int, str, int]:
    return (lease.group_id, lease.seq, lease.worker_id, lease.attempt)  # FENCE_NAMES


class _Settle(Operation[T], core.Settle[T]):
    __slots__ = ("fence",)

    def __init__(self, lease: dt.Lease[Any]) -> None:
        super().__init__(lease)
        self.fence = _fence(lease)


class Ack(_Settle[None]):
    """One statement, which takes no lock first (`sql.ACK_AT_ONCE`); when a publish to the
    group commits while it runs and its snapshot cannot tell the next head, it changes
    nothing and the steps ack again: lock the group first, then remove the head in a fresh
    statement, whose snapshot includes that publish."""

    __slots__ = ()
    call = "ack"

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.ACK_AT_ONCE, (*self.fence, now)),)

    def done(self, results: list[Result], now: float | None) -> More | None:
        removed, _, held = results[0].rows[0]
        if removed == 0 and held:
            return MORE
        self.held(removed == 1)
        return None

    def body(self, now: float | None) -> Steps[None]:
        _, removed = yield (
            Stmt(sql.LOCK_LEASE, self.fence),
            Stmt(sql.ACK, (*self.fence, now)),
        )
        self.held(removed.rows[0][0] == 1)


class Nack(_Settle[None]):
    __slots__ = ("delay", "lease_commit")
    call = "nack"

    def __init__(self, lease: dt.Lease[Any], delay: float, lease_commit: str | None = None) -> None:
        super().__init__(lease)
        self.delay = core.check_delay(delay)
        self.lease_commit = lease_commit

    def first(self, now: float | None) -> Batch:
        if self.delay > 0:  # park: the group stays held until the delay has passed
            params = (*self.fence, sql.PARKED, now, self.delay, self.lease_commit)
            return (Stmt(sql.RELEASE, params),)
        return (Stmt(sql.FREE, (*self.fence, self.lease_commit)),)

    def done(self, results: list[Result], now: float | None) -> None:
        (result,) = results
        self.held((result.rows[0][0] if result.rows else result.rowcount) == 1)


class Extend(_Settle[dt.Lease[T]]):
    __slots__ = ("lease_commit", "visibility")
    call = "extend"
    lease: dt.Lease[T]

    def __init__(
        self, lease: dt.Lease[T], visibility: float, lease_commit: str | None = None
    ) -> None:
        super().__init__(lease)
        self.visibility = core.check_visibility(visibility)
        self.lease_commit = lease_commit

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.EXTEND, (*self.fence, now, self.visibility, self.lease_commit)),)

    def done(self, results: list[Result], now: float | None) -> dt.Lease[T]:
        rows = results[0].rows
        self.held(len(rows) == 1)
        return self.renewed(rows[0][0])


class BuryLease(_Settle[None]):
    """A dead letter now, fenced like an ack, under ``on_dead``."""

    __slots__ = ("on_dead", "reason")
    call = "bury"

    def __init__(self, lease: dt.Lease[Any], reason: str, on_dead: str) -> None:
        super().__init__(lease)
        self.reason = core.buried_reason(core.check_reason(reason))
        self.on_dead = on_dead

    def body(self, now: float | None) -> Steps[None]:
        buried = yield from _bury(self.fence, self.lease.attempt, self.reason, self.on_dead, now)
        self.held(buried)


# --- admin ------------------------------------------------------------------------------------


class _Read(Operation[T]):
    """An admin read: due delayed messages join their groups first (in a transaction of
    their own, and only when one is due), then the read runs in one snapshot."""

    __slots__ = ()
    call = "admin"
    writes = False
    begin = sql.BEGIN_READ

    def steps(self, now: float | None) -> Steps[T]:
        yield from transaction(sql.BEGIN, _promote_due(now))
        return (yield from transaction(self.begin, self.body(now)))


def _promote_due(now: float | None) -> Steps[None]:
    """Every due delayed message joins its group, a batch of groups at a time."""
    (due,) = yield (Stmt(sql.DUE_EXISTS, (now,)),)
    while due.rows[0][0] and (yield from _promote(now, None)):
        (due,) = yield (Stmt(sql.DUE_EXISTS, (now,)),)


def _promote(now: float | None, limit: int | None) -> Steps[bool]:
    """The groups of the first due delayed messages made and locked (those free), and
    their due messages (at most ``limit``) moved into them; False if none was locked."""
    (made,) = yield (Stmt(sql.MAKE_DUE_GROUPS, (now,)),)
    wanted = made.rows[0][0]
    if not wanted:
        return False
    (taken,) = yield (Stmt(sql.TAKE_DUE_GROUPS, (wanted,)),)
    groups = taken.rows[0][0]
    if groups:
        yield (Stmt(sql.PROMOTE, (groups, now, limit)),)
    yield (Stmt(sql.DROP_EMPTY, (wanted,)),)
    return bool(groups)


class Stats(_Read[dt.QueueStats]):
    __slots__ = ()
    call = "stats"

    def body(self, now: float | None) -> Steps[dt.QueueStats]:
        live, dead_rows, keys, timers, held, paused = yield (
            Stmt(sql.MESSAGE_COUNTS, (sql.PARKED, now)),
            Stmt(sql.DEAD_COUNTS),
            Stmt(sql.KEY_COUNT, (now,)),
            Stmt(sql.TIMER_COUNTS),
            Stmt(sql.HELD_COUNTS, (now,)),
            Stmt(sql.PAUSED_COUNT),
        )
        delayed: dict[int, int] = {}
        for p, n in (*timers.rows, *held.rows):
            delayed[p] = delayed.get(p, 0) + int(n)
        # A held message not due is counted delayed, not ready.
        holding = {p: int(n) for p, n in held.rows}
        # Per priority: the message counts, the backlog's age (None: nothing ready) and
        # its ready and busy groups.
        found: dict[int, dict[str, Any]] = {
            p: {
                "ready": int(ready) - holding.get(p, 0),
                "in_flight": int(leased),
                "parked": int(parked),
                "oldest_ready_age": None if age is None else float(age),
                "ready_groups": int(open_),
                "busy_groups": int(busy),
            }
            for p, ready, leased, parked, open_, busy, age in live.rows
        }
        dead = {p: int(n) for p, n in dead_rows.rows}
        none = {"ready": 0, "in_flight": 0, "parked": 0}
        return core.queue_stats(
            (
                dt.PriorityStats(
                    p, **found.get(p, none), dead=dead.get(p, 0), delayed=delayed.get(p, 0)
                )
                for p in sorted(found.keys() | dead.keys() | delayed.keys())
            ),
            keys=int(keys.rows[0][0]),
            paused=int(paused.rows[0][0]),
        )


class Groups(_Read[list[dt.GroupInfo]]):
    __slots__ = ("limit",)
    call = "groups"

    def __init__(self, limit: int) -> None:
        self.limit = core.check_limit(limit)

    def body(self, now: float | None) -> Steps[list[dt.GroupInfo]]:
        clock, rows = yield (
            Stmt(sql.SERVER_NOW, (now,)),
            Stmt(sql.DEEPEST_GROUPS, (sql.PARKED, self.limit)),
        )
        at = clock.rows[0][0]
        return [
            core.group_info(
                row[:7], at, parked=sql.PARKED, held=sql.HELD, paused=row[7], tenant=row[8]
            )
            for row in rows.rows
        ]


class DeadLetters(_Read[list[dt.DeadLetter]]):
    __slots__ = ("limit",)
    call = "dead_letters"

    def __init__(self, limit: int | None) -> None:
        self.limit = None if limit is None else core.check_limit(limit)

    def body(self, now: float | None) -> Steps[list[dt.DeadLetter]]:
        (result,) = yield (Stmt(sql.LIST_DEAD_LETTERS, (self.limit,)),)
        return list(map(core.dead_letter, result.rows))


class HeldGroups(_Read[list[dt.HeldGroup]]):
    __slots__ = ()
    call = "held_groups"

    def body(self, now: float | None) -> Steps[list[dt.HeldGroup]]:
        (result,) = yield (Stmt(sql.LIST_HELD_GROUPS),)
        return list(map(core.held_group, result.rows))


class _DeadLetterOp(Operation[bool]):
    """Requeue and discard: lock dead letter ``seq`` and `act` on it, knowing its group
    and whether it holds it; False when there is no such dead letter."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = core.check_seq(seq)

    def body(self, now: float | None) -> Steps[bool]:
        (found,) = yield (Stmt(sql.DEAD_LETTER, (self.seq,)),)
        if not found.rows:
            return False
        group_id, _, held = found.rows[0]
        yield from self.act(group_id, bool(held), now)
        return True

    def act(self, group_id: str, held: bool, now: float | None) -> Steps[None]:
        raise NotImplementedError


class Requeue(_DeadLetterOp):
    __slots__ = ()
    call = "requeue"

    def act(self, group_id: str, held: bool, now: float | None) -> Steps[None]:
        seq = self.seq
        if held:
            yield (
                Stmt(sql.UNHOLD_GROUP, (group_id, seq, now)),
                Stmt(sql.FORGET_DEAD_LETTER, (seq,)),
            )
            return
        (holder,) = yield (Stmt(sql.GROUP_HOLDER, (group_id, sql.PARKED)),)
        if holder.rows:
            locked_by, head, is_held = holder.rows[0]
            if is_held:
                raise dt.RequeueRefused(seq, group_id, None, head)
            raise dt.RequeueRefused(seq, group_id, locked_by)
        yield (
            Stmt(sql.STASH_HEAD_ATTEMPT, (group_id, seq)),
            Stmt(sql.RESTORE_MESSAGE, (seq, now)),
            Stmt(sql.RESTORE_HEAD, (seq,)),
            Stmt(sql.FORGET_DEAD_LETTER, (seq,)),
        )


class Discard(_DeadLetterOp):
    __slots__ = ()
    call = "discard"

    def act(self, group_id: str, held: bool, now: float | None) -> Steps[None]:
        seq = self.seq
        if held:  # its row in `messages` goes too, which frees the group
            yield (Stmt(sql.LOCK_GROUP_ROW, (group_id,)),)
            yield (Stmt(sql.DROP_HELD_HEAD, (group_id, seq, now)),)
        yield (Stmt(sql.FORGET_DEAD_LETTER, (seq,)),)


class PurgeGroup(Operation[int]):
    __slots__ = ("group_id",)
    call = "purge_group"

    def __init__(self, group_id: str) -> None:
        self.group_id = core.check_group_id(group_id)

    def body(self, now: float | None) -> Steps[int]:
        g = (self.group_id,)
        yield (Stmt(sql.LOCK_GROUP_DEAD_LETTERS, g), Stmt(sql.LOCK_GROUP_ROW, g))
        _, messages, dead, timers = yield (
            Stmt(sql.DROP_GROUP, g),
            Stmt(sql.PURGE_MESSAGES, g),
            Stmt(sql.PURGE_DEAD_LETTERS, g),
            Stmt(sql.PURGE_TIMERS, g),
        )
        # A held dead letter is in both tables; count it once.
        removed = {row[0] for row in messages.rows} | {row[0] for row in dead.rows}
        return len(removed) + len(timers.rows)


class Cancel(Operation[bool]):
    """A delayed message is deleted by its seq; a message in a group is found, its group
    locked, and it is removed unless a worker's lease on it is running (a head: its
    group goes on with the next message)."""

    __slots__ = ("seq",)
    call = "cancel"

    def __init__(self, seq: int) -> None:
        self.seq = seq

    def body(self, now: float | None) -> Steps[bool]:
        seq = self.seq
        (timer,) = yield (Stmt(sql.CANCEL_TIMER, (seq,)),)
        if timer.rowcount == 1:
            return True
        (found,) = yield (Stmt(sql.FIND_MESSAGE, (seq,)),)
        if not found.rows:
            return False
        group_id = found.rows[0][0]
        _, state = yield (
            Stmt(sql.LOCK_GROUP_ROW, (group_id,)),
            Stmt(sql.CANCEL_STATE, (now, group_id, seq)),
        )
        if not state.rows:
            return False
        place, head, leased = state.rows[0]
        if leased:
            return False
        if head:
            (removed,) = yield (Stmt(sql.CANCEL_HEAD, (group_id, seq, now)),)
            return bool(removed.rows[0][0] == 1)
        yield (Stmt(sql.CANCEL_QUEUED, (group_id, place)),)
        return True


class Pause(Operation[bool]):
    """Store (or forget) a group's pause and copy it onto its row, locked first."""

    __slots__ = ("group_id", "paused")
    call = "pause"

    def __init__(self, group_id: str, paused: bool) -> None:
        self.group_id, self.paused = group_id, paused

    def body(self, now: float | None) -> Steps[bool]:
        g = self.group_id
        _, changed, _ = yield (
            Stmt(sql.LOCK_GROUP, (g, 0)),
            Stmt(sql.PAUSE if self.paused else sql.RESUME, (g,)),
            Stmt(sql.DROP_EMPTY, ([g],)),
        )
        return bool(changed.rows[0][0] == 1)


class PausedGroups(_Read[list[str]]):
    __slots__ = ()
    call = "paused_groups"

    def steps(self, now: float | None) -> Steps[list[str]]:
        return transaction(self.begin, self.body(now))

    def body(self, now: float | None) -> Steps[list[str]]:
        (result,) = yield (Stmt(sql.LIST_PAUSED),)
        return [row[0] for row in result.rows]


class Peek(_Read[list[dt.QueuedMessage]]):
    __slots__ = ("group_id", "limit")
    call = "peek"

    def __init__(self, group_id: str, limit: int) -> None:
        self.group_id, self.limit = group_id, limit

    def body(self, now: float | None) -> Steps[list[dt.QueuedMessage]]:
        (result,) = yield (Stmt(sql.PEEK, (now, self.group_id, self.limit)),)
        return [dt.QueuedMessage(*row) for row in result.rows[: self.limit]]


class SetTenantWeight(Operation[None]):
    __slots__ = ("tenant", "weight")
    call = "set_tenant_weight"

    def __init__(self, tenant: str, weight: int) -> None:
        self.tenant, self.weight = tenant, weight

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.SET_WEIGHT, (self.tenant, self.weight)),)

    def done(self, results: list[Result], now: float | None) -> None:
        return None


class Tenants(_Read[list[dt.TenantInfo]]):
    __slots__ = ()
    call = "tenants"

    def body(self, now: float | None) -> Steps[list[dt.TenantInfo]]:
        (result,) = yield (Stmt(sql.LIST_TENANTS),)
        return [dt.TenantInfo(name, int(weight), int(n)) for name, weight, n in result.rows]


# --- within: the caller's transaction ------------------------------------------------------


class Identity(Operation[tuple[Any, ...]]):
    """Which database, server and queue a connection reaches (`sql.IDENTITY`)."""

    __slots__ = ("schema",)
    call = "within"
    writes = False

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def first(self, now: float | None) -> Batch:
        return (Stmt(sql.IDENTITY, (self.schema,)),)

    def done(self, results: list[Result], now: float | None) -> tuple[Any, ...]:
        return tuple(results[0].rows[0])


class Bare(core.Operation[Batch, list[Result], T]):
    """``op`` without the transaction its `Operation.steps` opens and commits: its
    `Operation.body`, for a runner inside a transaction of the caller's. The one-round-trip
    path is the same (in a transaction block a pipeline's Sync commits nothing)."""

    __slots__ = ("op",)

    def __init__(self, op: Operation[T]) -> None:
        self.op = op

    def first(self, now: float | None) -> Batch | None:
        return self.op.first(now)

    def done(self, results: list[Result], now: float | None) -> T | More:
        value = self.op.done(results, now)
        if isinstance(value, More) and value.then is not None:
            then = value.then
            assert isinstance(then, Operation)  # this backend's operations go on with theirs
            return More(Bare(then))
        return value

    def steps(self, now: float | None) -> Steps[T]:
        return self.op.body(now)


def joined_prelude(op: Operation[Any]) -> Batch:
    """What goes before ``op``'s first statements in a caller's transaction: our savepoint,
    the notification a snapshot needs (`sql.NOTIFY_IF_SNAPSHOT`) and, for a settle, the
    lock of its group (`sql.LOCK_GROUP`). In repeatable read or serializable, that lock
    fails with a serialization error when the group changed after the snapshot was taken
    (a lease taken, extended or lost since), where the fence alone, read in the
    snapshot, would report a current lease as lost; a group row the lock creates goes
    with the savepoint."""
    prelude = (Stmt(sql.SAVEPOINT), Stmt(sql.NOTIFY_IF_SNAPSHOT))
    if isinstance(op, _Settle):
        return (*prelude, Stmt(sql.LOCK_GROUP, (op.fence[0], 0)))
    return prelude


# What a joined operation's runner sends when it failed after its savepoint was made: its
# statements are undone and the savepoint goes, the caller's transaction usable again.
UNDO: Final = (Stmt(sql.ROLLBACK_TO_SAVEPOINT), Stmt(sql.RELEASE_SAVEPOINT))


class Joined(core.Operation[Batch, list[Result], T]):
    """``op`` in a caller's transaction, the one body of both twins' `within` runners:
    its statements (`Bare`: no BEGIN or COMMIT) with `joined_prelude` pipelined before
    the first of them, and the savepoint released once it has returned. ``opened`` says
    whether the savepoint was made: a runner whose call failed then sends `UNDO`."""

    __slots__ = ("op", "opened")

    def __init__(self, op: Operation[T]) -> None:
        self.op, self.opened = op, False

    def steps(self, now: float | None) -> Steps[T]:
        body = core.inline(Bare(self.op), now)
        try:
            batch = next(body)
        except StopIteration as stop:  # nothing to send: no savepoint either
            value: T = stop.value
            return value
        prelude = joined_prelude(self.op)
        self.opened = True
        results = (yield (*prelude, *batch))[len(prelude) :]
        try:
            while True:
                results = yield body.send(results)
        except StopIteration as stop:
            value = stop.value
        yield (Stmt(sql.RELEASE_SAVEPOINT),)
        return value


# --- batches: core's steps over the single operations, in one transaction ------------------


def _bare(op: core.Operation[Batch, list[Result], T], now: float | None) -> Steps[T]:
    """One operation inside a batch's transaction: without a bracket of its own."""
    assert isinstance(op, Operation)  # a batch is made of this backend's operations
    return core.inline(Bare(op), now)


def _flushing_claim(claim: Claim) -> Claim:
    if isinstance(claim, LeaseClaim):
        return Claim(
            claim.worker_id, claim.visibility, claim.min_priority, claim.max_attempts, claim.on_dead
        )
    return claim


def _flushing(op: Operation[Any]) -> Operation[Any]:
    """``op`` without a `synchronous_commit` of its own: in a batch's one transaction a
    claim's or nack's setting would apply to its acks too."""
    if isinstance(op, Claim):
        return _flushing_claim(op)
    if isinstance(op, Nack) and op.lease_commit is not None:
        return Nack(op.lease, op.delay)
    return op


def _after(now: float | None, got: Sequence[core.Claimed]) -> float | None:
    """An injected clock's reading for a batch's next claim, after the ``got`` it made."""
    return None if now is None else now + len(got) * core.TURN_STEP


class ClaimMany(Operation[list[core.Claimed]]):
    """Up to ``limit`` successive claims, after the ``got`` already made. One statement
    (`sql.CLAIM_MANY`) leases what they would while a claim's first try would do
    (`sql.CLAIM_READY`); what it cannot decide goes on as the single claim goes on: a
    head out of deliveries, leased, in `ClaimManyRest` (buried, then successive claims);
    nothing found, in `ClaimManyWake`. A claim of a transport opened with
    ``lease_commit=async`` keeps its setting here: the statement only moves leases."""

    __slots__ = ("claim", "got", "lease_commit", "limit")
    call = "claim_many"

    def __init__(self, claim: Claim, limit: int, got: Sequence[core.Claimed] = ()) -> None:
        self.lease_commit = claim.lease_commit
        self.claim = _flushing_claim(claim)
        self.limit, self.got = limit, list(got)

    def first(self, now: float | None) -> Batch:
        # The batch's turns are stamped core.TURN_STEP apart (see `core.claiming_many`),
        # after those it has already taken.
        c, at = self.claim, _after(now, self.got)
        params = (c.min_priority, at, self.limit - len(self.got), c.max_attempts)
        lease = (c.worker_id, c.visibility, core.TURN_STEP, self.lease_commit)
        return (Stmt(sql.CLAIM_MANY, (*params, *lease)),)

    def done(self, results: list[Result], now: float | None) -> list[core.Claimed] | More:
        rows, claim, got = results[0].rows, self.claim, list(self.got)
        for row in rows:
            if claim._due(row):
                return More(ClaimManyRest(claim, self.limit, got, row))
            got.append(claim._claimed(row))
        if rows or len(got) == self.limit:
            return got
        return More(ClaimManyWake(claim, self.limit, got))


class ClaimManyWake(Operation[list[core.Claimed]]):
    """The next claim of a batch whose statement found nothing, as `ClaimRest` makes it:
    wake the lapsed groups and claim again (one round trip). A lease found, the batch
    goes on in one statement again (`ClaimMany`); delayed messages due or tenants, in
    `ClaimManyRest`."""

    __slots__ = ("claim", "got", "limit")
    call = "claim_many"

    def __init__(self, claim: Claim, limit: int, got: list[core.Claimed]) -> None:
        self.claim, self.limit, self.got = claim, limit, got

    def first(self, now: float | None) -> Batch | None:
        return ClaimRest(self.claim, None).first(now)

    def done(self, results: list[Result], now: float | None) -> list[core.Claimed] | More:
        rows, claim = results[1].rows, self.claim
        if not rows:
            due, tenanted = results[2].rows[0]
            return (
                More(ClaimManyRest(claim, self.limit, self.got, None))
                if due or tenanted
                else self.got
            )
        if claim._due(rows[0]):
            return More(ClaimManyRest(claim, self.limit, self.got, rows[0]))
        got = [*self.got, claim._claimed(rows[0])]
        return got if len(got) == self.limit else More(ClaimMany(claim, self.limit, got))


class ClaimManyRest(Operation[list[core.Claimed]]):
    """The rest of a batch, in one transaction, as the generic batch makes it: first the
    rest of the claim its statement could not finish (``row``: a head out of deliveries,
    leased, buried as `ClaimRest` buries it; None: delayed messages due or tenants, a
    `ClaimTurn`), then successive claims (`core.claiming_many`)."""

    __slots__ = ("claim", "got", "limit", "row")
    call = "claim_many"

    def __init__(
        self, claim: Claim, limit: int, got: list[core.Claimed], row: Sequence[Any] | None
    ) -> None:
        self.claim, self.limit, self.got, self.row = claim, limit, got, row

    def body(self, now: float | None) -> Steps[list[core.Claimed]]:
        claim, row, at = self.claim, self.row, _after(now, self.got)
        ends = self.got[0].expires_at if self.got else None
        if at is not None and ends is not None and at >= ends:
            return self.got  # see `core.claiming_many`: the batch outlived its leases
        if row is None:
            claimed = yield from _bare(ClaimTurn(claim), at)
        else:
            claimed = yield from _bury_and_claim(claim, row, at)
        if claimed is None:
            return self.got
        got = [*self.got, claimed]
        rest = yield from core.claiming_many(
            claim, self.limit - len(got), _after(now, got), _bare, got[0].expires_at
        )
        return got + rest


class SettleMany(Operation[list[dt.LeaseLost]]):
    """Acks, nacks and buries, each fenced by its lease, in one transaction. Their
    groups are locked first, in group-id order (`sql.LOCK_BATCH_GROUPS`), as every
    other call that locks several groups does: in the caller's order, two batches (or
    a batch and a `publish_many`) could each wait on a group the other holds."""

    __slots__ = ("groups", "settles")
    call = "settle_many"

    def __init__(self, settles: list[Operation[None]]) -> None:
        self.groups = sorted({op.fence[0] for op in settles if isinstance(op, _Settle)})
        self.settles = [_flushing(op) for op in settles]

    def body(self, now: float | None) -> Steps[list[dt.LeaseLost]]:
        yield (Stmt(sql.LOCK_BATCH_GROUPS, (self.groups,)),)
        lost: list[dt.LeaseLost] = yield from core.settling_many(self.settles, now, _bare)
        return lost


class AckMany(Operation[list[dt.LeaseLost]]):
    """Acks of leases on distinct groups: their groups locked in order
    (`sql.LOCK_BATCH_GROUPS`), then every current lease acked by one statement
    (`sql.ACK_MANY`), in one round trip and one transaction; the stale ones reported."""

    __slots__ = ("acks", "fences")
    call = "settle_many"

    def __init__(self, acks: list[Ack]) -> None:
        self.acks = acks
        # The fences' columns (`sql.BATCH_FENCE_NAMES`), one list each.
        columns = tuple(map(list, zip(*(ack.fence for ack in acks), strict=True)))
        self.fences: tuple[list[Any], ...] = columns or ([], [], [], [])

    def first(self, now: float | None) -> Batch:
        return (
            Stmt(sql.LOCK_BATCH_GROUPS, (self.fences[0],)),
            Stmt(sql.ACK_MANY, (*self.fences, now)),
        )

    def done(self, results: list[Result], now: float | None) -> list[dt.LeaseLost]:
        acked = set(results[1].rows[0][0])
        return [dt.LeaseLost(ack.lease) for n, ack in enumerate(self.acks, 1) if n not in acked]


def settle_many(settles: list[Operation[None]]) -> SettleMany | AckMany:
    """The operation of one settle_many: `AckMany` when every item is an ack and no two
    share a group (one statement cannot move a group's head twice), else `SettleMany`."""
    acks = [op for op in settles if type(op) is Ack]
    if len(acks) == len(settles) and len({ack.fence[0] for ack in acks}) == len(acks):
        return AckMany(acks)
    return SettleMany(settles)


class AckAndClaim(Operation[core.Claimed | None]):
    """An ack and the next claim. First, in one transaction and one round trip, the ack
    as `Ack` tries it (`sql.ACK_AT_ONCE_MARKED`) and the claim's first try, which claims
    only if the ack removed the head (`sql.CLAIM_AFTER_ACK`). A stale lease raises
    `LeaseLost` with nothing claimed. An ack that must run again under its group's lock
    runs with the claim in one transaction of their own; a claim that needs more than its
    first try (lapsed groups to wake, a head to bury, due timers, tenants) goes on as
    `ClaimRest`, the ack committed: as ``ack`` then ``claim`` would."""

    __slots__ = ("ack", "claim")
    call = "ack_and_claim"

    def __init__(self, ack: Operation[None], claim: Claim) -> None:
        self.ack, self.claim = ack, _flushing_claim(claim)

    def first(self, now: float | None) -> Batch | None:
        if type(self.ack) is not Ack:
            return None
        return (
            Stmt(sql.BEGIN),
            Stmt(sql.ACK_AT_ONCE_MARKED, (*self.ack.fence, now)),
            self.claim._claim(now, sql.CLAIM_AFTER_ACK),
            Stmt(sql.COMMIT),
        )

    def done(self, results: list[Result], now: float | None) -> core.Claimed | More:
        assert isinstance(self.ack, Ack)  # `first` gave a step
        removed, _, held, _ = results[1].rows[0]
        if removed == 0 and held:
            return MORE
        self.ack.held(removed == 1)
        return self.claim.done(results[2:3], now)  # as the claim's own first try goes on

    def body(self, now: float | None) -> Steps[core.Claimed | None]:
        result: core.Claimed | None = yield from core.then_claiming(
            self.ack, self.claim, now, _bare
        )
        return result


class Operations:
    """The builders of one transport's operations: this module's, with the transport's
    options bound into those that take them, by the names `TransportBase` calls, and
    ``claim``, which keeps a worker's repeated `Claim` (see `ReuseLast`).

    ``lease_commit``: None to flush every commit, or ``'off'``, the `synchronous_commit`
    of the transactions that only move a lease (see `sql._LEASE_COMMIT`)."""

    __slots__ = ("claim", "lease_commit")

    def __init__(self, max_attempts: int | None, on_dead: str, lease_commit: str | None) -> None:
        self.lease_commit = lease_commit
        kind = Claim if lease_commit is None else LeaseClaim
        self.claim: core.ReuseLast[[str, float, int], Claim] = core.ReuseLast(
            lambda worker_id, visibility, min_priority: kind(
                worker_id, visibility, min_priority, max_attempts, on_dead
            )
        )

    def PublishMany(
        self,
        codec: core.EventCodec[Any],
        items: Iterable[tuple[str, Any, int] | dt.Message[Any]],
        window: float,
        /,
    ) -> PublishMany | PublishKeyedMany | PublishManyWith:
        return publish_many(codec, items, window)

    def Nack(self, lease: dt.Lease[Any], delay: float, /) -> Nack:
        return Nack(lease, delay, self.lease_commit)

    def Extend(self, lease: dt.Lease[T], visibility: float, /) -> Extend[T]:
        return Extend(lease, visibility, self.lease_commit)

    def SettleMany(self, settles: list[Operation[None]], /) -> SettleMany | AckMany:
        return settle_many(settles)

    # The others take no option: the module's own classes.
    Publish = Publish
    PublishWith = PublishWith
    Ack = Ack
    BuryLease = BuryLease
    Stats = Stats
    Groups = Groups
    DeadLetters = DeadLetters
    HeldGroups = HeldGroups
    Requeue = Requeue
    Discard = Discard
    PurgeGroup = PurgeGroup
    Cancel = Cancel
    Pause = Pause
    PausedGroups = PausedGroups
    Peek = Peek
    SetTenantWeight = SetTenantWeight
    Tenants = Tenants
    ClaimMany = ClaimMany
    AckAndClaim = AckAndClaim
