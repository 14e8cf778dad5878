"""Every Redis operation, sans-I/O, in core's one shape (`transports_core.backend`'s
`Operation`), which both runners hand to core's drivers.

An operation checks its arguments when it is built (so bad input never reaches the
server). A step is one script call, `ScriptCall`: the `Script` and its arguments, which the
runner sends as one FCALL (see `Packer`; the ``now`` core passes becomes the script's ``now``
argument, ``""`` for the server's TIME). Most calls are that one step, `first`, whose
reply `done` turns into the call's value or `LeaseLost`; the admin calls that go in
chunks are `steps`, one script call a chunk. A claim that waits is core's `wait_plan`
over `Claim`, with a `Waiter` keeping what the claim learns between its steps. No I/O,
no clock, no driver import.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Final, NamedTuple, TypeVar

import transports_core as dt
from transports_core import backend as core

from . import _scripts as scripts
from ._scripts import Script

T = TypeVar("T")
Arg = str | int | float

_GROUP_STATES: Final[frozenset[str]] = frozenset({"ready", "in_flight", "parked", "held"})


def key_prefix(queue: str) -> str:
    """Every key of ``queue`` starts with this: one hash tag, so one cluster slot."""
    return f"dt:{{{queue}}}:"


def queue_keys(queue: str, script: Script) -> list[str]:
    prefix = key_prefix(queue)
    return [prefix + suffix for suffix in script.keys]


def _bulk(value: Arg) -> bytes:
    data = value.encode() if isinstance(value, str) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def command(*args: Arg) -> bytes:
    """One command in the server's wire format (RESP)."""
    return b"".join([b"*%d\r\n" % len(args), *[_bulk(a) for a in args]])


class Packer:
    """The calls of queue ``queue`` in the server's wire format (RESP): FCALL of the
    script's function in `_scripts.LIBRARY` while ``functions`` holds, else EVALSHA of
    the script (the runner turns it off for good when the server refuses to load the
    library), with the part that never changes (the command, the function's name or
    the script's digest, the key names) packed once."""

    __slots__ = ("_heads", "_last", "_queue", "functions")

    def __init__(self, queue: str, functions: bool = True) -> None:
        self._queue = queue
        self._heads: dict[tuple[bool, str], tuple[int, bytes]] = {}
        # Per script, its last call, when its arguments were a tuple: a call sent again
        # with the very same tuple (a worker's claim: see `Claim.args`) is packed once.
        self._last: dict[str, tuple[bool, tuple[Arg, ...], bytes]] = {}
        self.functions = functions

    def call(self, script: Script, args: Sequence[Arg]) -> bytes:
        last = self._last.get(script.name)
        if last is not None and last[1] is args and last[0] == self.functions:
            return last[2]
        packed = self._pack(script, args)
        if isinstance(args, tuple):
            self._last[script.name] = (self.functions, args, packed)
        return packed

    def _pack(self, script: Script, args: Sequence[Arg]) -> bytes:
        head = self._heads.get((self.functions, script.name))
        if head is None:
            nkeys = len(script.keys)
            keys = b"".join(_bulk(k) for k in queue_keys(self._queue, script))
            if self.functions:
                named = _bulk("FCALL") + _bulk(scripts.LIBRARY.function(script))
            else:
                named = _bulk("EVALSHA") + _bulk(script.sha)
            fixed = named + _bulk(nkeys) + keys
            head = self._heads[(self.functions, script.name)] = (3 + nkeys, fixed)
        count, fixed = head
        return b"".join([b"*%d\r\n" % (count + len(args)), fixed, *[_bulk(a) for a in args]])

    def loader(self, script: Script) -> Script | scripts.Library:
        """What a server that lacks the call's code must load: the library, or the script."""
        return scripts.LIBRARY if self.functions else script


def key_member(group_id: str, key: str) -> str:
    """The field of idempotency key ``key`` of ``group_id`` in the queue's keys: the
    group's length first, so that no other (group, key) pair spells it."""
    return f"{len(group_id)}:{group_id}{key}"


def wake_key(queue: str, floor: int) -> str:
    return f"{key_prefix(queue)}w{floor}"


def close_key(queue: str, handle: str) -> str:
    """Where `close` pushes a token to wake this handle's blocked claims."""
    return f"{key_prefix(queue)}close:{handle}"


