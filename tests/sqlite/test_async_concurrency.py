"""The async twin keeps each transaction whole when many tasks share one transport object,
and a cancelled operation leaves nothing open behind it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from transports_core import Event, Lease, LeaseLost, open_async_transport, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import AsyncSqliteTransport

GROUPS = 20
PER_GROUP = 15
TASKS = 300

# Makes a quarter of all claims fail *after* their lease was written: the claim's second
# statement aborts, so the whole transaction must roll back, lease included.
FORCED_ROLLBACK = """
CREATE TEMP TRIGGER forced_rollback BEFORE UPDATE OF last_claimed_at ON main.groups
WHEN abs(random()) % 4 = 0
BEGIN SELECT RAISE(ABORT, 'forced rollback'); END
"""


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def on_engine(
    transport: AsyncSqliteTransport[Event], call: Callable[[sqlite3.Connection], object]
) -> None:
    """Run ``call`` on the transport's connection, on the thread that owns it."""

    def here() -> None:
        conn = transport._engine_here().conn
        assert conn is not None
        call(conn)

    await transport._submit(here)


def test_hundreds_of_tasks_with_forced_rollbacks_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        transport = open_async_transport(f"sqlite:///{tmp_path / 'q.db'}")
        assert isinstance(transport, AsyncSqliteTransport)
        published: dict[str, list[int]] = {}
        acked: list[int] = []
        delivered: Counter[int] = Counter()
        in_flight: set[str] = set()
        order: dict[str, list[int]] = {}
        rollbacks = 0
        rng = random.Random(7)

        async def publisher(group: str) -> None:
            for n in range(PER_GROUP):
                seq = await transport.publish(group, Event(n=n), priority=n % 5 if n == 0 else 0)
                published.setdefault(group, []).append(seq)

        async def worker(name: str) -> None:
            nonlocal rollbacks
            idle = 0
            while idle < 20:
                try:
                    lease = await transport.claim(name, visibility=60)
                except sqlite3.IntegrityError as exc:
                    if "forced rollback" not in str(exc):
                        raise
                    rollbacks += 1
                    continue
                if lease is None:
                    idle += 1
                    await asyncio.sleep(0.001)
                    continue
                idle = 0
                assert lease.group_id not in in_flight, "two live leases on one group"
                in_flight.add(lease.group_id)
                delivered[lease.seq] += 1
                await asyncio.sleep(0)
                in_flight.discard(lease.group_id)
                if rng.random() < 0.2:
                    await transport.nack(lease)
                else:
                    order.setdefault(lease.group_id, []).append(lease.seq)
                    await transport.ack(lease)
                    acked.append(lease.seq)

        await transport.publish("warm-up", Event())
        warm = await transport.claim("w", 60)
        assert warm is not None
        await transport.ack(warm)
        await on_engine(transport, lambda conn: conn.execute(FORCED_ROLLBACK))

        await asyncio.gather(
            *(publisher(f"g{g}") for g in range(GROUPS)),
            *(worker(f"worker-{n}") for n in range(TASKS)),
        )
        all_seqs = sorted(seq for seqs in published.values() for seq in seqs)
        assert len(all_seqs) == GROUPS * PER_GROUP
        assert sorted(acked) == all_seqs, "lost or doubly acked messages"
        for group, seqs in published.items():
            assert order[group] == seqs, f"group {group} acked out of order"
        assert rollbacks > 0, "the forced rollbacks never happened"
        assert sum(delivered.values()) >= len(all_seqs)
        assert await transport.claim("w", 60) is None
        await transport.close()

    run(main())


def test_claim_cancelled_while_waiting_for_the_lock_returns_at_once_and_takes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"

    async def main() -> None:
        url = f"sqlite:///{path}"
        async with open_async_transport(url, busy_timeout=120_000) as transport:
            seq = await transport.publish("g", Event(n=1))
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            task = asyncio.create_task(transport.claim("w", visibility=60))
            # The claim's BEGIN IMMEDIATE now waits on the driver thread for the blocker's
            # lock (for up to two minutes). Cancelling must not wait for that.
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
            assert blocker.in_transaction, "the cancelled claim waited for the lock"
            blocker.execute("ROLLBACK")
            blocker.close()
            lease = await transport.claim("w2", visibility=60)
            assert lease is not None
            assert (lease.seq, lease.attempt) == (seq, 1), "the cancelled claim took a lease"
            await transport.ack(lease)
            assert await transport.claim("w2", visibility=60) is None

    run(main())


@pytest.mark.parametrize("yields", range(12))
def test_claim_cancelled_at_any_point_leaves_a_consistent_queue(
    tmp_path: Path, yields: int
) -> None:
    clock = ManualClock(1_000_000.0)

    async def main() -> None:
        async with open_async_transport(f"sqlite:///{tmp_path / 'q.db'}", clock=clock) as transport:
            seq = await transport.publish("g", Event(n=1))
            await transport.publish("g", Event(n=2))
            task = asyncio.create_task(transport.claim("cancelled", visibility=10))
            for _ in range(yields):
                await asyncio.sleep(0)
            task.cancel()
            try:
                taken: Lease[Event] | None = await task
            except asyncio.CancelledError:
                taken = None
            # Whatever happened, the next operation works. Either the cancelled claim
            # returned its lease, or the lease was given back at once, as never taken.
            lease = await transport.claim("next", visibility=10)
            if taken is not None:
                assert lease is None, "two leases on one group"
                lease = taken
            else:
                assert lease is not None, "a cancelled claim left a lease nobody holds"
                assert (lease.seq, lease.attempt) == (seq, 1)
            await transport.ack(lease)
            with pytest.raises(LeaseLost):
                await transport.ack(lease)

    run(main())


