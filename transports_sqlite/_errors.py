"""Translating sqlite3 errors into `TransportError`s that name the database file.

Only what a caller can act on is translated (the file is locked, read-only, full, not a
database, cannot be opened); programming errors pass through unchanged. Used by both
drivers; imports sqlite3 only for its exception classes (aiosqlite raises the same ones).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
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
                raise TransportError(f"{path}: {why} ({exc})") from exc
        raise TransportError(f"{path}: SQLite error: {exc}") from exc
