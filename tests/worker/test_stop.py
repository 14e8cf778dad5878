"""Stopping an `AsyncWorker` cancels each of its claims under way once, and what they
leased is given back. A driver that is
cancelled in the middle of a statement takes a moment to cancel it on the server too
(psycopg sends the server a cancel request and waits for its answer); a second
cancellation in that moment leaves the connection in an unknown state, which psycopg
then closes with a warning. The claims here stand for such a driver: each waits until
cancelled, then winds down for a while, and notes a cancellation that interrupts it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, TransportAdmin, open_async_transport, open_transport
from transports_worker import AsyncContext, AsyncWorker
from transports_worker.testing._support import PATIENCE, RunningWorker, wait_for

WIND_DOWN = 0.5  # how long a cancelled claim takes to wind down


class Stubborn:
    """An async transport (over a real one) whose claims block until cancelled and
    then wind down for `WIND_DOWN` seconds, as a driver cancelling its statement does."""

    def __init__(self, inner: Any, waiting: threading.Event, interrupted: list[str]) -> None:
        self._inner, self._waiting, self._interrupted = inner, waiting, interrupted

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        return await self._stall("claim")

    async def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        return await self._stall("claim_many")

    async def _stall(self, name: str) -> Any:
        self._waiting.set()
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            try:
                await asyncio.sleep(WIND_DOWN)
            except asyncio.CancelledError:
                self._interrupted.append(name)
            raise
        raise AssertionError("not reached")


async def _handle(event: Event, ctx: AsyncContext[Event]) -> None:
    raise AssertionError("no message is ever claimed")


@pytest.mark.parametrize("batch", [True, False], ids=["batches", "single claims"])
@pytest.mark.parametrize("stops", [1, 2], ids=["drain", "drain, then hand back"])
def test_each_claim_under_way_is_cancelled_once(tmp_path: Path, batch: bool, stops: int) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    waiting = threading.Event()
    interrupted: list[str] = []
    worker = AsyncWorker(
        lambda: Stubborn(open_async_transport(url), waiting, interrupted),
        _handle,
        concurrency=2,
        batch=batch,
        handle_signals=False,
        hooks=[],
    )
    running = RunningWorker(worker)
    wait_for(waiting, "a claim under way")
    for _ in range(stops):
        worker.stop()
    assert running.join(PATIENCE) == 0
    assert interrupted == [], "a claim's wind-down was cancelled again"


def _noting(delivered: threading.Event) -> Callable[[Event, AsyncContext[Event]], Awaitable[None]]:
    async def handle(event: Event, ctx: AsyncContext[Event]) -> None:
        delivered.set()

    return handle


@pytest.mark.slow
def test_a_worker_stopped_while_it_claims_leaves_no_lease_behind(queue_url: str) -> None:
    """Workers stopped right as they deliver, ten times over: each stop cancels the
    batch claims under way, and whatever they leased is given back, so no group is left
    in flight until its lease lapses (it was, now and then, before core gave back what a
    cancelled ``claim_many`` leased)."""
    with open_transport(queue_url) as store:
        assert isinstance(store, TransportAdmin)
        store.publish_many([(f"g{n % 9}", Event(n=n), 0) for n in range(600)])
        for _ in range(10):
            delivered = threading.Event()
            worker = AsyncWorker(
                queue_url,
                _noting(delivered),
                concurrency=4,
                visibility=60,
                handle_signals=False,
                hooks=[],
            )
            running = RunningWorker(worker)
            wait_for(delivered, "a delivery")
            worker.stop()
            # 0, or 75 when a claim came back as the worker stopped and was handed back.
            assert running.join(PATIENCE) in (0, 75)
            held = [g.group_id for g in store.groups(20) if g.state == "in_flight"]
            assert held == [], f"left leased by a stopped worker: {held}"
