"""A worker process for the torture tests: run as a script, it works a queue at random and
writes what it is about to do and what it did to its own journal, one line per step.

    python _worker.py chaos DB JOURNAL SEED NAME GROUPS
    python _worker.py drain DB JOURNAL SEED NAME
    python _worker.py hold DB                      # takes the write lock, writes, waits
    python _worker.py contend DB NAME COUNT        # publishes COUNT events, then exits

Journal lines are ``KIND MONOTONIC_NS FIELDS...``. A line is written (one write call,
flushed) before and after each transport call, so a SIGKILL loses at most the line of the
call in progress: ``?`` kinds say "about to", the others "done". Wall times are
``time.time()``, the transport's own clock, so they compare with lease expiries.
"""

from __future__ import annotations

import random
import sys
import time
from typing import TextIO

from transports_core import Event, Lease, LeaseLost, TransportError, open_transport
from transports_sqlite import SqliteTransport, _ops, _sql
from transports_sqlite._url import parse_url

Journal = TextIO


def note(journal: Journal, kind: str, *fields: object) -> None:
    journal.write(" ".join([kind, str(time.monotonic_ns()), *map(str, fields)]) + "\n")
    journal.flush()


def settle(
    transport: SqliteTransport[Event], journal: Journal, lease: Lease[Event], rng: random.Random
) -> None:
    """Do one random thing with a lease, as a handler would."""
    fence = (lease.seq, lease.attempt)
    roll = rng.random()
    try:
        if roll < 0.12:  # work longer: extend, then ack
            visibility = rng.uniform(0.2, 0.8)
            note(journal, "E?", *fence, repr(visibility), time.time())
            lease = transport.extend(lease, visibility)
            note(journal, "E", *fence, repr(lease.expires_at))
            roll = 0.0
        if roll < 0.6:
            note(journal, "A?", *fence, time.time())
            transport.ack(lease)
            note(journal, "A", *fence)
        elif roll < 0.72:
            note(journal, "K?", *fence, 0, time.time())
            transport.nack(lease)
            note(journal, "K", *fence)
        elif roll < 0.9:
            delay = rng.uniform(0.02, 0.2)
            note(journal, "K?", *fence, repr(delay), time.time())
            transport.nack(lease, delay=delay)
            note(journal, "K", *fence)
        # else: walk away; the lease lapses and the message is delivered again
    except LeaseLost:
        note(journal, "L", *fence)


def claim(
    transport: SqliteTransport[Event], journal: Journal, name: str, visibility: float
) -> Lease[Event] | None:
    note(journal, "C?")
    lease = transport.claim(name, visibility)
    if lease is None:
        note(journal, "N")
        return None
    note(
        journal,
        "C",
        lease.seq,
        lease.group_id,
        lease.attempt,
        repr(lease.expires_at),
        repr(visibility),
        lease.event.id,
    )
    return lease


def chaos(db: str, journal: Journal, seed: int, name: str, groups: int) -> None:
    rng = random.Random(seed)
    with open_transport(f"sqlite:///{db}") as transport:
        assert isinstance(transport, SqliteTransport)
        count = 0
        while True:
            if rng.random() < 0.3:
                count += 1
                event_id = f"{name}.{count}"
                group = f"g{rng.randrange(groups)}"
                note(journal, "P?", event_id, group)
                seq = transport.publish(group, Event(id=event_id), priority=rng.randrange(3))
                note(journal, "P", event_id, group, seq)
                continue
            lease = claim(transport, journal, name, rng.uniform(0.2, 0.8))
            if lease is None:
                time.sleep(0.005)
            else:
                settle(transport, journal, lease, rng)


def drain(db: str, journal: Journal, seed: int, name: str) -> None:
    """Ack everything, waiting out the leases of killed workers, until the queue is empty."""
    with open_transport(f"sqlite:///{db}") as transport:
        assert isinstance(transport, SqliteTransport)
        while True:
            lease = claim(transport, journal, name, 5.0)
            if lease is not None:
                note(journal, "A?", lease.seq, lease.attempt, time.time())
                transport.ack(lease)
                note(journal, "A", lease.seq, lease.attempt)
                continue
            stats = transport.stats()
            if stats.ready + stats.in_flight + stats.parked == 0:
                return
            time.sleep(0.02)


def hold(db: str) -> None:
    """Take the write lock through the transport's own runner, write half a batch, say so
    on stdout, and wait to be killed."""
    transport: SqliteTransport[Event] = SqliteTransport(parse_url(f"sqlite:///{db}", {}))
    now = time.time()
    rows = [(10_000 + i, f"half-{i}", 0, '{"id":"half"}', None, None, now) for i in range(50)]

    def steps(now: float) -> _ops.Steps[None]:
        yield _ops.Stmt(_sql.INSERT_ROW, many=rows)
        print("holding", flush=True)
        time.sleep(600)

    transport._run(_ops.Plan(steps))


def contend(db: str, name: str, count: int) -> None:
    with open_transport(f"sqlite:///{db}", busy_timeout=20000) as transport:
        print("started", flush=True)
        for i in range(count):
            transport.publish(name, Event(id=f"{name}.{i}"))
        lease = transport.claim(name, 30)
        assert lease is not None
        transport.ack(lease)


def main(argv: list[str]) -> None:
    mode, db, *rest = argv
    if mode == "hold":
        hold(db)
        return
    if mode == "contend":
        contend(db, rest[0], int(rest[1]))
        return
    journal_path, seed, name, *more = rest
    with open(journal_path, "a", encoding="utf-8") as journal:
        try:
            if mode == "chaos":
                chaos(db, journal, int(seed), name, int(more[0]))
            else:
                drain(db, journal, int(seed), name)
        except (TransportError, Exception) as exc:  # any error a caller sees fails the test
            note(journal, "X", repr(exc).replace("\n", " "))
            raise


if __name__ == "__main__":
    main(sys.argv[1:])
