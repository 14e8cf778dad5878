"""A small in-memory transport with switchable defects, for proving that the conformance
suite catches each broken promise. With no defects switched on it keeps the contract (and
passes the suite); it shares no code with the suite's reference model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import TracebackType

from transports_core import Event, Lease, LeaseLost, TransportError
from transports_core._codec import EventCodec
from transports_core._validate import (
    check_delay,
    check_group_id,
    check_lease,
    check_priority,
    check_visibility,
    check_worker_id,
)

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

PARKED = "__parked__"


@dataclass(frozen=True)
class Defects:
    lifo: bool = False  # delivers a group's newest message first
    no_exclusivity: bool = False  # delivers a group's next message while one is leased
    eternal_leases: bool = False  # a worker's lease never lapses
    ignore_park: bool = False  # nack(delay) frees the message at once
    fixed_order: bool = False  # always serves the oldest group first: no round-robin
    ignore_floor: bool = False  # claim ignores min_priority
    no_fencing: bool = False  # ack/nack/extend act on the seq, whoever holds it now
    drop_every: int = 0  # every n-th publish is silently lost


@dataclass
class _Message:
    seq: int
    group: str
    raw: str
    attempt: int = 0
    holder: str | None = None
    until: float = 0.0


@dataclass
class _Group:
    priority: int
    created: int
    turn: int = 0
    seqs: list[int] = field(default_factory=list)


class MemoryStore:
    def __init__(self, clock: Callable[[], float], defects: Defects = Defects()) -> None:
        self.clock, self.defects = clock, defects
        self.lock = threading.Lock()
        self.messages: dict[int, _Message] = {}
        self.groups: dict[str, _Group] = {}
        self.seq = self.publishes = self.claims = 0

    def open(self) -> MemoryTransport:
        return MemoryTransport(self)


class MemoryTransport:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._codec: EventCodec[Event] = EventCodec(Event)
        self._closed = False

    # -- writing ---------------------------------------------------------------------

    def _append(self, group_id: str, raw: str, priority: int) -> int:
        s = self._store
        s.seq += 1
        s.publishes += 1
        if s.defects.drop_every and s.publishes % s.defects.drop_every == 0:
            return s.seq
        s.messages[s.seq] = _Message(s.seq, group_id, raw)
        s.groups.setdefault(group_id, _Group(priority, s.seq)).seqs.append(s.seq)
        return s.seq

    def publish(self, group_id: str, event: Event, priority: int = 0) -> int:
        group_id, priority = check_group_id(group_id), check_priority(priority)
        raw = self._codec.encode(event)
        with self._locked():
            return self._append(group_id, raw, priority)

    def publish_many(self, items: Iterable[tuple[str, Event, int]]) -> list[int]:
        encoded = self._codec.encode_items(items)
        with self._locked():
            return [self._append(g, raw, p) for g, raw, p in encoded]

    # -- claiming --------------------------------------------------------------------

    def _busy(self, m: _Message, now: float) -> bool:
        if m.holder is None:
            return False
        if self._store.defects.eternal_leases and m.holder != PARKED:
            return True
        return m.until >= now

    def _pick(self, group: _Group, now: float) -> _Message | None:
        s = self._store
        order = [s.messages[seq] for seq in group.seqs]
        if s.defects.lifo:
            order.reverse()
        if s.defects.no_exclusivity:
            return next((m for m in order if not self._busy(m, now)), None)
        if any(self._busy(m, now) for m in order):
            return None
        return order[0]

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Lease[Event] | None:
        worker_id, visibility = check_worker_id(worker_id), check_visibility(visibility)
        min_priority = check_priority(min_priority, "min_priority")
        s = self._store
        with self._locked():
            now = s.clock()
            ready = []
            for name, group in s.groups.items():
                if group.priority < min_priority and not s.defects.ignore_floor:
                    continue
                picked = self._pick(group, now)
                if picked is not None:
                    key = (group.created,) if s.defects.fixed_order else (group.turn, picked.seq)
                    ready.append((key, name, picked))
            if not ready:
                return None
            _, name, m = min(ready, key=lambda r: r[0])
            s.claims += 1
            s.groups[name].turn = s.claims
            m.attempt += 1
            m.holder, m.until = worker_id, now + visibility
            return self._codec.lease(m.seq, m.group, m.raw, worker_id, m.attempt, m.until)

    # -- settling --------------------------------------------------------------------

    def _current(self, lease: Lease[object]) -> _Message:
        m = self._store.messages.get(lease.seq)
        if m is None:
            raise LeaseLost(lease)
        if not self._store.defects.no_fencing and (
            m.holder != lease.worker_id or m.attempt != lease.attempt
        ):
            raise LeaseLost(lease)
        return m

    def ack(self, lease: Lease[object]) -> None:
        check_lease(lease)
        s = self._store
        with self._locked():
            m = self._current(lease)
            del s.messages[m.seq]
            group = s.groups[m.group]
            group.seqs.remove(m.seq)
            if not group.seqs:
                del s.groups[m.group]

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        check_lease(lease)
        delay = check_delay(delay)
        with self._locked():
            m = self._current(lease)
            if delay > 0 and not self._store.defects.ignore_park:
                m.holder, m.until = PARKED, self._store.clock() + delay
            else:
                m.holder, m.until = None, 0.0

    def extend(self, lease: Lease[Event], visibility: float) -> Lease[Event]:
        check_lease(lease)
        visibility = check_visibility(visibility)
        with self._locked():
            m = self._current(lease)
            m.until = self._store.clock() + visibility
            return replace(lease, expires_at=m.until)

    # -- lifecycle -------------------------------------------------------------------

    def _locked(self) -> threading.Lock:
        if self._closed:
            raise TransportError("transport is closed")
        return self._store.lock

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        self.close()
