"""The async twin: what only tasks can do to a blocked claim (cancel it, close the
transport under it). Its surface is checked against the sync one in ``tests/test_twins.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import psycopg
import pytest

from transports_core import Event, Lease, open_async_transport
from transports_core.backend import Claimed
from transports_postgres import AsyncPostgresTransport
from transports_postgres._url import parse_url


def _waiters(raw: psycopg.Connection[Any], schema: str) -> int:
    # The async twin creates its schema on first use: until then, nobody waits.
    if raw.execute("SELECT to_regclass(%s)", (f'"{schema}".waiters',)).fetchone() == (None,):
        return 0
    row = raw.execute(f'SELECT count(*) FROM "{schema}".waiters').fetchone()
    assert row is not None
    return int(row[0])


async def _until(predicate: Any, what: str, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


def test_cancelling_a_blocked_claim_leases_nothing_and_stops_waiting(
    queue_url: str, raw: psycopg.Connection[Any], schema: str
) -> None:

    async def scenario() -> None:
        async with open_async_transport(queue_url) as queue:
            assert isinstance(queue, AsyncPostgresTransport)
            blocked = asyncio.ensure_future(queue.claim("w", 60, wait=60))
            await _until(lambda: _waiters(raw, schema) == 1, "the claim never blocked")
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            await _until(lambda: _waiters(raw, schema) == 0, "still registered as waiting")
            await queue.publish("g", Event(n=1))
            lease = await queue.claim("w2", 60)
            assert lease is not None  # the cancelled claim took no lease
            assert (lease.worker_id, lease.attempt) == ("w2", 1)

    asyncio.run(scenario())


def test_close_from_another_task_wakes_a_blocked_claim(
    queue_url: str, raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    async def scenario() -> None:
        queue = open_async_transport(queue_url)
        assert isinstance(queue, AsyncPostgresTransport)
        queue._recheck = 600.0
        blocked = asyncio.ensure_future(queue.claim("w", 60, wait=60))
        await _until(lambda: _waiters(raw, schema_url[1]) == 1, "the claim never blocked")
        await queue.close()
        assert await asyncio.wait_for(blocked, 10) is None

    asyncio.run(scenario())


def test_a_blocked_async_claim_is_woken_by_a_publish(
    queue_url: str, raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    async def scenario() -> None:
        async with (
            open_async_transport(queue_url) as waiter,
            open_async_transport(queue_url) as publisher,
        ):
            assert isinstance(waiter, AsyncPostgresTransport)
            waiter._recheck = 600.0
            blocked = asyncio.ensure_future(waiter.claim("w", 60, wait=30))
            await _until(lambda: _waiters(raw, schema_url[1]) == 1, "the claim never blocked")
            await publisher.publish("g", Event(n=5))
            lease = await asyncio.wait_for(blocked, 40)
            assert lease is not None
            assert lease.event.n == 5

    asyncio.run(scenario())


class CountingGiveBacks(AsyncPostgresTransport[Event]):
    """The transport, noting each lease it gave back for a cancelled claim."""

    given: list[int]

    async def _give_back(self, claimed: Claimed) -> bool:
        given = await super()._give_back(claimed)
        if given:
            self.given.append(claimed.seq)
        return given


# Where a claim is cancelled: after so many turns of the event loop (before it has sent
# anything, or while it waits for a connection or the reply), or after so many seconds
# (the server has leased, and the reply is on its way or read).
CANCEL_POINTS = [("turns", turns) for turns in range(8)] + [
    ("seconds", step * 0.0005) for step in range(1, 41)
]


def test_a_cancelled_claim_gives_back_at_once_what_the_server_leased(queue_url: str) -> None:
    async def scenario() -> None:
        queue = CountingGiveBacks(parse_url(queue_url, {}))
        queue.given = []
        cancelled = 0
        async with queue, open_async_transport(queue_url) as other:
            await queue.publish("warm", Event(n=-1))  # the pool and schema are ready
            await queue.ack(await _claimed(queue.claim("w", 60)))
            for n, (unit, at) in enumerate(CANCEL_POINTS):
                await queue.publish(f"g{n}", Event(n=n))
                task = asyncio.ensure_future(queue.claim("w", 60))
                if unit == "turns":
                    for _ in range(int(at)):
                        await asyncio.sleep(0)
                else:
                    await asyncio.sleep(at)
                task.cancel()
                try:
                    done = await task
                except asyncio.CancelledError:
                    cancelled += 1
                else:  # it returned before the cancellation landed
                    assert done is not None
                    await queue.ack(done)
                    continue
                again = await other.claim("w2", 60)
                where = f"cancelled after {at} {unit}"
                assert again is not None, f"{where}: the message was not claimable at once"
                assert (again.group_id, again.attempt) == (f"g{n}", 1), where
                await other.ack(again)
        # Both cases were staged: cancelled before the server leased, and after.
        assert 0 < len(queue.given) < cancelled, (len(queue.given), cancelled)

    asyncio.run(scenario())


async def _claimed(call: Awaitable[Lease[Event] | None]) -> Lease[Event]:
    lease = await call
    assert lease is not None
    return lease
