"""Code run in child processes by the multi-process tests. Kept out of the test modules so
that a spawned child imports only this, the library and the standard library."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from transports_core import Event, open_transport
from transports_sqlite import SqliteTransport

# The queue is empty once the transport has nothing more to hand out and the file has no
# rows left; a claim alone cannot tell "empty" from "every group is leased elsewhere".
REMAINING = "SELECT count(*) FROM messages"


def consume(db: str, worker_id: str, journal: str, ready: Any, go: Any) -> None:
    """Claim and ack until the queue is empty, writing one JSON line per message handled:
    group, seq, attempt, and monotonic_ns() just after the claim and just before the ack."""
    records: list[dict[str, object]] = []
    try:
        _consume(db, worker_id, records, ready, go)
    except BaseException as exc:  # reported through the journal, where the test reads it
        records.append({"worker": worker_id, "error": repr(exc)})
        raise
    finally:
        Path(journal).write_text("".join(json.dumps(r) + "\n" for r in records))


def _consume(
    db: str, worker_id: str, records: list[dict[str, object]], ready: Any, go: Any
) -> None:
    # Durability and lock waits are not under test here. synchronous=normal: an fsync per
    # commit on a busy machine makes the run many times longer. busy_timeout: SQLite's
    # busy handler is not fair, so on a loaded machine one writer can wait out the default
    # 5 s while the others keep taking the lock.
    url = f"sqlite:///{db}?synchronous=normal&busy_timeout=60000"
    with open_transport(url) as t, closing(sqlite3.connect(db)) as look:
        ready.put(worker_id)
        if not go.wait(60):
            raise SystemExit("never told to start")
        deadline = time.monotonic() + 30
        while True:
            if time.monotonic() > deadline:
                raise SystemExit(f"{worker_id}: queue not drained in time")
            lease = t.claim(worker_id, visibility=60)
            if lease is None:
                if look.execute(REMAINING).fetchone()[0] == 0:
                    break
                time.sleep(0.001)
                continue
            claimed = time.monotonic_ns()
            time.sleep(0.0005)  # the handler's work, so that workers overlap
            acking = time.monotonic_ns()
            t.ack(lease)
            records.append(
                {
                    "worker": worker_id,
                    "group": lease.group_id,
                    "seq": lease.seq,
                    "attempt": lease.attempt,
                    "index": lease.event.index,
                    "claimed": claimed,
                    "acking": acking,
                }
            )


def hold_lease(db: str, visibility: float, report: Connection) -> None:
    """Claim one message, report the lease through ``report``, then hang until killed."""
    with open_transport(f"sqlite:///{db}") as t:
        lease = t.claim("doomed", visibility=visibility)
        assert lease is not None
        report.send((lease.seq, lease.group_id, lease.attempt, lease.expires_at))
        time.sleep(120)


def publish_keys(db: str, keys: int, ready: Any, go: Any, seqs: Any) -> None:
    """Publish one message under each of ``keys`` keys in group "g", in a shuffled order
    of its own, once ``go`` is set; put the seqs it got back on ``seqs``."""
    import random

    order = list(range(keys))
    random.shuffle(order)
    with open_transport(f"sqlite:///{db}?synchronous=normal&busy_timeout=60000") as t:
        ready.put(True)
        go.wait(60)
        got = [(f"k{n}", int(t.publish("g", Event(n=n), key=f"k{n}"))) for n in order]
    seqs.put(got)


def claim_waiting(db: str, wait: float, ready: Any, report: Connection) -> None:
    """Say ``ready``, then make one claim that waits up to ``wait`` seconds; report what
    it leased (seq and event, or None) and time.monotonic() just after it returned."""
    with open_transport(f"sqlite:///{db}") as t:
        ready.put("waiting")
        lease = t.claim("waiter", visibility=60, wait=wait)
        returned = time.monotonic()
        report.send((None if lease is None else (lease.seq, lease.event.model_dump()), returned))


def write_and_publish(db: str, first: int, ready: Any) -> None:
    """For n = first, first + 1, ... until killed: in one transaction of its own
    connection, write row n of its own table ``mine`` and publish event n to group "g"
    within it, then commit."""
    with open_transport(f"sqlite:///{db}") as t, closing(sqlite3.connect(db)) as conn:
        assert isinstance(t, SqliteTransport)
        within = t.within(conn)
        ready.put("started")
        n = first
        while True:
            conn.execute("INSERT INTO mine (n) VALUES (?)", (n,))
            within.publish("g", Event(n=n))
            conn.commit()
            n += 1
