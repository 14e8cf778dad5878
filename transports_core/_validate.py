"""Argument checks that every backend shares, so that every backend refuses the same
inputs with the same errors, before it writes anything.

Each check returns the value it accepted (normalised where that is harmless) or raises
``ValueError``/``TypeError`` naming the argument and the bad value. Imports only ``_models``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._models import Lease

__all__ = [
    "MAX_PRIORITY",
    "PARKED",
    "check_delay",
    "check_group_id",
    "check_lease",
    "check_limit",
    "check_priority",
    "check_seq",
    "check_visibility",
    "check_worker_id",
]

MAX_PRIORITY = 4
# Marks a parked message where a worker id would be; no worker may use it.
PARKED = "__parked__"
RESERVED_WORKER_IDS = frozenset({PARKED})


def check_group_id(group_id: object) -> str:
    if not isinstance(group_id, str):
        raise TypeError(f"group_id must be a str, not {type(group_id).__name__}: {group_id!r}")
    if not group_id:
        raise ValueError("group_id must not be empty")
    return group_id


def check_priority(priority: object, name: str = "priority") -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"{name} must be an int from 0 to {MAX_PRIORITY}, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"{name} must be from 0 to {MAX_PRIORITY}, got {priority!r}")
    return priority


def check_worker_id(worker_id: object) -> str:
    if not isinstance(worker_id, str):
        raise TypeError(f"worker_id must be a str, not {type(worker_id).__name__}: {worker_id!r}")
    if not worker_id:
        raise ValueError("worker_id must not be empty")
    if worker_id in RESERVED_WORKER_IDS:
        raise ValueError(f"worker_id {worker_id!r} is reserved by the transport")
    return worker_id


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_visibility(visibility: object) -> float:
    seconds = _seconds(visibility, "visibility")
    if seconds <= 0:
        raise ValueError(f"visibility must be > 0 seconds, got {visibility!r}")
    return seconds


def check_delay(delay: object) -> float:
    seconds = _seconds(delay, "delay")
    if seconds < 0:
        raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
    return seconds


def check_lease(lease: object) -> Lease[object]:
    if not isinstance(lease, Lease):
        raise TypeError(f"expected a Lease, got {type(lease).__name__}: {lease!r:.200}")
    return lease


def check_items(items: object) -> Iterable[object]:
    """``publish_many``'s items, if they are an iterable (each is checked by `check_item`)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"items must be an iterable of (group_id, event, priority), got {items!r:.200}"
        )
    return items


def check_item(index: int, item: object) -> tuple[object, object, object]:
    """Item ``index`` of ``publish_many``, if it is a 3-tuple."""
    if not isinstance(item, tuple) or len(item) != 3:
        raise TypeError(
            f"items[{index}] must be a (group_id, event, priority) tuple, got {item!r:.200}"
        )
    return item


def check_seq(seq: object) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, got {seq!r}")
    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq!r}")
    return seq


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int >= 1, got {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit!r}")
    return limit
