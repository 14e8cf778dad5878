"""What the children of the batch crash test (`tests.test_batch_crash`) run: a worker that
leases with ``claim_many`` and settles with ``settle_many`` or ``ack_many``, writing to its
own log what it holds and what it is settling, so that the parent, which SIGKILLs it,
knows which batch was in flight. Imports only core, so that a spawned child starts fast.

Each log line is one ``os.write`` to a file opened for appending: a SIGKILL ends the
process, not the machine, so what was written is in the page cache and the parent reads
it; no fsync is needed. A line is written before a settle is sent and after each call
returns, so a kill loses at most the line of the call in progress. Times are
``time.time()``, the clock the transports stamp leases with, so they compare with
``Lease.expires_at``. Lines (fields separated by spaces):

* ``C batch returned_at seq:attempt:group:n:expires_at ...``: ``claim_many`` returned
  these leases;
* ``S? batch sent_at seq:attempt:action ...``: ``settle_many`` (or ``ack_many``) is about
  to settle these (a lease of the batch left out is walked away from, to lapse);
* ``S batch returned_at seq ...``: it returned, with the seqs reported stale.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

from tests._children import Awaited
from transports_core import Settlement, open_async_transport, open_transport

# Seconds a chaos worker's leases last: long beside a batch's few milliseconds, short
# enough that the leases the kills leave behind lapse soon.
VISIBILITY = 2.0
# A nack parks its message this long: longer than the time between a kill and the
# parent's look at the store, so that a nack that took effect is seen parked.
NACK_DELAY = 3.0
DRAIN_VISIBILITY = 30.0


def run(
    url: str, name: str, log: str, seed: int | None, twin: str, start: Any, announce: Any
) -> None:
    """`chaos` on the ``twin`` ("sync" or "async"), once its transport is open and every
    worker of the round is at ``start`` (a barrier), so that none of them has the queue
    to itself while the others are still starting, sending a byte on ``announce`` (the
    sending end of a pipe) just before each settle call. A ``seed`` of None runs
    `drain_all` instead, and then ``start`` and ``announce`` are None."""
    if twin == "sync":
        with open_transport(url) as transport:
            _work(transport, name, log, seed, start, announce)
        return
    loop = asyncio.new_event_loop()
    async_transport = open_async_transport(url)
    try:
        loop.run_until_complete(async_transport.__aenter__())
        _work(Awaited(loop, async_transport), name, log, seed, start, announce)
    finally:
        loop.run_until_complete(async_transport.close())
        loop.close()


def _work(transport: Any, name: str, log: str, seed: int | None, start: Any, announce: Any) -> None:
    if start is not None:
        start.wait(60)
    if seed is None:
        drain_all(transport, name, log)
    else:
        chaos(transport, name, log, seed, announce)


def _writer(log: str) -> Any:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(*fields: object) -> None:
        os.write(fd, (" ".join(map(str, fields)) + "\n").encode())

    return note


def _claimed(note: Any, batch: str, leases: list[Any]) -> None:
    items = [f"{x.seq}:{x.attempt}:{x.group_id}:{x.event.n}:{x.expires_at!r}" for x in leases]
    note("C", batch, repr(time.time()), *items)


def chaos(transport: Any, name: str, log: str, seed: int, announce: Any) -> None:
    """Lease batches of 1 to 50 and settle each: mostly acks, some nacks (parked for
    `NACK_DELAY`), a few buries, and now and then a lease walked away from. Runs until
    killed."""
    rng = random.Random(seed)
    note = _writer(log)
    for count in range(10**9):
        batch = f"{name}.{count}"
        leases = transport.claim_many(name, VISIBILITY, rng.randint(1, 50), wait=0.5)
        if not leases:
            continue
        _claimed(note, batch, leases)
        if rng.random() < 0.3:  # all acks, through ack_many
            items = [Settlement(lease) for lease in leases]
        else:
            items = []
            for lease in leases:
                roll = rng.random()
                if roll < 0.8:
                    items.append(Settlement(lease))
                elif roll < 0.9:
                    items.append(Settlement(lease, "nack", delay=NACK_DELAY))
                elif roll < 0.95:
                    items.append(Settlement(lease, "bury", reason=f"r{lease.seq}"))
                # else: walked away from; its lease lapses
        if not items:
            continue
        fields = [f"{s.lease.seq}:{s.lease.attempt}:{s.action}" for s in items]
        note("S?", batch, repr(time.time()), *fields)
        announce.send_bytes(b"s")
        if all(s.action == "ack" for s in items) and rng.random() < 0.5:
            lost = transport.ack_many([s.lease for s in items])
        else:
            lost = transport.settle_many(items)
        note("S", batch, repr(time.time()), *(x.lease.seq for x in lost))


def drain_all(transport: Any, name: str, log: str) -> None:
    """Lease and ack batches of 50 until the queue holds nothing but dead letters,
    waiting out the leases and parks the kills left behind."""
    note = _writer(log)
    for count in range(10**9):
        batch = f"{name}.{count}"
        leases = transport.claim_many(name, DRAIN_VISIBILITY, 50, wait=0.5)
        if not leases:
            stats = transport.stats()
            if stats.ready + stats.in_flight + stats.parked + stats.delayed == 0:
                return
            continue
        _claimed(note, batch, leases)
        note("S?", batch, repr(time.time()), *(f"{x.seq}:{x.attempt}:ack" for x in leases))
        lost = transport.ack_many(leases)
        note("S", batch, repr(time.time()), *(x.lease.seq for x in lost))
