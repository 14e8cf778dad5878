"""The worker loop that the process-contention scenario runs in each child process.

A module of its own so that a spawned child imports only this and core, not the suite.
Each child writes one journal line per message: ``seq group n attempt start_ns end_ns``,
where ``start_ns`` is read just after claim returns and ``end_ns`` just before ack, from
the system-wide monotonic clock.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from threading import Barrier

from transports_core import open_async_transport, open_transport

IDLE_ROUNDS = 20
VISIBILITY = 120.0


def work(url: str, worker_id: str, journal: str, start: Barrier) -> None:
    lines = []
    with open_transport(url) as transport:
        start.wait(60)  # all children open first, then all claim at once
        idle = 0
        while idle < IDLE_ROUNDS:
            lease = transport.claim(worker_id, VISIBILITY)
            if lease is None:
                idle += 1
                time.sleep(0.01)
                continue
            idle = 0
            began = time.monotonic_ns()
            n = lease.event.n
            done = time.monotonic_ns()
            lines.append(f"{lease.seq} {lease.group_id} {n} {lease.attempt} {began} {done}\n")
            transport.ack(lease)
    Path(journal).write_text("".join(lines))


async def _work_async(url: str, worker_id: str, journal: str, start: Barrier) -> None:
    lines = []
    async with open_async_transport(url) as transport:
        await transport.claim(worker_id, VISIBILITY, 4)  # connect now (nothing is at 4)
        start.wait(60)
        idle = 0
        while idle < IDLE_ROUNDS:
            lease = await transport.claim(worker_id, VISIBILITY)
            if lease is None:
                idle += 1
                await asyncio.sleep(0.01)
                continue
            idle = 0
            began = time.monotonic_ns()
            n = lease.event.n
            done = time.monotonic_ns()
            lines.append(f"{lease.seq} {lease.group_id} {n} {lease.attempt} {began} {done}\n")
            await transport.ack(lease)
    Path(journal).write_text("".join(lines))


def work_async(url: str, worker_id: str, journal: str, start: Barrier) -> None:
    asyncio.run(_work_async(url, worker_id, journal, start))