def stored(group_id: str, priority: int, raw: str) -> str:
    """A message as the scripts store it: byte 1, its priority, its group (length first),
    then its event's JSON, so that cancel and peek find its group and priority with no
    entry of their own (see `_scripts.owner`). The length is in bytes, as Lua counts."""
    size = len(group_id) if group_id.isascii() else len(group_id.encode())
    return f"\x01{priority}{size:08x}{group_id}{raw}"


def event_text(value: str) -> str:
    """The event's JSON in a stored message (one stored before timers is that alone)."""
    if value[:1] != "\x01":
        return value
    size = int(value[2:10], 16)
    group = value[10 : 10 + size]
    if not group.isascii():  # fewer characters than bytes: the group is its first bytes
        group = group.encode()[:size].decode()
    return value[10 + len(group) :]


def number(text: str | bytes | int) -> float:
    """A time from a script: 17 significant digits, exact."""
    return float(text)


# How many items (groups, dead letters, lapsed leases, messages) one admin script reads or
# removes at most, so that no admin call stops the server for long: an answer that needs
# more takes several calls, one step each.
CHUNK = 250

# One step: a script and its arguments (after the keys), which the runner sends as one
# FCALL (or EVALSHA); the reply is whatever the script returned, as redis-py reads it.
ScriptCall = tuple[Script, Sequence[Arg]]


def server_time(now: float | None) -> str:
    """The script's ``now`` argument: the injected clock's reading, or ``""``, which
    tells the script to read the server's TIME."""
    return "" if now is None else repr(now)


class Op(core.Operation[ScriptCall, Any, T]):
    """An operation of this backend: a call of one script (``script``: `first` sends
    it and `done` reads its reply), or, for the admin calls that go in chunks, `steps`
    that send one script call a chunk. Each holds only its checked arguments, so it
    may be kept and shared; what a call learns as it goes lives in its steps."""

    __slots__ = ()
    script: ClassVar[Script]


class Publish(Op[int]):
    """A publish without a key, delay or tenant."""

    __slots__ = ("params",)
    script = scripts.PUBLISH

    def __init__(
        self, codec: core.EventCodec[Any], group_id: str, event: object, priority: int
    ) -> None:
        group_id, priority = core.check_group_id(group_id), core.check_priority(priority)
        raw = codec.encode(event)
        self.params: tuple[Arg, ...] = (group_id, priority, stored(group_id, priority, raw))

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (*self.params, server_time(now)))

    def done(self, reply: Any, now: float | None) -> int:
        return int(reply)


def _options(item: core.Item) -> tuple[Arg, Arg, Arg]:
    """An item's delay, hold and tenant as the scripts take them."""
    return (repr(item.delay), "1" if item.hold else "0", item.tenant or "")


class PublishWith(Op[int]):
    """A publish with a key, a delay or a tenant (``item`` checked by core): a key in
    use replies minus the original's seq, which is returned as a `Duplicate`."""

    __slots__ = ("options", "params")
    script = scripts.PUBLISH_WITH

    def __init__(self, item: core.Item, window: float) -> None:
        member = "" if item.key is None else key_member(item.group_id, item.key)
        raw = stored(item.group_id, item.priority, item.event)
        self.params = (item.group_id, item.priority, raw, member, repr(window))
        self.options = _options(item)

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (*self.params, server_time(now), *self.options))

    def done(self, reply: Any, now: float | None) -> int:
        seq = int(reply)
        return seq if seq > 0 else dt.Duplicate(-seq)


