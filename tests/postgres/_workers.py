"""What the child processes of the PostgreSQL process tests run (importable by spawn)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from transports_core import open_transport


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

    with open(journal, "a", buffering=1) as out, open_transport(url) as transport:
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
