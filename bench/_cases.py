"""The measurements. Each case runs in a fresh database file under ``workdir`` and returns
plain data (rates in messages per second, latencies in milliseconds, every round kept).

The floor is raw sqlite3 doing the commits a claim and an ack need, with nothing else:
``BEGIN IMMEDIATE``, a primary-key SELECT, an UPDATE, ``COMMIT``; then a DELETE in its own
(autocommit) transaction. Every case sends the same event.

The transport rows (claim+ack sync and async, publish, publish_many, worker processes) and
the timing of rounds (`interleaved`) are the installed ``transports bench`` command's own
cases, from `transports_cli.bench.cases`; here they only get a fresh file each.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from transports_cli.bench import cases as shared
from transports_cli.bench.cases import (
    EVENT,
    VISIBILITY,
    WORKER,
    Result,
    Round,
    interleaved,
    summary,
)
from transports_core import open_async_transport, open_transport

from . import _seed

__all__ = ["Result", "Round", "Workdir", "interleaved", "summary"]

RAW = EVENT.model_dump_json()


class Workdir:
    """Hands out fresh database paths and removes each case's files afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._n = 0

    @contextmanager
    def db(self, name: str) -> Iterator[Path]:
        self._n += 1
        path = self.root / f"{self._n:03d}-{name}.db"
        try:
            yield path
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)


# The floor's table and its one insert: what raw sqlite3 does for the same messages.
RAW_INSERT = "INSERT INTO messages (group_id, event) VALUES (?, ?)"


