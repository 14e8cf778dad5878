"""What the process tests run in their children: imports only core, so that a spawned child
starts fast. Journal lines: ``seq group n attempt start_ns end_ns``, from the system-wide
monotonic clock, written just after claim returns and just before ack."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from transports_core import open_transport


def work(url: str, worker_id: str, journal: str, start: Any = None) -> None:
    """Claim and ack until three waits in a row find nothing; with ``start`` (a barrier of
    the workers), only once every worker has started, so that one quick child does not
    drain the queue before the others have spawned."""
    lines = []
    with open_transport(url) as transport:
        if start is not None:
            start.wait(60)
        idle = 0
        while idle < 3:
            lease = transport.claim(worker_id, 30.0, wait=0.3)
            if lease is None:
                idle += 1
                continue
            idle = 0
            began = time.monotonic_ns()
            n = lease.event.n
            done = time.monotonic_ns()
            lines.append(f"{lease.seq} {lease.group_id} {n} {lease.attempt} {began} {done}\n")
            transport.ack(lease)
    Path(journal).write_text("".join(lines))


def hold(url: str, visibility: float, report: str) -> None:
    """Claim one message, say so, then hang on to it until killed."""
    with open_transport(url) as transport:
        lease = transport.claim("holder", visibility, wait=10)
        assert lease is not None
        info = {"seq": lease.seq, "attempt": lease.attempt, "expires_at": lease.expires_at}
        Path(report + ".tmp").write_text(json.dumps(info))
        os.replace(report + ".tmp", report)
        time.sleep(600)


def churn(url: str, name: str, journal: str, stop: str) -> None:
    """Publish and claim+ack until ``stop`` exists, riding out a server that dies and comes
    back. Each line is written only once its call returned: ``P seq group n`` for a
    publish, ``A seq`` for an ack, ``U seq`` for an ack whose outcome is unknown (it may
    have taken effect); a publish whose outcome is unknown writes nothing."""
    from transports_core import Event, OutcomeUnknown, TransportError

    n = 0
    with open(journal, "a", buffering=1) as out, open_transport(url) as transport:
        while not os.path.exists(stop):
            group = f"{name}-{n % 5}"
            try:
                seq = transport.publish(group, Event(n=n))
                out.write(f"P {seq} {group} {n}\n")
                n += 1
                lease = transport.claim(name, 2.0)
                if lease is not None:
                    try:
                        transport.ack(lease)
                    except OutcomeUnknown:
                        out.write(f"U {lease.seq}\n")
                        raise
                    out.write(f"A {lease.seq}\n")
            except TransportError:
                time.sleep(0.05)  # the server is down: the next call reconnects