class PublishMany(Op[list[int]]):
    """A batch: of plain items, one script; with keys only, the keyed script, which also
    tells which items were duplicates (and of what); with a delay or tenant anywhere,
    the script that stores each item as `PublishWith` does."""

    __slots__ = ("count", "flat", "script_", "window")

    def __init__(
        self,
        codec: core.EventCodec[Any],
        items: Iterable[tuple[str, Any, int] | dt.Message[Any]],
        window: float = core.DEDUP_WINDOW,
    ) -> None:
        encoded = codec.encode_items(items)
        self.count = len(encoded)
        self.window = repr(window)
        flat: list[Arg] = []
        if all(item.plain for item in encoded):
            self.script_ = scripts.PUBLISH_MANY
            for group_id, raw, priority, *_ in encoded:
                flat += (group_id, priority, stored(group_id, priority, raw))
        elif all(not item.delay and item.tenant is None for item in encoded):
            self.script_ = scripts.PUBLISH_MANY_KEYED
            for item in encoded:
                key = "" if item.key is None else key_member(item.group_id, item.key)
                raw = stored(item.group_id, item.priority, item.event)
                flat += (item.group_id, item.priority, raw, key)
        else:
            self.script_ = scripts.PUBLISH_MANY_WITH
            for item in encoded:
                key = "" if item.key is None else key_member(item.group_id, item.key)
                raw = stored(item.group_id, item.priority, item.event)
                flat += (item.group_id, item.priority, raw, key, *_options(item))
        self.flat = flat

    def first(self, now: float | None) -> ScriptCall:
        if self.script_ is scripts.PUBLISH_MANY:
            return (self.script_, [self.count, server_time(now), *self.flat])
        return (self.script_, [self.count, self.window, server_time(now), *self.flat])

    def done(self, reply: Any, now: float | None) -> list[int]:
        if self.script_ is scripts.PUBLISH_MANY:
            first = int(reply)
            return list(range(first, first + self.count))
        seq = int(reply[0])
        dups = {int(reply[i]): int(reply[i + 1]) for i in range(1, len(reply), 2)}
        out: list[int] = []
        for index in range(self.count):
            original = dups.get(index)
            if original is None:
                out.append(seq)
                seq += 1
            else:
                out.append(dt.Duplicate(original))
        return out


class Idle(NamedTuple):
    """A claim that found nothing: the server's time, and the earliest end of a lease or
    park (None: nothing is busy), so that a waiting claim knows when to look again."""

    now: float
    next_due: float | None


class Claim(Op["core.Claimed | Idle"], core.Claiming["core.Claimed | Idle"]):
    """A claim, its arguments checked by core's `Claiming`; ``cascade`` for one made
    after taking a wake-up token, which passes the wake-up on when more is ready, for
    the next waiter (see `Waiter`)."""

    __slots__ = ("head", "on_server", "tail")
    script = scripts.CLAIM

    def __init__(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int,
        max_attempts: int | None,
        on_dead: str,
        *,
        cascade: bool = False,
    ) -> None:
        super().__init__(worker_id, visibility, min_priority, max_attempts, on_dead)
        # Packed once: a worker's claim is kept (see `ReuseLast`) and sent again and again.
        self.head = (self.worker_id, repr(self.visibility), self.min_priority)
        self.tail = (max_attempts or 0, on_dead, int(cascade), scripts.SWEEP)
        # On the server's clock, the arguments never change: one tuple, which the
        # runner's `Packer` then packs once.
        self.on_server = (*self.head, server_time(None), *self.tail)

    def woken(self) -> Claim:
        """The same claim, made after taking a wake-up token."""
        return Claim(
            self.worker_id,
            self.visibility,
            self.min_priority,
            self.max_attempts,
            self.on_dead,
            cascade=True,
        )

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, self.args(now))

    def done(self, reply: Any, now: float | None) -> core.Claimed | Idle:
        if int(reply[0]) == 0:
            return Idle(number(reply[1]), number(reply[2]) if reply[2] else None)
        return self.leased(reply, 1)

    def leased(self, reply: Sequence[Any], at: int) -> core.Claimed:
        """The lease that ``reply`` tells from index ``at`` on: seq, group, stored
        message, attempt, end."""
        seq, group_id, raw, attempt, due = reply[at : at + 5]
        return core.Claimed(
            int(seq), group_id, event_text(raw), self.worker_id, int(attempt), number(due)
        )

    def args(self, now: float | None) -> tuple[Arg, ...]:
        """The script's arguments, `scripts.CLAIM_ARGS`, as every claiming script takes
        them."""
        if now is None:
            return self.on_server
        return (*self.head, server_time(now), *self.tail)


