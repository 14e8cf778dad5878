"""The reference model: the contract's semantics as a few dozen lines of plain Python.

The stateful test runs the same operations against a backend and against this model and
compares every result. Messages are identified by their publish order (`key`); the test
maps backend seqs to keys. A drained group is forgotten: its next publish creates it anew,
with a new priority and tenant and as never claimed; a pause is kept apart from groups.
A delayed message without ``hold`` waits outside its group until due, then joins its end
(in due order, ties by key) before anything else looks at the group; with ``hold`` it
takes its place at once and holds the group as its head until due. Tenants take turns by
the rule of `TransportAdmin` (pass, virtual time). Imports nothing from the rest of the
suite.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple


class Stale(Exception):
    """The model's `LeaseLost`: the lease named is not the current one."""


class ModelLease(NamedTuple):
    """The model's `Lease`: what a claim delivered, by the message's publish order."""

    key: int
    group: str
    attempt: int
    expires_at: float


@dataclass
class _Message:
    key: int
    group: str
    attempt: int = 0
    holder: str | None = None  # the worker leasing it, PARKED, or None when free
    until: float = 0.0  # when that lease or park ends
    due: float = 0.0  # a delayed message with hold: it holds its group until then


@dataclass
class _Group:
    priority: int
    messages: deque[_Message] = field(default_factory=deque)
    turn: int = 0  # 0: never claimed; else the number of the claim that last served it
    tenant: str | None = None


class _Timer(NamedTuple):
    due: float
    key: int
    group: str
    priority: int
    tenant: str | None


PARKED = "\0parked"  # the holder of a parked message; no worker id in the tests equals it


class ReferenceModel:
    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._keys = 0
        self._claims = 0
        self._timers: list[_Timer] = []
        self._paused: set[str] = set()
        self._weights: dict[str, int] = {}
        self._passes: dict[str | None, float] = {}
        self._vtime = 0.0

    def publish(
        self,
        group: str,
        priority: int,
        now: float = 0.0,
        delay: float = 0.0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        self.promote(now)
        self._keys += 1
        if delay and not hold:
            self._timers.append(_Timer(now + delay, self._keys, group, priority, tenant))
            return self._keys
        self._enqueue(_Message(self._keys, group, due=now + delay), priority, tenant)
        return self._keys

    def _enqueue(self, message: _Message, priority: int, tenant: str | None) -> None:
        self._groups.setdefault(message.group, _Group(priority, tenant=tenant)).messages.append(
            message
        )

    def promote(self, now: float) -> None:
        """Delayed messages due by ``now`` join their groups, in due order."""
        due = sorted(t for t in self._timers if t.due <= now)
        self._timers = [t for t in self._timers if t.due > now]
        for t in due:
            self._enqueue(_Message(t.key, t.group), t.priority, t.tenant)

    def pause(self, group: str, paused: bool) -> bool:
        changed = (group in self._paused) != paused
        (self._paused.add if paused else self._paused.discard)(group)
        return changed

    def set_weight(self, tenant: str, weight: int) -> None:
        self._weights[tenant] = weight

    def claim(
        self, worker: str, now: float, visibility: float, min_priority: int
    ) -> ModelLease | None:
        self.promote(now)
        ready = [
            (name, g)
            for name, g in self._groups.items()
            if g.priority >= min_priority
            and name not in self._paused
            and self._free(g.messages[0], now)
        ]
        if not ready:
            return None

        def start(tenant: str | None) -> float:
            return max(self._passes.get(tenant, 0.0), self._vtime)

        tenant = min({g.tenant for _, g in ready}, key=lambda x: (start(x), x is not None, x or ""))
        _, group = min(
            ((n, g) for n, g in ready if g.tenant == tenant),
            key=lambda ng: (ng[1].turn, ng[1].messages[0].key),
        )
        self._vtime = start(tenant)
        self._passes[tenant] = self._vtime + 1 / self._weights.get(tenant or "", 1)
        self._claims += 1
        group.turn = self._claims
        head = group.messages[0]
        head.attempt += 1
        head.holder, head.until = worker, now + visibility
        return ModelLease(head.key, head.group, head.attempt, head.until)

    def ack(self, key: int, worker: str, attempt: int) -> None:
        message = self._current(key, worker, attempt)
        group = self._groups[message.group]
        group.messages.popleft()
        if not group.messages:
            del self._groups[message.group]

    def nack(self, key: int, worker: str, attempt: int, now: float, delay: float) -> None:
        message = self._current(key, worker, attempt)
        if delay > 0:
            message.holder, message.until = PARKED, now + delay
        else:
            message.holder, message.until = None, 0.0

    def extend(self, key: int, worker: str, attempt: int, now: float, visibility: float) -> float:
        message = self._current(key, worker, attempt)
        message.until = now + visibility
        return message.until

    def deadlines(self) -> list[float]:
        """When each lease or park of a group's head runs out, and each delayed message
        comes due."""
        return [
            *(g.messages[0].until for g in self._groups.values() if g.messages[0].holder),
            *(m.due for g in self._groups.values() for m in g.messages if m.due),
            *(t.due for t in self._timers),
        ]

    def current(self) -> list[tuple[int, str, int]]:
        """(key, worker, attempt) of every lease that is still current."""
        found = []
        for group in self._groups.values():
            head = group.messages[0]
            if head.holder is not None and head.holder != PARKED:
                found.append((head.key, head.holder, head.attempt))
        return found

    def __len__(self) -> int:
        return sum(len(g.messages) for g in self._groups.values()) + len(self._timers)

    @staticmethod
    def _free(head: _Message, now: float) -> bool:
        return head.due <= now and (head.holder is None or head.until < now)

    def _current(self, key: int, worker: str, attempt: int) -> _Message:
        for group in self._groups.values():
            head = group.messages[0]
            if head.key == key:
                if head.holder == worker and head.attempt == attempt:
                    return head
                break
        raise Stale(key)
