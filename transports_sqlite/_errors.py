"""Translating sqlite3 errors into `TransportError`s that name the database file, and
deciding which failed transactions are worth running again.

Only what a caller can act on is translated (the file is locked, read-only, full, not a
database, cannot be opened); programming errors pass through unchanged. Contention is not
something a caller can act on, so it is retried before it is translated: `retry_delay` is
the one place that decides whether and when, and the engine both twins run only loops over
it. Imports sqlite3 only for its exception classes.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from transports_core import TransportError

_WHY = (
    ("locked", "the database is locked by another writer (busy_timeout elapsed)"),
    ("busy", "the database is locked by another writer (busy_timeout elapsed)"),
    ("readonly", "the database is read-only"),
    ("full", "the disk or database is full"),
    ("not a database", "the file is not a SQLite database"),
    ("malformed", "the database file is corrupt"),
    ("unable to open", "the database file cannot be opened"),
    ("disk i/o", "a disk I/O error occurred"),
)

# Primary result codes that mean "someone else holds a lock right now": SQLITE_BUSY (also
# returned by WAL recovery and checkpoints, where the busy handler is not always called),
# SQLITE_LOCKED, and SQLITE_PROTOCOL (a WAL lock race SQLite gave up retrying itself).
_TRANSIENT_CODES = frozenset({5, 6, 15})
_TRANSIENT_TEXT = ("database is locked", "database is busy", "database table is locked")

# Backoff between whole-transaction retries: full jitter over a doubling ceiling.
RETRY_FIRST = 0.002
RETRY_CAP = 0.1
RETRY_BUDGET = 2  # in busy timeouts


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` is lock contention that a fresh attempt of the transaction may pass."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return code & 0xFF in _TRANSIENT_CODES
    text = str(exc).lower()
    return any(needle in text for needle in _TRANSIENT_TEXT)


def retry_delay(
    exc: BaseException,
    failures: int,
    elapsed: float,
    busy_timeout: float,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """Seconds to wait before running a transaction again after its ``failures``-th
    failure (1 for the first), ``elapsed`` seconds after its first attempt began; or None
    to give up and let ``exc`` through.

    Only contention is retried, and only until twice ``busy_timeout`` (seconds) have
    passed: so a BEGIN IMMEDIATE that waited out the whole busy timeout gets another go.
    As each attempt may itself wait up to the busy timeout inside SQLite, a call gives up
    after at most about three busy timeouts.
    """
    budget = RETRY_BUDGET * busy_timeout
    if not is_transient(exc) or elapsed >= budget:
        return None
    ceiling = min(RETRY_CAP, RETRY_FIRST * (1 << min(failures - 1, 16)))
    return min(rand() * ceiling, budget - elapsed)


class Retries:
    """The retry bookkeeping of one call, shared by both runners: the clock starts when
    the call's first attempt did, and each failure asks `retry_delay` what to do."""

    __slots__ = ("_busy_timeout", "_failures", "_started")

    def __init__(self, started: float, busy_timeout_ms: int) -> None:
        self._started = started
        self._busy_timeout = busy_timeout_ms / 1000
        self._failures = 0

    def after(self, exc: BaseException) -> float | None:
        """Seconds to wait before the next attempt, or None to give up with ``exc``."""
        self._failures += 1
        elapsed = time.monotonic() - self._started
        return retry_delay(exc, self._failures, elapsed, self._busy_timeout)


@contextmanager
def sqlite_errors(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, (sqlite3.ProgrammingError, sqlite3.IntegrityError)):
            raise
        text = str(exc).lower()
        for needle, why in _WHY:
            if needle in text:
                hint = _read_only_hint(path) if needle == "readonly" else ""
                raise TransportError(f"{path}: {why}{hint} ({exc})") from exc
        raise TransportError(f"{path}: SQLite error: {exc}") from exc


def _read_only_hint(path: str) -> str:
    """Why SQLite may not write: the file, or the directory where the WAL files go."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(f"{path}-shm") and not os.access(parent, os.W_OK):
        return (
            f": directory {parent!r} is not writable, and SQLite must create the -wal and "
            "-shm files beside the database to use it"
        )
    if not os.access(path, os.W_OK):
        return ": the file is not writable"
    return ""