class Unclaim(Op[bool]):
    """Gives back what a claim leased, its delivery uncounted (core's `GiveBack`): True
    if it did, False if the lease was no longer current."""

    __slots__ = ("fence",)
    script = scripts.UNCLAIM

    def __init__(self, claimed: core.Claimed) -> None:
        self.fence = (claimed.group_id, claimed.seq, claimed.worker_id, claimed.attempt)

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, self.fence)

    def done(self, reply: Any, now: float | None) -> bool:
        return int(reply) == 1


class _Settle(Op[T], core.Settle[T]):
    """A script fenced by the lease, which replies 0 when the lease is not current."""

    __slots__ = ("fence",)

    def __init__(self, lease: dt.Lease[Any]) -> None:
        super().__init__(lease)
        self.fence = (lease.group_id, lease.seq, lease.worker_id, lease.attempt)

    def _held(self, reply: Any) -> None:
        self.held(reply != 0 and reply != "0")


class Ack(_Settle[None]):
    __slots__ = ()
    script = scripts.ACK

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, self.fence)

    def item(self) -> tuple[Arg, ...]:
        """This settle as an item of `scripts.SETTLE_MANY`."""
        return ("ack", *self.fence, "", "")

    def done(self, reply: Any, now: float | None) -> None:
        self._held(reply)


class Nack(_Settle[None]):
    __slots__ = ("delay",)
    script = scripts.NACK

    def __init__(self, lease: dt.Lease[Any], delay: float) -> None:
        super().__init__(lease)
        self.delay = repr(core.check_delay(delay))

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (*self.fence, self.delay, server_time(now)))

    def item(self) -> tuple[Arg, ...]:
        return ("nack", *self.fence, self.delay, "")

    def done(self, reply: Any, now: float | None) -> None:
        self._held(reply)


class Extend(_Settle[dt.Lease[T]]):
    __slots__ = ("visibility",)
    script = scripts.EXTEND
    lease: dt.Lease[T]

    def __init__(self, lease: dt.Lease[T], visibility: float) -> None:
        super().__init__(lease)
        self.visibility = repr(core.check_visibility(visibility))

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (*self.fence, self.visibility, server_time(now)))

    def done(self, reply: Any, now: float | None) -> dt.Lease[T]:
        self._held(reply)
        return self.renewed(number(reply))


class BuryLease(_Settle[None]):
    __slots__ = ("on_dead", "reason")
    script = scripts.BURY

    def __init__(self, lease: dt.Lease[Any], reason: str, on_dead: str) -> None:
        super().__init__(lease)
        self.reason = core.buried_reason(core.check_reason(reason))
        self.on_dead = on_dead

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (*self.fence, self.reason, self.on_dead, server_time(now)))

    def item(self) -> tuple[Arg, ...]:
        return ("bury", *self.fence, self.reason, self.on_dead)

    def done(self, reply: Any, now: float | None) -> None:
        self._held(reply)


# --- admin ---------------------------------------------------------------------------


# --- batches: one script call each ------------------------------------------------------

# How many claims, or settles, one batch script makes at most: a larger batch takes a
# script call per BATCH, so that no batch stops the server for long (a claim costs the
# server some tens of microseconds, a settle less).
BATCH = 100

Settling = Ack | Nack | BuryLease


class ClaimMany(Op[list[core.Claimed]]):
    """Up to ``limit`` successive claims: `BATCH` of them a script call (or fewer, when
    the claims free a crowd of lapsed leases), which makes them one after another as
    that many claims would, until one finds nothing."""

    __slots__ = ("claim", "limit")
    script = scripts.CLAIM_MANY

    def __init__(self, claim: Claim, limit: int) -> None:
        self.claim, self.limit = claim, limit

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, list[core.Claimed]]:
        got: list[core.Claimed] = []
        while len(got) < self.limit:
            asked = min(BATCH, self.limit - len(got))
            # An injected clock was read once for the whole batch: each script goes on
            # from the time the last one reached (see `scripts.CLAIM_MANY`).
            at = None if now is None else now + len(got) * scripts.TICK
            ends = repr(got[0].expires_at) if got else ""
            reply = yield (self.script, (*self.claim.args(at), asked, ends))
            leased = [self.claim.leased(reply, i) for i in range(1, len(reply), 5)]
            got += leased
            # Fewer than asked: a claim found nothing, unless the script stopped after
            # freeing many lapsed leases (or promoting many delayed messages).
            if len(leased) < asked and int(reply[0]) == 0:
                break
        return got