def test_at_full_the_async_twin_brackets_lease_moves_as_the_sync_twin_does(tmp_path: Path) -> None:
    # One engine runs both twins, so both have one power-loss behaviour (test_durability).
    async def main() -> list[str]:
        transport = open_async_transport(f"sqlite:///{tmp_path / 'q.db'}", synchronous="full")
        assert isinstance(transport, AsyncSqliteTransport)
        async with transport:
            await transport.publish("g", Event(n=1))
            seen: list[str] = []
            await on_engine(transport, lambda conn: conn.set_trace_callback(seen.append))
            lease = await transport.claim("w", visibility=60)
            assert lease is not None
            lease = await transport.extend(lease, 60)
            await transport.nack(lease)
            return seen

    statements = [s.strip().lower() for s in asyncio.run(main())]
    assert statements.count("pragma synchronous = normal") == 3, statements
    assert statements.count("pragma synchronous = full") == 3, statements


def test_sync_and_async_transports_share_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with open_transport(url) as sync:
        seqs = [sync.publish("g", Event(n=n)) for n in range(3)]

        async def main() -> list[int]:
            got = []
            async with open_async_transport(url) as transport:
                while (lease := await transport.claim("async-worker", 30)) is not None:
                    got.append(lease.seq)
                    await transport.ack(lease)
                await transport.publish("back", Event(n=9))
            return got

        assert asyncio.run(main()) == seqs
        lease = sync.claim("sync-worker", 30)
        assert lease is not None
        assert (lease.group_id, lease.event.n) == ("back", 9)


def held_by(db: Path, worker_id: str) -> None:
    """Block the calling thread until another connection sees ``worker_id`` hold a lease."""
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        deadline = time.monotonic() + 30
        while not conn.execute("SELECT 1 FROM groups WHERE locked_by = ?", (worker_id,)).fetchall():
            assert time.monotonic() < deadline, "the claim never leased"
            time.sleep(0.001)


# Where the claim is cancelled: after this many turns of the loop, or once the store has
# leased the message and before the loop has heard so ("leased": the loop is held still
# until another connection sees the lease).
POINTS: list[int | str] = [*range(8), "leased"]


@pytest.mark.parametrize("synchronous", ["extra", "normal"])
@pytest.mark.parametrize("point", POINTS)
def test_a_cancelled_claim_gives_its_message_back_at_once_with_its_delivery_uncounted(
    tmp_path: Path, synchronous: str, point: int | str
) -> None:
    # At extra every claim runs on the engine's thread (its commit flushes); at normal it
    # runs on the loop unless the thread is busy, which the publish just before it makes
    # likelier to vary with the point.
    db = tmp_path / "q.db"

    async def main() -> None:
        url = f"sqlite:///{db}?synchronous={synchronous}"
        async with open_async_transport(url) as transport:
            seq = await transport.publish("g", Event(n=1))
            task = asyncio.create_task(transport.claim("cancelled", visibility=60))
            if point == "leased":
                await asyncio.sleep(0)  # the claim starts, and is handed over or done
                held_by(db, "cancelled")
            else:
                assert isinstance(point, int)
                for _ in range(point):
                    await asyncio.sleep(0)
            task.cancel()
            try:
                taken: Lease[Event] | None = await task
            except asyncio.CancelledError:
                taken = None
            if point == "leased" and synchronous == "extra":
                assert taken is None, "the claim was not cancelled after the store leased"
            # No wait and a long visibility: only a lease given back at once is claimable.
            lease = await transport.claim("next", visibility=60)
            if taken is not None:
                assert lease is None, "two leases on one group"
                lease = taken
            else:
                assert lease is not None, "a cancelled claim left a lease nobody holds"
                assert (lease.seq, lease.attempt) == (seq, 1), "the delivery was counted"
            await transport.ack(lease)
        # Closing waited for every give-back: nothing is left leased.
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM groups").fetchall() == [(0,)]

    run(main())


def test_close_gives_back_the_lease_of_a_claim_cancelled_just_before(tmp_path: Path) -> None:
    db = tmp_path / "q.db"

    async def main() -> None:
        async with open_async_transport(f"sqlite:///{db}?synchronous=extra") as transport:
            await transport.publish("g", Event(n=1))
            task = asyncio.create_task(transport.claim("cancelled", visibility=60))
            await asyncio.sleep(0)
            held_by(db, "cancelled")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        async with open_async_transport(f"sqlite:///{db}") as reopened:
            lease = await reopened.claim("next", visibility=60)
            assert lease is not None, "close left the cancelled claim's lease to lapse"
            assert lease.attempt == 1

    run(main())
