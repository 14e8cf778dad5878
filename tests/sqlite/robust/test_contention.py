"""Contention never reaches a caller while it can still pass: a transaction that SQLite
reports busy despite the busy timeout is run again, with backoff, for a bounded time."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from transports_core import (
    Event,
    TransportAdmin,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_sqlite._errors import RETRY_CAP, is_transient, retry_delay


def _busy_error(db: Path) -> sqlite3.OperationalError:
    """A real SQLITE_BUSY, from SQLite itself."""
    holder = sqlite3.connect(db, isolation_level=None)
    other = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute("BEGIN IMMEDIATE")
        return caught.value
    finally:
        holder.close()
        other.close()


def test_lock_contention_is_transient_and_other_errors_are_not(tmp_path: Path) -> None:
    assert is_transient(_busy_error(tmp_path / "q.db"))
    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert not is_transient(sqlite3.OperationalError("no such table: messages"))
    assert not is_transient(sqlite3.OperationalError("database or disk is full"))
    assert not is_transient(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not is_transient(ValueError("database is locked"))


def test_retry_backoff_doubles_to_a_cap_and_stops_after_twice_the_busy_timeout() -> None:
    busy = sqlite3.OperationalError("database is locked")
    top = [retry_delay(busy, n, 0.0, 5.0, rand=lambda: 1.0) for n in range(1, 10)]
    assert top == [0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.1, 0.1, 0.1]
    assert max(top) == RETRY_CAP  # type: ignore[type-var]
    assert retry_delay(busy, 1, 0.0, 5.0, rand=lambda: 0.25) == 0.0005  # jitter scales it
    assert retry_delay(busy, 50, 9.99, 5.0, rand=lambda: 1.0) == pytest.approx(0.01)
    assert retry_delay(busy, 1, 10.0, 5.0) is None  # out of time
    assert retry_delay(busy, 1, 0.0, 0.0) is None  # busy_timeout=0: fail fast
    assert retry_delay(sqlite3.OperationalError("disk I/O error"), 1, 0.0, 5.0) is None


@contextmanager
def _write_lock_held(db: Path, seconds: float | None) -> Iterator[threading.Event]:
    """Another connection holds the write lock for ``seconds`` (None: until the block
    ends). Yields once the lock is taken."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        release.wait(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(10)
        yield release
    finally:
        release.set()
        thread.join()


def test_begin_that_outwaits_the_busy_timeout_is_retried(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with open_transport(f"sqlite:///{db}?busy_timeout=500") as transport:
        # Held past one busy timeout (500 ms) but within the retry budget (1 s): the first
        # BEGIN IMMEDIATE gives up, the retry gets the lock when it is released.
        with _write_lock_held(db, 0.7):
            assert transport.publish("g", Event(n=1)) == 1
        lease = transport.claim("w", 30)
        assert lease is not None
        assert lease.event.n == 1


def test_async_begin_that_outwaits_the_busy_timeout_is_retried(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    open_transport(f"sqlite:///{db}").close()

    async def main() -> int:
        async with open_async_transport(f"sqlite:///{db}", busy_timeout=500) as transport:
            with _write_lock_held(db, 0.7):
                return await transport.publish("g", Event(n=1))

    assert asyncio.run(main()) == 1


def test_contention_that_never_ends_gives_up_with_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with open_transport(f"sqlite:///{db}", busy_timeout=100) as transport:
        with _write_lock_held(db, None):
            started = time.monotonic()
            with pytest.raises(TransportError, match="locked") as caught:
                transport.publish("g", Event(n=1))
            waited = time.monotonic() - started
        assert str(db) in str(caught.value)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        # Bounded: about three busy timeouts (0.3 s), here with a generous margin.
        assert waited < 3.0
        assert transport.publish("g", Event(n=2)) == 1  # and it works once the lock is free


def test_admin_reads_do_not_wait_for_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with open_transport(f"sqlite:///{db}", busy_timeout=0) as transport:
        assert isinstance(transport, TransportAdmin)
        transport.publish("g", Event(n=1))
        with _write_lock_held(db, None):
            assert transport.stats().ready == 1
            assert [g.group_id for g in transport.groups()] == ["g"]
            with pytest.raises(TransportError, match="locked"):
                transport.claim("w", 30)