class SettleMany(Op[list[dt.LeaseLost]]):
    """Acks, nacks and buries, each fenced by its lease, in order: `BATCH` of them a
    script call; the `LeaseLost` of those whose lease the script found stale."""

    __slots__ = ("settles",)
    script = scripts.SETTLE_MANY

    def __init__(self, settles: list[Settling]) -> None:
        self.settles = settles

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, list[dt.LeaseLost]]:
        lost: list[dt.LeaseLost] = []
        for start in range(0, len(self.settles), BATCH):
            chunk = self.settles[start : start + BATCH]
            items = [arg for settle in chunk for arg in settle.item()]
            stale = yield (self.script, [len(chunk), server_time(now), *items])
            lost += [dt.LeaseLost(chunk[int(i)].lease) for i in stale]
        return lost


class AckAndClaim(Op["core.Claimed | Idle"]):
    """An ack, then the next claim, in one script: `LeaseLost` (nothing claimed) when
    the lease was not current."""

    __slots__ = ("ack", "claim")
    script = scripts.ACK_AND_CLAIM

    def __init__(self, ack: Ack, claim: Claim) -> None:
        self.ack, self.claim = ack, claim

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (*self.ack.fence, *self.claim.args(now)))

    def done(self, reply: Any, now: float | None) -> core.Claimed | Idle:
        self.ack.done(reply, now)  # 0: the lease was stale; a claim's reply otherwise
        return self.claim.done(reply, now)


def promoted(now: float | None) -> core.Steps[ScriptCall, Any, str]:
    """Steps that move the delayed messages due at ``now`` into their groups, `CHUNK` a
    call, as a claim would; their value is the time they used, for the next steps."""
    at = server_time(now)
    while True:
        reply = yield (scripts.PROMOTE_DUE, (at, CHUNK))
        at = str(reply[0])
        if int(reply[1]) < CHUNK:
            return at


class Stats(Op[dt.QueueStats]):
    """The counters the scripts keep, corrected by walks over the busy parts of the
    queue only (see `scripts.STATS`), `CHUNK` items a call, each call at the time the
    first one read."""

    __slots__ = ()
    script = scripts.STATS

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, dt.QueueStats]:
        at = yield from promoted(now)
        phase, after, score = "", "", ""
        found = [0] * 25  # lapsed l, k, h; paused among them; held busy groups (each 0..4)
        since: list[str] = [""] * 5
        paused: dict[str, int] = {}  # group -> priority: the set scan may show one twice
        counts: list[int] = []
        while True:
            reply = yield (self.script, (at, phase, after, score, CHUNK))
            at, phase, after, score = reply[0], reply[1], reply[2], reply[3]
            found = [a + int(b) for a, b in zip(found, reply[4:29], strict=True)]
            since = [old or new for old, new in zip(since, reply[29:34], strict=True)]
            tail = reply[34:]
            if not counts:
                counts, tail = [int(x) for x in tail[:47]], tail[47:]
            paused.update((tail[i], int(tail[i + 1])) for i in range(0, len(tail), 2))
            if not phase:
                break
        m, leased, parked, dead, apart, holds = (counts[i : i + 5] for i in range(0, 30, 5))
        keys, holding, ready_sets, tenanted = counts[30], counts[31:36], counts[37:42], counts[42:]
        lapsed = [found[p] + found[5 + p] + found[10 + p] for p in scripts.PRIORITIES]
        off_busy = [0] * 5
        for priority in paused.values():
            off_busy[priority] += 1
        rows = []
        for p in scripts.PRIORITIES:
            in_flight, held = leased[p] - found[p], parked[p] - found[5 + p]
            delayed = apart[p] + holding[p]
            if m[p] or dead[p] or delayed:
                ready = m[p] - in_flight - held - holding[p]
                # lapsed and not paused: a claim would free and take them
                freed = lapsed[p] - found[15 + p]
                busy = leased[p] + parked[p] + holds[p] - freed + off_busy[p] + found[20 + p]
                age = max(number(at) - number(since[p]), 0.0) if ready and since[p] else None
                rows.append(
                    dt.PriorityStats(
                        p,
                        ready,
                        in_flight,
                        held,
                        dead[p],
                        delayed,
                        oldest_ready_age=age,
                        ready_groups=ready_sets[p] + tenanted[p] + freed,
                        busy_groups=busy,
                    )
                )
        return core.queue_stats(rows, keys=keys, paused=counts[36])


