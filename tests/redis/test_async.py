"""The async twin's own cases: close() from another task wakes a waiting claim, and a
cancelled claim leaves no lease behind, even when cancelled after the server leased: its
message is claimable again at once, its delivery uncounted."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from transports_core import Event, TransportError, open_async_transport
from transports_redis import _ops as ops

from .server import with_queue


def test_close_from_another_task_wakes_a_waiting_claim(queue_url: str) -> None:
    async def main() -> None:
        transport = open_async_transport(queue_url)
        waiting = asyncio.ensure_future(transport.claim("w", 30, wait=20))
        await asyncio.sleep(0.2)
        await transport.close()
        assert await asyncio.wait_for(waiting, 5) is None

    asyncio.run(main())


# Cancel points: after this many turns of the event loop (0: before the claim starts),
# then as many times after the server leased, the reply not yet read.
TURNS = 12
AFTER_LEASED = 10


async def _until_leased(raw: redis.Redis, busy: str, group: str) -> None:
    """Return once the server has leased ``group``'s head. The check blocks the event
    loop, so the claim cannot read its reply meanwhile: only the loop's turns between
    checks let it send its script."""
    deadline = time.monotonic() + 10
    while raw.zscore(busy, group) is None:
        assert time.monotonic() < deadline, "the claim never reached the server"
        await asyncio.sleep(0)


def test_a_cancelled_claim_gives_its_message_back_at_once_uncounted(
    server_queue: tuple[str, str], raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, queue = server_queue
    busy = ops.key_prefix(queue) + "busy"
    given_back: list[bool] = []

    class Unclaim(ops.Unclaim):
        __slots__ = ()

        def done(self, reply: Any, now: float | None) -> bool:
            given_back.append(super().done(reply, now))
            return given_back[-1]

    monkeypatch.setattr(ops, "Unclaim", Unclaim)

    async def main() -> None:
        async with (
            open_async_transport(with_queue(url, queue)) as transport,
            open_async_transport(with_queue(url, queue)) as other,
        ):
            for case in range(TURNS + AFTER_LEASED):
                group = f"g{case}"
                await transport.publish(group, Event(n=case))
                claim = asyncio.ensure_future(transport.claim("w", 60))
                if case < TURNS:
                    for _ in range(case):
                        await asyncio.sleep(0)
                else:
                    await _until_leased(raw, busy, group)
                claim.cancel()
                try:
                    lease = await claim
                except asyncio.CancelledError:
                    lease = None
                if lease is not None:  # it finished before the cancel landed
                    assert lease.attempt == 1
                    await transport.ack(lease)
                    continue
                # Claimable at once: woken by the give-back, long before the 60 s lease
                # the cancelled claim may have taken could lapse; and with the same
                # attempt number, so that delivery was not counted.
                started = time.monotonic()
                again = await other.claim("w2", 60, wait=10)
                assert again is not None, case
                assert time.monotonic() - started < 5, case
                assert (again.group_id, again.attempt) == (group, 1), case
                await other.ack(again)
            stats = await other.stats()  # type: ignore[attr-defined]
            assert (stats.ready, stats.in_flight) == (0, 0)

    asyncio.run(main())
    # The claims cancelled after the server leased gave their leases back, while current.
    assert len(given_back) >= AFTER_LEASED // 2
    assert all(given_back)


def test_a_claim_begun_before_close_finishes_and_one_begun_after_is_refused(
    queue_url: str,
) -> None:
    async def main() -> None:
        async with open_async_transport(queue_url) as setup:
            await setup.publish("g", Event(n=1))
        for wait in (0, 1):
            transport = open_async_transport(queue_url)
            # Its task has started (it is past its first await) when close() runs, as a
            # claim handed to SQLite's thread has: it finishes like any call in flight.
            begun = asyncio.ensure_future(transport.claim("w", 30, wait=wait))
            await asyncio.sleep(0)
            await transport.close()
            lease = await asyncio.wait_for(begun, 10)
            assert lease is not None
            assert lease.event.n == 1
            with pytest.raises(TransportError, match="is closed"):
                await transport.claim("w", 30, wait=wait)
            async with open_async_transport(queue_url) as other:
                await other.nack(lease)

    asyncio.run(main())
