"""The async twin: what only tasks can do to a blocked claim (cancel it, close the
transport under it). Its surface is checked against the sync one in ``tests/test_twins.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from transports_core import (
    Event,
    open_async_transport,
)
from transports_postgres import AsyncPostgresTransport


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