def _deepest(info: dt.GroupInfo) -> tuple[int, int]:
    return (-info.depth, info.head_seq)


def _group(row: Sequence[Any]) -> dt.GroupInfo:
    group_id, priority, depth, head, state, until, last, paused, tenant = row
    if state not in _GROUP_STATES:
        raise ValueError(f"unknown group state {state!r}")
    typed: dt.GroupState = state
    return dt.GroupInfo(
        group_id=group_id,
        priority=int(priority),
        depth=int(depth),
        head_seq=int(head),
        state=typed,
        busy_until=number(until) if until else None,
        last_claimed_at=number(last) if last else None,
        paused=int(paused) == 1,
        tenant=tenant or None,
    )


class Groups(Op[list[dt.GroupInfo]]):
    """Each chunk's ``limit`` deepest groups, of which the deepest are kept (a group seen
    twice by the scan, as it was the second time)."""

    __slots__ = ("limit",)
    script = scripts.GROUPS

    def __init__(self, limit: int) -> None:
        self.limit = core.check_limit(limit)

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, list[dt.GroupInfo]]:
        at = yield from promoted(now)
        cursor = "0"
        kept: dict[str, dt.GroupInfo] = {}
        while True:
            reply = yield (self.script, (self.limit, at, cursor, CHUNK))
            at, cursor = reply[0], reply[1]
            for i in range(2, len(reply), 9):
                info = _group(reply[i : i + 9])
                kept[info.group_id] = info
            deepest = sorted(kept.values(), key=_deepest)[: self.limit]
            if cursor == "0":
                return deepest
            kept = {g.group_id: g for g in deepest}


class _DeadPages(Op[T]):
    """Dead letters in seq order, `CHUNK` (or fewer) a call, from where the last ended,
    as far as ``limit`` (None: to the end); the rows `keep` says are turned into the
    answer by `answer`."""

    __slots__ = ("limit",)
    script = scripts.DEAD_LETTERS

    def __init__(self, limit: int | None) -> None:
        self.limit = limit

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, T]:
        after, left = 0, self.limit
        rows: list[list[Any]] = []
        while True:
            asked = CHUNK if left is None else min(CHUNK, left)
            reply = yield (self.script, (after, asked))
            page = [reply[i : i + 13] for i in range(0, len(reply), 13)]
            rows += [row for row in page if self.keep(row)]
            if left is not None:
                left -= len(page)
            if len(page) < asked or left == 0:
                return self.answer(rows)
            after = int(page[-1][0])

    def keep(self, row: list[Any]) -> bool:
        return True

    def answer(self, rows: list[list[Any]]) -> T:
        raise NotImplementedError


class DeadLetters(_DeadPages[list[dt.DeadLetter]]):
    __slots__ = ()

    def __init__(self, limit: int | None) -> None:
        super().__init__(None if limit is None else core.check_limit(limit))

    def answer(self, rows: list[list[Any]]) -> list[dt.DeadLetter]:
        out = []
        for row in rows:
            seq, group_id, prio, raw, attempts, kind, text, deliveries, max_, last, at = row[:11]
            reason = (
                text
                if kind == "b"
                else core.exhausted_reason(
                    int(deliveries), int(max_), "lapsed" if last == "lapsed" else "nacked"
                )
            )
            out.append(
                dt.DeadLetter(
                    seq=int(seq),
                    group_id=group_id,
                    priority=int(prio),
                    event=event_text(raw),
                    attempts=int(attempts),
                    reason=reason,
                    dead_at=number(at),
                    held=int(row[11]) == 1,
                )
            )
        return out


class HeldGroups(_DeadPages[list[dt.HeldGroup]]):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)

    def keep(self, row: list[Any]) -> bool:
        return bool(row[12] != "")  # the script says how many wait only behind a holding one

    def answer(self, rows: list[list[Any]]) -> list[dt.HeldGroup]:
        return [
            dt.HeldGroup(
                group_id=row[1], seq=int(row[0]), waiting=int(row[12]), since=number(row[10])
            )
            for row in rows
        ]


