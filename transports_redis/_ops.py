"""Every Redis operation, sans-I/O, shared by the sync and async runners.

An operation checks its arguments when it is built (so bad input never reaches the
server), names its `Script`, gives the script's arguments for a ``now`` (``""``: the
script reads the server's TIME), and turns the script's reply into the call's value or
raises `LeaseLost`. Each operation is exactly one EVALSHA; waiting for a claim is the
runners' loop over `Claim`, between which they block on `WakeKeys`. No I/O, no clock, no
driver import.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from enum import Enum
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
    """EVALSHA calls of one queue in the server's wire format (RESP), with the part that
    never changes (the command, the script's digest, the key names) packed once."""

    __slots__ = ("_heads", "_keys")

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = b"".join(_bulk(k) for k in keys)
        self._heads: dict[str, tuple[int, bytes]] = {}

    def evalsha(self, script: Script, args: Sequence[Arg]) -> bytes:
        head = self._heads.get(script.sha)
        if head is None:
            nkeys = len(script.keys)
            fixed = _bulk("EVALSHA") + _bulk(script.sha) + _bulk(nkeys) + self._keys
            head = self._heads[script.sha] = (3 + nkeys, fixed)
        count, fixed = head
        return b"".join([b"*%d\r\n" % (count + len(args)), fixed, *[_bulk(a) for a in args]])


def wake_key(queue: str, floor: int) -> str:
    return f"{key_prefix(queue)}w{floor}"


def close_key(queue: str, handle: str) -> str:
    """Where `close` pushes a token to wake this handle's blocked claims."""
    return f"{key_prefix(queue)}close:{handle}"


def number(text: str | bytes | int) -> float:
    """A time from a script: 17 significant digits, exact."""
    return float(text)


class More(Enum):
    """What `Op.result` says when the operation needs one more script call."""

    MORE = "more"


MORE: Final = More.MORE
# How many items (groups, dead letters, lapsed leases, messages) one admin script reads or
# removes at most, so that no admin call stops the server for long: an answer that needs
# more takes several calls.
CHUNK = 250


class Op(core.Operation[T]):
    """One script call: ``args(now)`` for it, ``result(reply)`` of it; or several, for an
    operation in chunks, whose ``result`` says `MORE` until the last, after which
    ``args`` gives the next call's arguments."""

    __slots__ = ()
    script: ClassVar[Script]
    # False for reads: a lost connection cannot have changed anything.
    writes: ClassVar[bool] = True

    def args(self, now: str) -> Sequence[Arg]:
        raise NotImplementedError

    def result(self, reply: Any) -> T | More:
        raise NotImplementedError


class Publish(Op[int]):
    __slots__ = ("params",)
    script = scripts.PUBLISH

    def __init__(
        self, codec: core.EventCodec[Any], group_id: str, event: object, priority: int
    ) -> None:
        self.params = (
            core.check_group_id(group_id),
            core.check_priority(priority),
            codec.encode(event),
        )

    def args(self, now: str) -> Sequence[Arg]:
        return self.params

    def result(self, reply: Any) -> int:
        return int(reply)


class PublishMany(Op[list[int]]):
    __slots__ = ("count", "flat")
    script = scripts.PUBLISH_MANY

    def __init__(self, codec: core.EventCodec[Any], items: Iterable[tuple[str, Any, int]]) -> None:
        encoded = codec.encode_items(items)
        self.count = len(encoded)
        flat: list[Arg] = [self.count]
        for group_id, raw, priority in encoded:
            flat += (group_id, priority, raw)
        self.flat = flat

    def args(self, now: str) -> Sequence[Arg]:
        return self.flat

    def result(self, reply: Any) -> list[int]:
        first = int(reply)
        return list(range(first, first + self.count))


class Idle(NamedTuple):
    """A claim that found nothing: the server's time, and the earliest end of a lease or
    park (None: nothing is busy), so that a waiting claim knows when to look again."""

    now: float
    next_due: float | None


class Claim(Op["core.Claimed | Idle"]):
    __slots__ = ("params", "worker_id")
    script = scripts.CLAIM

    def __init__(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int,
        max_attempts: int | None,
        on_dead: str,
    ) -> None:
        self.worker_id = core.check_worker_id(worker_id)
        self.params = (
            self.worker_id,
            repr(core.check_visibility(visibility)),
            core.check_priority(min_priority, "min_priority"),
            max_attempts or 0,
            on_dead,
            0,  # see `woken`
        )

    def woken(self) -> Claim:
        """The same claim, made after taking a wake-up token: it passes the wake-up on
        when more is ready, for the next waiter. (A first look took no token, so it owes
        none, and skips that work.)"""
        again = Claim.__new__(Claim)
        again.worker_id, again.params = self.worker_id, (*self.params[:-1], 1)
        return again

    @property
    def floor(self) -> int:
        floor: int = self.params[2]
        return floor

    def args(self, now: str) -> Sequence[Arg]:
        worker, vis, floor, max_attempts, on_dead, cascade = self.params
        return (worker, vis, floor, now, max_attempts, on_dead, cascade, scripts.SWEEP)

    def result(self, reply: Any) -> core.Claimed | Idle:
        if int(reply[0]) == 0:
            return Idle(number(reply[1]), number(reply[2]) if reply[2] else None)
        _, seq, group_id, raw, attempt, due = reply
        return core.Claimed(int(seq), group_id, raw, self.worker_id, int(attempt), number(due))


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

    def args(self, now: str) -> Sequence[Arg]:
        return self.fence

    def result(self, reply: Any) -> None:
        self._held(reply)


class Nack(_Settle[None]):
    __slots__ = ("delay",)
    script = scripts.NACK

    def __init__(self, lease: dt.Lease[Any], delay: float) -> None:
        super().__init__(lease)
        self.delay = repr(core.check_delay(delay))

    def args(self, now: str) -> Sequence[Arg]:
        return (*self.fence, self.delay, now)

    def result(self, reply: Any) -> None:
        self._held(reply)


class Extend(_Settle[dt.Lease[T]]):
    __slots__ = ("visibility",)
    script = scripts.EXTEND
    lease: dt.Lease[T]

    def __init__(self, lease: dt.Lease[T], visibility: float) -> None:
        super().__init__(lease)
        self.visibility = repr(core.check_visibility(visibility))

    def args(self, now: str) -> Sequence[Arg]:
        return (*self.fence, self.visibility, now)

    def result(self, reply: Any) -> dt.Lease[T]:
        self._held(reply)
        return self.renewed(number(reply))


class Bury(_Settle[None]):
    __slots__ = ("on_dead", "reason")
    script = scripts.BURY

    def __init__(self, lease: dt.Lease[Any], reason: str, on_dead: str) -> None:
        super().__init__(lease)
        self.reason = core.buried_reason(core.check_reason(reason))
        self.on_dead = on_dead

    def args(self, now: str) -> Sequence[Arg]:
        return (*self.fence, self.reason, self.on_dead, now)

    def result(self, reply: Any) -> None:
        self._held(reply)


# --- admin ---------------------------------------------------------------------------


class Stats(Op[dt.QueueStats]):
    """The counters the scripts keep, less the leases and parks that ended but that no
    claim has freed yet, read `CHUNK` at a time from the first that ended."""

    __slots__ = ("after", "counts", "lapsed", "now", "score")
    script = scripts.STATS
    writes = False

    def __init__(self) -> None:
        self.now = self.after = self.score = ""
        self.counts: list[int] = []
        self.lapsed = [0] * 10  # leased l0..l4, parked k0..k4

    def args(self, now: str) -> Sequence[Arg]:
        return (self.now or now, self.after, self.score, CHUNK)

    def result(self, reply: Any) -> dt.QueueStats | More:
        self.now, self.after, self.score = reply[0], reply[1], reply[2]
        self.lapsed = [a + int(b) for a, b in zip(self.lapsed, reply[3:13], strict=True)]
        if not self.counts:
            self.counts = [int(x) for x in reply[13:33]]
        if self.after:
            return MORE
        m, leased, parked, dead = (self.counts[i : i + 5] for i in range(0, 20, 5))
        rows = []
        for p in scripts.PRIORITIES:
            in_flight, held = leased[p] - self.lapsed[p], parked[p] - self.lapsed[5 + p]
            if m[p] or dead[p]:
                rows.append(dt.PriorityStats(p, m[p] - in_flight - held, in_flight, held, dead[p]))
        return core.queue_stats(rows)


def _deepest(info: dt.GroupInfo) -> tuple[int, int]:
    return (-info.depth, info.head_seq)


class Groups(Op[list[dt.GroupInfo]]):
    """Each chunk's ``limit`` deepest groups, of which the deepest are kept (a group seen
    twice by the scan, as it was the second time)."""

    __slots__ = ("cursor", "kept", "limit", "now")
    script = scripts.GROUPS
    writes = False

    def __init__(self, limit: int) -> None:
        self.limit = core.check_limit(limit)
        self.now, self.cursor = "", "0"
        self.kept: dict[str, dt.GroupInfo] = {}

    def args(self, now: str) -> Sequence[Arg]:
        return (self.limit, self.now or now, self.cursor, CHUNK)

    def result(self, reply: Any) -> list[dt.GroupInfo] | More:
        self.now, self.cursor = reply[0], reply[1]
        for i in range(2, len(reply), 7):
            group_id, priority, depth, head, state, until, last = reply[i : i + 7]
            if state not in _GROUP_STATES:
                raise ValueError(f"unknown group state {state!r}")
            typed: dt.GroupState = state
            self.kept[group_id] = dt.GroupInfo(
                group_id=group_id,
                priority=int(priority),
                depth=int(depth),
                head_seq=int(head),
                state=typed,
                busy_until=number(until) if until else None,
                last_claimed_at=number(last) if last else None,
            )
        deepest = sorted(self.kept.values(), key=_deepest)[: self.limit]
        if self.cursor != "0":
            self.kept = {g.group_id: g for g in deepest}
            return MORE
        return deepest


class _DeadPages(Op[T]):
    """Dead letters in seq order, `CHUNK` (or fewer) a call, from where the last ended,
    as far as ``limit`` (None: to the end); the rows `keep` says are turned into the
    answer by `done`."""

    __slots__ = ("after", "asked", "left", "rows")
    script = scripts.DEAD_LETTERS
    writes = False

    def __init__(self, limit: int | None) -> None:
        self.after, self.asked, self.left = 0, 0, limit
        self.rows: list[list[Any]] = []

    def args(self, now: str) -> Sequence[Arg]:
        self.asked = CHUNK if self.left is None else min(CHUNK, self.left)
        return (self.after, self.asked)

    def result(self, reply: Any) -> T | More:
        page = [reply[i : i + 13] for i in range(0, len(reply), 13)]
        self.rows += [row for row in page if self.keep(row)]
        if self.left is not None:
            self.left -= len(page)
        if len(page) == self.asked and self.left != 0:
            self.after = int(page[-1][0])
            return MORE
        return self.done(self.rows)

    def keep(self, row: list[Any]) -> bool:
        return True

    def done(self, rows: list[list[Any]]) -> T:
        raise NotImplementedError


class DeadLetters(_DeadPages[list[dt.DeadLetter]]):
    __slots__ = ()

    def __init__(self, limit: int | None) -> None:
        super().__init__(None if limit is None else core.check_limit(limit))

    def done(self, rows: list[list[Any]]) -> list[dt.DeadLetter]:
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
                    event=raw,
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

    def done(self, rows: list[list[Any]]) -> list[dt.HeldGroup]:
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

    def args(self, now: str) -> Sequence[Arg]:
        return (self.seq,)


class Requeue(_OneDeadLetter):
    __slots__ = ()
    script = scripts.REQUEUE

    def result(self, reply: Any) -> bool:
        code = int(reply[0])
        if code == -1:
            raise dt.RequeueRefused(self.seq, str(reply[2]), str(reply[1]))
        if code == -2:
            raise dt.RequeueRefused(self.seq, str(reply[2]), None, int(reply[1]))
        return code == 1


class Discard(_OneDeadLetter):
    __slots__ = ()
    script = scripts.DISCARD

    def result(self, reply: Any) -> bool:
        return int(reply) == 1


class PurgeGroup(Op[int]):
    """`CHUNK` messages and dead letters a call, up to the last seq at its first."""

    __slots__ = ("group_id", "removed", "upto")
    script = scripts.PURGE_GROUP

    def __init__(self, group_id: str) -> None:
        self.group_id = core.check_group_id(group_id)
        self.upto, self.removed = "", 0

    def args(self, now: str) -> Sequence[Arg]:
        return (self.group_id, self.upto, CHUNK)

    def result(self, reply: Any) -> int | More:
        self.removed += int(reply[0])
        self.upto = reply[1]
        return MORE if int(reply[2]) else self.removed


class Check(Op[list[str]]):
    """The read-only invariant check (for tests and operators)."""

    __slots__ = ()
    script = scripts.CHECK
    writes = False

    def args(self, now: str) -> Sequence[Arg]:
        return ()

    def result(self, reply: Any) -> list[str]:
        return [str(x) for x in reply]


def waiting(
    wait: float, ceiling: float, monotonic: Callable[[], float]
) -> Generator[float, core.Claimed | Idle | None, core.Claimed | None]:
    """A claim that may wait ``wait`` seconds. Primed with `next`, it is sent what the
    claim found, then what each new look found (None: the handle closed); it yields how
    long to block before the next look, and returns the message leased, or None."""
    deadline = monotonic() + wait
    got = yield 0.0
    while isinstance(got, Idle):
        left = deadline - monotonic()
        if left <= 0:
            return None
        got = yield wait_timeout(left, got, ceiling)
    return got


def wait_timeout(left: float, idle: Idle, ceiling: float) -> float:
    """How long a waiting claim blocks before it looks again: until its wait ends, the
    next lease or park ends (by the server's clock), or ``ceiling``, whichever is first."""
    timeout = min(left, ceiling)
    if idle.next_due is not None:
        # The lease lapses once the server's time is past its end: look just after.
        timeout = min(timeout, max(idle.next_due - idle.now, 0.0) + 0.002)
    return max(timeout, 0.001)
