"""The worker loop that the process-contention scenario runs in each child process, and
the keyed publisher of the keys-across-processes scenario.

A module of its own so that a spawned child imports only this, the journal and core: not
pytest, hypothesis or the suite. Each child holds every lease it gets for a short random
while (so that a claim that is not exclusive across processes has a window to show it)
and writes one `journal` entry per lease, with the claim and release times.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from threading import Barrier

from transports_core import Duplicate, Event, open_async_transport, open_transport

from .journal import Journal

IDLE_ROUNDS = 20
VISIBILITY = 120.0
HOLD = 0.003  # the longest a worker holds a lease, in seconds


def work(url: str, worker_id: str, journal: str, start: Barrier) -> None:
    hold = random.Random(worker_id)
    with open_transport(url) as transport, Journal(journal) as log:
        start.wait(60)  # all children open first, then all claim at once
        idle = 0
        while idle < IDLE_ROUNDS:
            lease = transport.claim(worker_id, VISIBILITY)
            claimed = time.monotonic_ns()
            if lease is None:
                idle += 1
                time.sleep(0.01)
                continue
            idle = 0
            time.sleep(hold.uniform(0, HOLD))
            log.record(lease, claimed, time.monotonic_ns(), "ack")
            transport.ack(lease)


async def _work_async(url: str, worker_id: str, journal: str, start: Barrier) -> None:
    hold = random.Random(worker_id)
    with Journal(journal) as log:
        async with open_async_transport(url) as transport:
            await transport.claim(worker_id, VISIBILITY, 4)  # connect now (nothing is at 4)
            start.wait(60)
            idle = 0
            while idle < IDLE_ROUNDS:
                lease = await transport.claim(worker_id, VISIBILITY)
                claimed = time.monotonic_ns()
                if lease is None:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                await asyncio.sleep(hold.uniform(0, HOLD))
                log.record(lease, claimed, time.monotonic_ns(), "ack")
                await transport.ack(lease)


def work_async(url: str, worker_id: str, journal: str, start: Barrier) -> None:
    asyncio.run(_work_async(url, worker_id, journal, start))


KEYS_GROUP = "keys"


def publish_keys(url: str, prefix: str, count: int, out: str, start: Barrier) -> None:
    """Publish ``ev(n)`` with key ``prefix-n`` for n below ``count``, all children at once;
    write ``[seq, was it a Duplicate]`` for each n to ``out`` as JSON."""
    with open_transport(url) as transport:
        transport.publish_many([])  # connect now
        start.wait(60)
        got = [transport.publish(KEYS_GROUP, Event(n=n), key=f"{prefix}-{n}") for n in range(count)]
    _write_seqs(out, got)


async def _publish_keys_async(url: str, prefix: str, count: int, out: str, start: Barrier) -> None:
    async with open_async_transport(url) as transport:
        await transport.publish_many([])
        start.wait(60)
        got = [
            await transport.publish(KEYS_GROUP, Event(n=n), key=f"{prefix}-{n}")
            for n in range(count)
        ]
    _write_seqs(out, got)


def publish_keys_async(url: str, prefix: str, count: int, out: str, start: Barrier) -> None:
    asyncio.run(_publish_keys_async(url, prefix, count, out, start))


def _write_seqs(out: str, seqs: list[int]) -> None:
    with open(out, "w") as f:
        json.dump([[int(seq), isinstance(seq, Duplicate)] for seq in seqs], f)
