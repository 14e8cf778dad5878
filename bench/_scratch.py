"""A store of a benchmark's own on a shared server: a fresh name, removed at the end
whatever happened (a run stopped by SIGTERM too: the benchmarks turn it into an exit)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def scratch(prefix: str, remove: Callable[[str], None]) -> Iterator[str]:
    """``prefix`` with a random suffix; ``remove(name)`` when the block ends."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        remove(name)
