"""What the child processes of the PostgreSQL process tests run (importable by spawn)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg

from transports_core import open_transport

VISIBILITY = 60.0
SERVER_NOW = "SELECT date_part('epoch', clock_timestamp())"


def drain(url: str, worker_id: str, journal: str, idle_wait: float) -> None:
    """Claim and ack until a claim waits ``idle_wait`` s in vain. Journal, per message:
    ``seq group n attempt claimed_at acking_at`` on the server's clock (the lease's start,
    and a reading just before the ack is sent)."""
    lines = []
    clock = psycopg.connect(url.partition("?")[0], autocommit=True)
    with open_transport(url) as transport:
        while (lease := transport.claim(worker_id, VISIBILITY, wait=idle_wait)) is not None:
            claimed_at = lease.expires_at - VISIBILITY
            row = clock.execute(SERVER_NOW).fetchone()
            assert row is not None
            lines.append(
                f"{lease.seq} {lease.group_id} {lease.event.n} {lease.attempt} "
                f"{claimed_at!r} {row[0]!r}\n"
            )
            transport.ack(lease)
    clock.close()
    Path(journal).write_text("".join(lines))


def drain_many(
    url: str, worker_id: str, journal: str, limit: int, idle_wait: float, start: Any
) -> None:
    """`drain` in batches, once every worker is at ``start`` (a barrier): ``claim_many``
    of ``limit`` until one waits ``idle_wait`` s in vain, each batch acked with
    ``ack_many`` (no lease of it may be lost). Journal, per message: ``seq group n
    attempt got_at acking_at worker`` on the server's clock, read just after the batch
    came back (its leases began before) and just before its ack is sent (they end after).
    Not the lease's own start, as in `drain`: a batch statement takes its snapshot, and
    so its leases, a planning time after the statement's timestamp."""
    lines = []
    clock = psycopg.connect(url.partition("?")[0], autocommit=True)

    def now() -> float:
        row = clock.execute(SERVER_NOW).fetchone()
        assert row is not None
        return float(row[0])

    with open_transport(url) as transport:
        start.wait(60)
        while leases := transport.claim_many(worker_id, VISIBILITY, limit, wait=idle_wait):
            got_at, acking_at = now(), now()
            for lease in leases:
                lines.append(
                    f"{lease.seq} {lease.group_id} {lease.event.n} {lease.attempt} "
                    f"{got_at!r} {acking_at!r} {worker_id}\n"
                )
            assert transport.ack_many(leases) == []
    clock.close()
    Path(journal).write_text("".join(lines))


def hold(url: str, ready: str) -> None:
    """Claim one message with a short lease, say so, and hang until killed."""
    with open_transport(url) as transport:
        lease = transport.claim("doomed", 1.0, wait=10)
        assert lease is not None
        Path(ready).write_text(f"{lease.seq} {lease.attempt} {os.getpid()}\n")
        while True:
            time.sleep(1)


def _drained(transport: object) -> bool:
    from transports_core import TransportAdmin, TransportError

    assert isinstance(transport, TransportAdmin)
    try:
        stats = transport.stats()
    except TransportError:
        return False
    return (stats.ready, stats.in_flight, stats.parked) == (0, 0, 0)


def resilient(url: str, worker_id: str, journal: str, stop: str) -> None:
    """Claim and ack through server restarts: a failed call is tried again a moment later.
    Journal, per message: ``acked SEQ`` once an ack returned, ``unknown SEQ`` when an ack
    raised OutcomeUnknown (it may have taken effect). Ends when ``stop`` exists and a
    claim finds nothing."""
    from transports_core import OutcomeUnknown, TransportError

    # The server may be down or starting when this process starts: opening (which checks
    # the server at once) is tried again too, for as long as a restart can take.
    deadline = time.monotonic() + 60
    while True:
        try:
            transport = open_transport(url)
            break
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with open(journal, "a", buffering=1) as out, transport:
        while True:
            try:
                lease = transport.claim(worker_id, 5.0, wait=0.5)
            except TransportError:
                time.sleep(0.1)
                continue
            if lease is None:
                # A lease whose ack failed still holds its group until it lapses: the work
                # is done only when nothing is ready, in flight or parked.
                if os.path.exists(stop) and _drained(transport):
                    return
                continue
            try:
                transport.ack(lease)
            except OutcomeUnknown:
                out.write(f"unknown {lease.seq}\n")
            except TransportError:
                pass  # nothing was done: the lease lapses and the message comes back
            else:
                out.write(f"acked {lease.seq}\n")


def publish_keys(url: str, keys: int, groups: int, batch: int, start: str, out: str) -> None:
    """Wait for ``start`` to exist, then publish one message for each of ``keys`` keys
    (key ``k{i}`` in group ``g{i % groups}``), one by one (``batch`` 0) or in batches of
    ``batch``, in an order of this process's own; write ``i seq duplicate`` per key."""
    import random

    from transports_core import Duplicate, Event, Message

    order = list(range(keys))
    random.Random(os.getpid()).shuffle(order)
    with open_transport(url) as transport:
        while not Path(start).exists():
            time.sleep(0.001)
        seqs: list[int] = []
        if batch:
            for at in range(0, keys, batch):
                seqs += transport.publish_many(
                    [
                        Message(f"g{i % groups}", Event(n=i), key=f"k{i}")
                        for i in order[at : at + batch]
                    ]
                )
        else:
            seqs = [transport.publish(f"g{i % groups}", Event(n=i), key=f"k{i}") for i in order]
    Path(out).write_text(
        "".join(
            f"{i} {int(s)} {int(isinstance(s, Duplicate))}\n"
            for i, s in zip(order, seqs, strict=True)
        )
    )


def publish_plain(url: str, groups: list[str], count: int, first_n: int) -> None:
    """Publish ``count`` messages round the ``groups``, no delay, numbered from ``first_n``."""
    from transports_core import Event

    with open_transport(url) as transport:
        for i in range(count):
            transport.publish(groups[i % len(groups)], Event(n=first_n + i))
