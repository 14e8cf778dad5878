"""A ``claim_many`` that waits leases its first message in the wait, then the rest of the
batch in a second call. When the store fails in that second call (here: another
connection holds SQLite's write lock past the busy timeout), the lease the wait took is
the caller's and comes back alone; before, it was dropped with the error and its group
stalled until the lease lapsed."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, Message, open_async_transport, open_transport

GROUPS = ("a", "b", "c")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


@pytest.fixture
def locker(db: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection to the file, to take its write lock with."""
    with open_transport(f"sqlite:///{db}"):
        pass  # makes the schema, so that BEGIN IMMEDIATE has a database to lock
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        yield conn


def _url(db: Path) -> str:
    # The fill gives up after a few busy timeouts: keep them short.
    return f"sqlite:///{db}?busy_timeout=100"


def _batch() -> list[Message[Event]]:
    return [Message(group, Event(n=n)) for n, group in enumerate(GROUPS)]


def _check(leases: list[Lease[Any]], rest: list[Lease[Any]]) -> None:
    assert [(lease.group_id, lease.attempt) for lease in leases] == [("a", 1)]
    assert sorted(lease.group_id for lease in rest) == ["b", "c"]


def test_sync_a_failed_fill_returns_the_lease_the_wait_took(
    db: Path, locker: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_transport(_url(db)) as waiting, open_transport(_url(db)) as other:
        claim = waiting.claim

        def claim_then_lock(*args: Any) -> Lease[Any] | None:
            # The queue was empty when claim_many looked: it waits, by this claim.
            other.publish_many(_batch())
            lease = claim(*args)
            locker.execute("BEGIN IMMEDIATE")
            return lease

        monkeypatch.setattr(waiting, "claim", claim_then_lock)
        try:
            leases = waiting.claim_many("w1", 30, len(GROUPS), wait=5)
        finally:
            locker.execute("ROLLBACK")
        waiting.ack(leases[0])  # still current: nobody else holds it
        _check(leases, other.claim_many("w2", 30, len(GROUPS)))


def test_async_a_failed_fill_returns_the_lease_the_wait_took(
    db: Path, locker: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> tuple[list[Lease[Any]], list[Lease[Any]]]:
        async with (
            open_async_transport(_url(db)) as waiting,
            open_async_transport(_url(db)) as other,
        ):
            claim = waiting.claim

            async def claim_then_lock(*args: Any) -> Lease[Any] | None:
                await other.publish_many(_batch())
                lease = await claim(*args)
                locker.execute("BEGIN IMMEDIATE")
                return lease

            monkeypatch.setattr(waiting, "claim", claim_then_lock)
            try:
                leases = await waiting.claim_many("w1", 30, len(GROUPS), wait=5)
            finally:
                locker.execute("ROLLBACK")
            await waiting.ack(leases[0])
            return leases, await other.claim_many("w2", 30, len(GROUPS))

    _check(*asyncio.run(main()))
