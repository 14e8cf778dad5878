"""What the async twin runs on the event loop's thread, and what it never lets the loop
wait for: another process's lock, a flush, a checkpoint. Seen from SQLite (the statements
each thread runs, through the connection's trace callback), from the loop (a task that
keeps ticking), and from other connections and processes."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, open_async_transport
from transports_sqlite import AsyncSqliteTransport, _ops
from transports_sqlite import _sql as sql
from transports_sqlite._async import NOT_HERE, LoopEngine
from transports_sqlite._sql import IDLE_WAL_BYTES, WAL_LIMIT_BYTES

from ._support import query, snapshot

Traced = list[tuple[str, int]]  # (statement, the id of the thread that ran it)

# Another process that takes the write lock, says so, and lets go when told (a line on
# its stdin), or when the test is over.
HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextmanager
def write_lock_held(db: Path) -> Iterator[Callable[[], None]]:
    """Another process holds ``db``'s write lock until the yielded callable is called."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    stdin = holder.stdin

    def release() -> None:
        if not stdin.closed:
            stdin.write("go\n")
            stdin.close()

    try:
        assert holder.stdout.readline() == "holding\n"
        yield release
    finally:
        release()
        assert holder.wait(30) == 0
        holder.stdout.close()


async def opened(db: Path, synchronous: str) -> AsyncSqliteTransport[Event]:
    """An async transport whose connection is open (it opens on the engine's thread)."""
    transport = open_async_transport(f"sqlite:///{db}", synchronous=synchronous)
    assert isinstance(transport, AsyncSqliteTransport)
    assert await transport.stats() is not None
    return transport


async def trace(transport: AsyncSqliteTransport[Any]) -> Traced:
    """From now on, each statement the transport runs and the thread that runs it."""
    seen: Traced = []

    def here() -> None:
        conn = transport._engine_here().conn
        assert conn is not None
        conn.set_trace_callback(lambda s: seen.append((" ".join(s.split()), threading.get_ident())))

    await transport._submit(here)
    return seen


def threads(seen: Traced) -> set[str]:
    loop = threading.get_ident()
    return {"loop" if thread == loop else "engine" for _, thread in seen}


# Where each call runs, at each level: on the loop when it is brief and its commit flushes
# nothing; on the engine's thread otherwise.
WHERE = {
    #          publish   claim     extend    nack      ack       publish_many  stats
    "normal": ("loop", "loop", "loop", "loop", "loop", "engine", "engine"),
    "full": ("engine", "loop", "loop", "loop", "engine", "engine", "engine"),
    "extra": ("engine", "engine", "engine", "engine", "engine", "engine", "engine"),
}


@pytest.mark.parametrize("synchronous", sorted(WHERE))
def test_brief_calls_that_flush_nothing_run_on_the_loop_and_the_rest_on_the_engines_thread(
    tmp_path: Path, synchronous: str
) -> None:
    async def main() -> list[set[str]]:
        transport = await opened(tmp_path / "q.db", synchronous)
        async with transport:
            lease: Lease[Event] | None = None

            async def claim() -> None:
                nonlocal lease
                lease = await transport.claim("w", 30)

            async def extend() -> None:
                nonlocal lease
                assert lease is not None
                lease = await transport.extend(lease, 60)

            async def nack() -> None:
                assert lease is not None
                await transport.nack(lease)

            async def ack() -> None:
                await claim()
                seen.clear()  # the ack's own statements only
                assert lease is not None
                await transport.ack(lease)

            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: transport.publish("g", Event(n=1)),
                claim,
                extend,
                nack,
                ack,
                lambda: transport.publish_many([("h", Event(n=2), 0)]),
                transport.stats,
            ]
            seen = await trace(transport)
            where = []
            for call in calls:
                seen.clear()
                await call()
                assert seen, call
                where.append(threads(seen))
            return where

    ran = asyncio.run(main())
    assert ran == [{place} for place in WHERE[synchronous]]


@pytest.mark.parametrize(("synchronous", "on_loop"), [("normal", True), ("full", False)])
def test_the_loop_keeps_running_while_another_process_holds_the_write_lock(
    tmp_path: Path, synchronous: str, on_loop: bool
) -> None:
    db = tmp_path / "q.db"

    async def main() -> tuple[float, float, int, Lease[Event] | None]:
        transport = await opened(db, synchronous)
        async with transport:
            await transport.publish("g", Event(n=1))
            ticks: list[float] = []

            async def ticker() -> None:
                while True:
                    ticks.append(time.monotonic())
                    await asyncio.sleep(0.005)

            ticking = asyncio.create_task(ticker())
            with write_lock_held(db) as release:
                claim = asyncio.create_task(transport.claim("w", 30))
                publish = asyncio.create_task(transport.publish("g", Event(n=2)))
                held = time.monotonic()
                while time.monotonic() - held < 0.5:  # half a second of a held lock
                    await asyncio.sleep(0.01)
                    assert not claim.done(), "the claim went past the lock"
                    assert not publish.done(), "the publish went past the lock"
                gap = max(b - a for a, b in itertools.pairwise(ticks))
                released = time.monotonic()
                release()
                lease = await asyncio.wait_for(claim, 30)
                seq = await asyncio.wait_for(publish, 30)
            waited = time.monotonic() - released
            ticking.cancel()
            return gap, waited, seq, lease

    gap, waited, seq, lease = asyncio.run(main())
    # The loop ran its ticker throughout: a call waiting for the lock on the loop would
    # have stopped it for the whole half second.
    assert gap < 0.25, f"the loop stood still for {gap:.3f} s"
    assert waited < 10
    assert lease is not None
    assert (lease.seq, lease.attempt) == (1, 1)
    assert seq == 2


