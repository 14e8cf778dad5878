"""The async twin's own cases: close() from another task wakes a waiting claim, and a
cancelled claim leaves no lease behind, even when cancelled while its script runs."""

from __future__ import annotations

import asyncio

import pytest

from transports_core import Event, TransportError, open_async_transport


def test_close_from_another_task_wakes_a_waiting_claim(queue_url: str) -> None:
    async def main() -> None:
        transport = open_async_transport(queue_url)
        waiting = asyncio.ensure_future(transport.claim("w", 30, wait=20))
        await asyncio.sleep(0.2)
        await transport.close()
        assert await asyncio.wait_for(waiting, 5) is None

    asyncio.run(main())


def test_cancelled_claims_leave_no_lease(queue_url: str) -> None:
    async def main() -> None:
        async with open_async_transport(queue_url) as transport:
            await transport.publish_many([(f"g{i}", Event(n=i), 0) for i in range(40)])
            # Cancel claims at every point of their flight: before, during and after the
            # script; a lease the caller never saw is given back at once.
            for delay in (0, 0.0001, 0.0003, 0.001, 0.002):
                claim = asyncio.ensure_future(transport.claim("w", 60))
                await asyncio.sleep(delay)
                claim.cancel()
                try:
                    lease = await claim
                except asyncio.CancelledError:
                    continue
                assert lease is not None
                await transport.ack(lease)
            await asyncio.sleep(0.2)  # the give-backs run in the background
            stats = await transport.stats()  # type: ignore[attr-defined]
            assert stats.in_flight == 0

    asyncio.run(main())


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
