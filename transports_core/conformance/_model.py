"""The reference model: the contract's semantics as a few dozen lines of plain Python.

The stateful test runs the same operations against a backend and against this model and
compares every result. Messages are identified by their publish order (`key`); the test
maps backend seqs to keys. A drained group is forgotten: its next publish creates it anew,
with a new priority and as never claimed. Imports nothing from the rest of the suite.
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


@dataclass
class _Group:
    priority: int
    messages: deque[_Message] = field(default_factory=deque)
    turn: int = 0  # 0: never claimed; else the number of the claim that last served it


PARKED = "\0parked"  # the holder of a parked message; no worker id in the tests equals it


class ReferenceModel:
    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._keys = 0
        self._claims = 0

    def publish(self, group: str, priority: int) -> int:
        self._keys += 1
        self._groups.setdefault(group, _Group(priority)).messages.append(
            _Message(self._keys, group)
        )
        return self._keys

    def claim(
        self, worker: str, now: float, visibility: float, min_priority: int
    ) -> ModelLease | None:
        ready = [
            g
            for g in self._groups.values()
            if g.priority >= min_priority and self._free(g.messages[0], now)
        ]
        if not ready:
            return None
        group = min(ready, key=lambda g: (g.turn, g.messages[0].key))
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
        """When each lease or park of a group's head runs out."""
        return [
            g.messages[0].until for g in self._groups.values() if g.messages[0].holder is not None
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
        return sum(len(g.messages) for g in self._groups.values())

    @staticmethod
    def _free(head: _Message, now: float) -> bool:
        return head.holder is None or head.until < now

    def _current(self, key: int, worker: str, attempt: int) -> _Message:
        for group in self._groups.values():
            head = group.messages[0]
            if head.key == key:
                if head.holder == worker and head.attempt == attempt:
                    return head
                break
        raise Stale(key)