def _raw_connect(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(
        "CREATE TABLE messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL,"
        " event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)"
    )
    return conn


def _rows(n: int, groups: int) -> list[tuple[str, str]]:
    return [(f"group-{i % groups}", RAW) for i in range(n)]


# -- claim + ack ------------------------------------------------------------------------


@contextmanager
def floor(work: Workdir, synchronous: str, n: int, rounds: int) -> Iterator[Round]:
    with work.db("floor") as path:
        conn = _raw_connect(path, synchronous)
        conn.execute("BEGIN")
        conn.executemany(RAW_INSERT, _rows(n * rounds, 10))
        conn.execute("COMMIT")
        seqs = iter(range(1, n * rounds + 1))

        def run() -> None:
            for _, seq in zip(range(n), seqs, strict=False):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("SELECT seq, group_id, event FROM messages WHERE seq = ?", (seq,))
                conn.execute(
                    "UPDATE messages SET locked_by = ?, lock_expiry = ? WHERE seq = ?",
                    (WORKER, time.time() + VISIBILITY, seq),
                )
                conn.execute("COMMIT")
                conn.execute("DELETE FROM messages WHERE seq = ?", (seq,))

        yield run
        conn.close()


@contextmanager
def transport_sync(work: Workdir, synchronous: str, n: int, rounds: int) -> Iterator[Round]:
    with (
        work.db("sync") as path,
        open_transport(f"sqlite:///{path}", synchronous=synchronous) as t,
        shared.claim_ack(t, n, rounds) as run,
    ):
        yield run


@contextmanager
def transport_async(work: Workdir, synchronous: str, n: int, rounds: int) -> Iterator[Round]:
    with (
        work.db("async") as path,
        shared.claim_ack_async(
            lambda: open_async_transport(f"sqlite:///{path}", synchronous=synchronous), n, rounds
        ) as run,
    ):
        yield run


# -- publish ------------------------------------------------------------------------------


@contextmanager
def publish_raw(work: Workdir, synchronous: str, n: int) -> Iterator[Round]:
    with work.db("publish-raw") as path:
        conn = _raw_connect(path, synchronous)

        def run() -> None:
            for i in range(n):
                conn.execute(RAW_INSERT, (f"group-{i % 10}", RAW))

        yield run
        conn.close()


@contextmanager
def publish_transport(work: Workdir, synchronous: str, n: int) -> Iterator[Round]:
    with (
        work.db("publish") as path,
        open_transport(f"sqlite:///{path}", synchronous=synchronous) as t,
        shared.publish(t, n) as run,
    ):
        yield run


@contextmanager
def publish_many_raw(work: Workdir, synchronous: str, batches: int) -> Iterator[Round]:
    batch = _rows(1000, 10)
    with work.db("publish-many-raw") as path:
        conn = _raw_connect(path, synchronous)

        def run() -> None:
            for _ in range(batches):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(RAW_INSERT, batch)
                conn.execute("COMMIT")

        yield run
        conn.close()


@contextmanager
def publish_many_transport(
    work: Workdir, synchronous: str, batches: int, groups: int = 10
) -> Iterator[Round]:
    with (
        work.db("publish-many") as path,
        open_transport(f"sqlite:///{path}", synchronous=synchronous) as t,
        shared.publish_many(t, batches, groups=groups) as run,
    ):
        yield run


# -- backlog scaling ----------------------------------------------------------------------


def _build_backlog(path: Path, size: int, groups: int) -> None:
    # publish_many in large batches into a fresh file, then a checkpoint so that the
    # measurement does not pay for folding the build's WAL back into the database.
    with open_transport(f"sqlite:///{path}", synchronous="off") as t:
        for start in range(0, size, 50_000):
            stop = min(size, start + 50_000)
            t.publish_many([(f"group-{i % groups}", EVENT, 0) for i in range(start, stop)])
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def backlog(
    work: Workdir, sizes: tuple[int, ...], groups: int, n: int, synchronous: str
) -> dict[int, Result]:
    """Claim+ack latency (ms) at each backlog size, all files open at once and measured in
    turns of 100 cycles, so that load on the machine falls on every size alike."""
    with ExitStack() as stack:
        transports = {}
        builds = {}
        for size in sizes:
            path = stack.enter_context(work.db(f"backlog-{size}-{groups}"))
            started = time.perf_counter()
            _build_backlog(path, size, min(groups, size))
            builds[size] = time.perf_counter() - started
            url = f"sqlite:///{path}"
            transports[size] = stack.enter_context(open_transport(url, synchronous=synchronous))
        lat: dict[int, list[float]] = {size: [] for size in sizes}
        measured = {size: min(n, size // 2) for size in sizes}
        for turn in range(-1, max(measured.values()) // 100 + 1):  # turn -1 warms up
            for size, t in transports.items():
                for _ in range(min(100, measured[size] - 100 * max(turn, 0))):
                    start = time.perf_counter()
                    lease = t.claim(WORKER, VISIBILITY)
                    assert lease is not None
                    t.ack(lease)
                    if turn >= 0:
                        lat[size].append((time.perf_counter() - start) * 1000)
    return {
        size: summary("ms", lat[size], size=size, groups=min(groups, size), build_s=builds[size])
        for size in sizes
    }


def _latencies(n: int, cycle: Callable[[], None]) -> list[float]:
    cycle()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        cycle()
        out.append((time.perf_counter() - start) * 1000)
    return out


def backlog_seed(work: Workdir, size: int, groups: int, n: int, synchronous: str) -> Result:
    groups = min(groups, size)
    with work.db(f"seed-{size}-{groups}") as path:
        conn = _seed.create(str(path), _rows(size, groups), synchronous)

        def cycle() -> None:
            assert _seed.claim_ack(conn, time.time(), WORKER)

        lat = _latencies(n, cycle)
        conn.close()
    return summary("ms", lat, size=size, groups=groups)


# -- several processes ----------------------------------------------------------------------


def processes(work: Workdir, workers: int, total: int, synchronous: str) -> Result:
    with work.db(f"procs-{workers}") as path:
        return shared.processes(
            f"sqlite:///{path}", {"synchronous": synchronous}, workers, total, groups=1000
        )


# -- peers -----------------------------------------------------------------------------------


def _put_then_take(
    n: int, put: Callable[[], object], take: Callable[[], object]
) -> tuple[float, float]:
    """Rates of ``n`` calls of ``put``, then of ``n`` calls of ``take`` (a get and its ack)."""
    rates = []
    for step in (put, take):
        start = time.perf_counter()
        for _ in range(n):
            step()
        rates.append(n / (time.perf_counter() - start))
    return rates[0], rates[1]


def peer_persist_queue(work: Workdir, n: int) -> Result | None:
    try:
        import persistqueue
    except ImportError:
        return None
    with work.db("persist-queue") as path:
        path.mkdir()
        try:
            q = persistqueue.SQLiteAckQueue(str(path), multithreading=False, auto_commit=True)
            conn: Any = q._getter  # the queue's own connection, to read its settings
            synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
            put, get = _put_then_take(n, lambda: q.put(RAW), lambda: q.ack(q.get(block=False)))
            conn.close()
        finally:
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
    return {"put": put, "get_ack": get, "synchronous": _SYNC_NAMES.get(synchronous, synchronous)}


def peer_litequeue(work: Workdir, n: int) -> Result | None:
    try:
        import litequeue
    except ImportError:
        return None
    with work.db("litequeue") as path:
        q = litequeue.LiteQueue(str(path))
        synchronous = q.conn.execute("PRAGMA synchronous").fetchone()[0]
        put, get = _put_then_take(n, lambda: q.put(RAW), lambda: q.done(q.pop().message_id))
        q.close()
    return {"put": put, "get_ack": get, "synchronous": _SYNC_NAMES.get(synchronous, synchronous)}


_SYNC_NAMES = {0: "off", 1: "normal", 2: "full", 3: "extra"}


def ours_like_peer(work: Workdir, n: int, synchronous: str) -> Result:
    """The transport doing what a peer case does: n publishes, then n claim+acks."""
    with (
        work.db("ours-peer") as path,
        open_transport(f"sqlite:///{path}", synchronous=synchronous) as t,
    ):
        groups = itertools.cycle([f"group-{i}" for i in range(10)])

        def claim_ack() -> None:
            lease = t.claim(WORKER, VISIBILITY)
            assert lease is not None
            t.ack(lease)

        put, get = _put_then_take(n, lambda: t.publish(next(groups), EVENT), claim_ack)
    return {"put": put, "get_ack": get, "synchronous": synchronous}
