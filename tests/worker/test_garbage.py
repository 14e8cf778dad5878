"""A delivery leaves no reference cycles behind: a worker makes several objects per
delivery, and cycles among them would pile up until the cyclic collector ran, which then
pauses every thread for a time that grows with the heap. Run on SQLite, whose retries
under contention are covered too."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from transports_core import Event, open_transport
from transports_worker import AsyncContext, AsyncWorker, Context, Delivery, Hooks, Outcome, Worker

DELIVERIES = 300


class _Count(Hooks):
    def __init__(self, total: int) -> None:
        self.total, self.done, self.all = total, 0, threading.Event()

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        self.done += 1
        if self.done >= self.total:
            self.all.set()


def _handle(event: Event, ctx: Context[Event]) -> None:
    pass


async def _ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
    pass


def _drain(url: str, flavour: str, total: int) -> None:
    # Two slots: their handles contend for SQLite's write lock, so the backend's retries
    # on "database is locked" run too (each kept its caught error in a cycle once).
    count = _Count(total)
    if flavour == "sync":
        worker = Worker(url, _handle, hooks=[count], handle_signals=False, concurrency=2)
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert count.all.wait(60)
        worker.stop()
        thread.join(60)
        return

    async def main() -> None:
        aworker = AsyncWorker(url, _ahandle, hooks=[count], handle_signals=False, concurrency=2)
        running = asyncio.ensure_future(aworker.run())
        while not count.all.is_set():
            await asyncio.sleep(0.01)
        aworker.stop()
        await running

    asyncio.run(main())


def _threads_ended(count: int) -> None:
    """Wait until the worker's threads (a closed handle's among them) have ended: what
    one leaves behind while it still runs is not garbage yet, and counts once it ends."""
    deadline = time.monotonic() + 30
    while threading.active_count() > count:
        assert time.monotonic() < deadline, f"threads still running: {threading.enumerate()}"
        time.sleep(0.01)


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_deliveries_leave_no_garbage_cycles(
    tmp_path: Path, flavour: str, collector_off: None
) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as transport:
        transport.publish_many([(f"g{i % 7}", Event(n=i), 0) for i in range(DELIVERIES + 50)])
    threads = threading.active_count()
    _drain(url, flavour, 10)  # a short run first: what starting and stopping leave
    _threads_ended(threads)
    overhead = gc.collect()
    _drain(url, flavour, DELIVERIES)
    _threads_ended(threads)
    # One object per delivery would be 300 more; a cycle among a delivery's own objects
    # leaves several.
    assert gc.collect() - overhead < DELIVERIES // 10