# The calls that run on the loop (at full a publish flushes: it never does).
@pytest.mark.parametrize(
    ("synchronous", "call"),
    [("full", "claim"), ("full", "extend"), ("normal", "claim"), ("normal", "publish")],
)
def test_a_transaction_that_finds_the_database_busy_on_the_loop_leaves_nothing_behind(
    tmp_path: Path, synchronous: str, call: str
) -> None:
    db = tmp_path / "q.db"

    async def main() -> None:
        transport = await opened(db, synchronous)
        async with transport:
            await transport.publish("g", Event(n=1))
            await transport.publish("h", Event(n=1))
            lease = await transport.claim("w", 30)  # g's: h is left to claim
            assert lease is not None
            assert lease.group_id == "g"
            ops: dict[str, _ops.Op[Any]] = {
                "claim": _ops.Claim("w", 30, 0),
                "publish": _ops.Publish(transport._codec, "g", Event(n=2), 0),
                "extend": _ops.Extend(lease, 60),
            }
            engine = transport._engine
            assert isinstance(engine, LoopEngine)
            conn = engine.conn
            assert conn is not None
            before = snapshot(db)
            seen = await trace(transport)
            with write_lock_held(db):
                assert engine.may_run_here(ops[call])
                assert engine.run_here(ops[call]) is NOT_HERE
                assert not conn.in_transaction
                # the level a lease move is committed at is put back (see test_durability)
                level = {"full": 2, "normal": 1}[synchronous]
                assert conn.execute("PRAGMA synchronous").fetchall() == [(level,)]
                assert conn.execute("PRAGMA busy_timeout").fetchall() == [(0,)]
                assert snapshot(db) == before
            assert threads(seen) == {"loop"}
            # The same call, run again from the start once the lock is free, does it once.
            await transport._run(ops[call])
            groups = "SELECT group_id, attempt, locked_by, lock_expiry FROM groups ORDER BY 1"
            (g, h) = query(db, groups)
            assert g[:3] == ("g", 1, "w")
            assert (g[3] > lease.expires_at) == (call == "extend")
            assert h[1:3] == ((1, "w") if call == "claim" else (0, None))
            published = query(db, "SELECT count(*) FROM messages")
            assert published == [(3 if call == "publish" else 2,)]

    asyncio.run(main())


def test_the_wal_is_checkpointed_on_the_engines_thread_and_stays_bounded(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    cycles = 4000  # at normal, about 8 checkpoints' worth of brief commits

    async def main() -> tuple[Traced, list[int]]:
        transport = await opened(db, "normal")
        async with transport:
            conn = transport._engine.conn  # type: ignore[union-attr]
            assert conn is not None
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchall() == [(0,)]
            await transport.publish_many([(f"g{n % 10}", Event(n=n), 0) for n in range(cycles)])
            seen = await trace(transport)
            sizes = []
            for n in range(cycles):
                lease = await transport.claim("w", 30)
                assert lease is not None
                await transport.ack(lease)
                if n % 100 == 0:
                    sizes.append(Path(f"{db}-wal").stat().st_size)
            return seen, sizes

    seen, sizes = asyncio.run(main())
    loop = threading.get_ident()
    checkpoints = [(s, t) for s, t in seen if s.startswith("PRAGMA wal_checkpoint")]
    assert len(checkpoints) >= 5, checkpoints  # one each 1,024 brief commits or so
    assert all(thread != loop for _, thread in checkpoints)
    # Each checkpoint empties the WAL (nobody else reads), so the engine's thread makes
    # the first commit into it, whose header SQLite flushes.
    after = [seen[seen.index(c) + 1] for c in checkpoints]
    assert all(s == sql.REWRITE_HEADER.text and t != loop for s, t in after), after
    # Without them the WAL would grow by every commit: well past the limit.
    assert max(sizes) < WAL_LIMIT_BYTES / 2, sizes


def test_an_idle_async_claim_shrinks_a_large_wal(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    wal = Path(f"{db}-wal")

    async def main() -> tuple[int, int]:
        transport = await opened(db, "normal")
        async with transport:
            await transport.publish_many(
                (f"g{n % 50}", Event(n=n, pad="w" * 2000), 0) for n in range(300)
            )
            grown = wal.stat().st_size
            for _ in range(300):
                lease = await transport.claim("a", 30)
                assert lease is not None
                await transport.ack(lease)
            assert await transport.claim("a", 30) is None
            return grown, wal.stat().st_size

    grown, after = asyncio.run(main())
    assert grown > IDLE_WAL_BYTES
    # Truncated, then one header page written again (see the test above).
    assert after < 4096, after
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchall() == [(0,)]