class _OneDeadLetter(Op[bool]):
    """An operation on dead letter ``seq``, whose script takes that alone."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = core.check_seq(seq)

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (self.seq,))


class Requeue(_OneDeadLetter):
    __slots__ = ()
    script = scripts.REQUEUE

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (self.seq, server_time(now)))

    def done(self, reply: Any, now: float | None) -> bool:
        code = int(reply[0])
        if code == -1:
            raise dt.RequeueRefused(self.seq, str(reply[2]), str(reply[1]))
        if code == -2:
            raise dt.RequeueRefused(self.seq, str(reply[2]), None, int(reply[1]))
        return code == 1


class Discard(_OneDeadLetter):
    __slots__ = ()
    script = scripts.DISCARD

    def done(self, reply: Any, now: float | None) -> bool:
        return int(reply) == 1


class PurgeGroup(Op[int]):
    """`CHUNK` messages and dead letters a call, up to the last seq at its first."""

    __slots__ = ("group_id",)
    script = scripts.PURGE_GROUP

    def __init__(self, group_id: str) -> None:
        self.group_id = core.check_group_id(group_id)

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, int]:
        upto, removed, more = "", 0, True
        while more:
            reply = yield (self.script, (self.group_id, upto, CHUNK))
            removed += int(reply[0])
            upto, more = reply[1], bool(int(reply[2]))
        return removed


class Cancel(Op[bool]):
    __slots__ = ("seq",)
    script = scripts.CANCEL

    def __init__(self, seq: int) -> None:
        self.seq = seq

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, (self.seq, server_time(now)))

    def done(self, reply: Any, now: float | None) -> bool:
        return int(reply) == 1


class Pause(Op[bool]):
    __slots__ = ("params",)
    script = scripts.PAUSE

    def __init__(self, group_id: str, paused: bool) -> None:
        self.params = (group_id, "1" if paused else "0")

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, self.params)

    def done(self, reply: Any, now: float | None) -> bool:
        return int(reply) == 1


class PausedGroups(Op[list[str]]):
    __slots__ = ()
    script = scripts.PAUSED_GROUPS

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, ())

    def done(self, reply: Any, now: float | None) -> list[str]:
        return sorted(str(group) for group in reply)


_MESSAGE_STATES: Final[frozenset[str]] = frozenset(
    {"ready", "in_flight", "parked", "queued", "delayed"}
)


class Peek(Op[list[dt.QueuedMessage]]):
    """The due delayed messages promoted first (as a claim would), then one script."""

    __slots__ = ("group_id", "limit")
    script = scripts.PEEK

    def __init__(self, group_id: str, limit: int) -> None:
        self.group_id, self.limit = group_id, limit

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, list[dt.QueuedMessage]]:
        at = yield from promoted(now)
        reply = yield (self.script, (self.group_id, self.limit, at))
        out = []
        for i in range(0, len(reply), 6):
            seq, priority, raw, attempts, state, due = reply[i : i + 6]
            if state not in _MESSAGE_STATES:
                raise ValueError(f"unknown message state {state!r}")
            typed: dt.MessageState = state
            out.append(
                dt.QueuedMessage(
                    seq=int(seq),
                    group_id=self.group_id,
                    priority=int(priority),
                    event=event_text(raw),
                    attempts=int(attempts),
                    state=typed,
                    due_at=number(due) if due else None,
                )
            )
        return out


class SetTenantWeight(Op[None]):
    __slots__ = ("params",)
    script = scripts.SET_TENANT_WEIGHT

    def __init__(self, tenant: str, weight: int) -> None:
        self.params = (tenant, weight)

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, self.params)

    def done(self, reply: Any, now: float | None) -> None:
        return None


class Tenants(Op[list[dt.TenantInfo]]):
    """The due delayed messages promoted first (they may create groups), then one script."""

    __slots__ = ()
    script = scripts.TENANTS

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, list[dt.TenantInfo]]:
        yield from promoted(now)
        reply = yield (self.script, ())
        out = [dt.TenantInfo(None, 1, int(reply[0]))] if int(reply[0]) > 0 else []
        named = [
            dt.TenantInfo(str(reply[i]), int(reply[i + 1] or 1), int(reply[i + 2]))
            for i in range(1, len(reply), 3)
        ]
        return out + sorted(named, key=lambda t: t.tenant or "")


class Upgrade(Op[int]):
    """What every handle runs as it opens: nothing but a read when the queue is at
    `scripts.VERSION` (or new), else the chunked `scripts.UPGRADE`, `CHUNK` items a
    call, all at the time of its first. Its value: the version it found."""

    __slots__ = ()

    def steps(self, now: float | None) -> core.Steps[ScriptCall, Any, int]:
        found = int((yield (scripts.STORED_VERSION, ())))
        if found >= scripts.VERSION:
            return found
        at, cursor, resume = server_time(now), "", ""
        left: list[str] = []
        while True:
            reply = yield (scripts.UPGRADE, (at, CHUNK, cursor, resume, *left))
            if int(reply[0]) == 1:
                return found
            at, cursor, resume, left = reply[1], reply[2], reply[3], reply[4:]


class Check(Op[list[str]]):
    """The read-only invariant check (for tests and operators)."""

    __slots__ = ()
    script = scripts.CHECK

    def first(self, now: float | None) -> ScriptCall:
        return (self.script, ())

    def done(self, reply: Any, now: float | None) -> list[str]:
        return [str(x) for x in reply]


class Waiter:
    """What one claim that waits knows between the steps of core's `wait_plan`, which
    the runners drive with `wait_for`: its look, which claim it makes, and what a
    wake-up (the BLPOP on its floor's wake-up list) told it. One per waiting call, never
    shared; it reads no clock (``at`` is the plan's clock, read by the runner).

    The look asks the server nothing: the claim is the look. ``version`` counts the
    wake-ups this claim had (a token taken, a redirection, a `recheck` that passed
    with none: a token may have been taken by a claim that never made its own) beside
    the earliest end the last claim reported, so a claim that reports a new one is
    followed by another once the plan's next sleep ends; ``due`` is that end on the
    plan's clock. The plan's first claim was made already, by the call itself."""

    __slots__ = ("claim_op", "due", "floor", "made", "next_due", "owed", "recheck", "wakeups")

    def __init__(self, claim: Claim, idle: Idle, at: float, recheck: float) -> None:
        self.claim_op = claim
        self.floor = claim.min_priority
        self.recheck = recheck
        self.wakeups = 0
        self.owed = False  # a token was taken that no claim has yet passed on
        self.made = False
        self.next_due: float | None = None
        self.due: float | None = None
        self.found(idle, at)

    def look(self) -> core.WaitState:
        return core.WaitState((self.wakeups, self.next_due), self.due)

    def claim(self) -> Claim | None:
        """The claim to make now, or None: the first, made already, found nothing."""
        if not self.made:
            self.made = True
            return None
        if self.owed:
            # Only a claim that took a wake-up token passes one on: one that took none
            # owes none, and a token passed on by every claim would wake waiters forever.
            self.owed = False
            return self.claim_op.woken()
        return self.claim_op

    def found(self, got: core.Claimed | Idle | None, at: float) -> core.Claimed | None:
        """What a claim found: the lease, or None, noting when the next lease or park
        ends (``at``: the plan's clock when the reply came)."""
        if isinstance(got, Idle):
            self.next_due = got.next_due
            self.due = None if got.next_due is None else at + (got.next_due - got.now)
            return None
        return got

    def timeout(self, timeout: float, at: float) -> float:
        """How long to block for the plan's ``timeout``: no longer than until the end the
        last claim reported (which the plan learns only at its next look), and never 0,
        which BLPOP takes for "forever"."""
        if self.due is not None:
            timeout = min(timeout, max(self.due - at, 0.0) + core.AFTER_DUE)
        return max(timeout, 0.001)

    def woke(self, wakeup: str | None, timeout: float) -> bool:
        """The BLPOP came back with ``wakeup``: "token", "close", "redirect" (the next
        claim follows it), or None when it timed out after the plan's ``timeout``.
        Whether the claim was woken."""
        if wakeup is None:
            if timeout >= self.recheck:
                self.wakeups += 1
            return False
        if wakeup == "token":
            self.owed = True
        if wakeup != "close":
            self.wakeups += 1
        return True
