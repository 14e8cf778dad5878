"""What the process tests run in their children, and how their journals are checked:
imports only core, so that a spawned child starts fast. Journal lines: ``seq group n
attempt start_ns end_ns``, from the system-wide monotonic clock, written just after claim
returns and just before ack."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests._children import Awaited
from transports_core import open_async_transport, open_transport


def work(url: str, worker_id: str, journal: str, start: Any = None, pause: float = 0) -> None:
    """Claim and ack until three waits in a row find nothing; with ``start`` (a barrier of
    the workers), only once every worker has started, so that one quick child does not
    drain the queue before the others have spawned; ``pause``: seconds each message
    takes to handle."""
    with open_transport(url) as transport:
        _drain(transport, worker_id, journal, start, pause)


def work_async(url: str, worker_id: str, journal: str, start: Any = None, pause: float = 0) -> None:
    """`work` on the async twin, each call awaited in turn on one event loop."""
    loop = asyncio.new_event_loop()
    transport = open_async_transport(url)
    try:
        loop.run_until_complete(transport.__aenter__())
        _drain(Awaited(loop, transport), worker_id, journal, start, pause)
    finally:
        loop.run_until_complete(transport.close())
        loop.close()


def _drain(transport: Any, worker_id: str, journal: str, start: Any, pause: float) -> None:
    lines = []
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
        time.sleep(pause)
        lines.append(f"{lease.seq} {lease.group_id} {lease.event.n} {lease.attempt} {began} ")
        lines.append(f"{time.monotonic_ns()}\n")
        transport.ack(lease)
    Path(journal).write_text("".join(lines))


def check_journals(
    journals: Iterable[Path],
    published: dict[int, tuple[str, int]],
    skip_groups: Iterable[str] = (),
) -> None:
    """Every published message (seq -> group, n) handled once and none twice, each group's
    in order of n, and no two of a group's messages in hand at once (the lines of
    ``skip_groups``, checked by the caller, left out)."""
    skip = set(skip_groups)
    rows = [
        row
        for journal in journals
        for row in map(str.split, journal.read_text().splitlines())
        if row[1] not in skip
    ]
    seen = sorted(int(row[0]) for row in rows)
    assert seen == sorted(published)  # every message once, none twice
    by_group: dict[str, list[tuple[int, int, int]]] = {}
    for row_seq, group, n, _attempt, start, end in rows:
        assert published[int(row_seq)] == (group, int(n))
        by_group.setdefault(group, []).append((int(start), int(end), int(n)))
    for group, spans in by_group.items():
        spans.sort()
        ns = [n for _, _, n in spans]
        assert ns == sorted(ns), f"{group}: handled out of order: {ns}"
        for (_, ended, _), (began, _, _) in itertools.pairwise(spans):
            assert ended < began, f"{group}: two messages in flight at once"


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


def publish_keys(url: str, keys: list[str], start: Any, out: Any) -> None:
    """Publish one message per key of ``keys`` into group "g", once every publisher has
    started; put (key, seq, duplicate?) for each on ``out``."""
    with open_transport(url) as transport:
        start.wait()
        out.put(
            [
                (key, int(seq), type(seq) is not int)
                for key in keys
                for seq in [transport.publish("g", transport_event(key), key=key)]
            ]
        )


def transport_event(key: str) -> Any:
    from transports_core import Event

    return Event(key=key, pid=os.getpid())
