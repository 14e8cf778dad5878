"""Several OS processes on one queue, journaled on the server's clock (the conformance
suite's contention scenario journals on the host's), a worker SIGKILLed while it holds a lease, and
server connections terminated under the transport: nothing lost, nothing doubled."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from transports_core import Event, OutcomeUnknown, Transport, TransportError, open_transport

from . import _workers

PROCESSES = 4
GROUPS = 12
PER_GROUP = 25


@pytest.mark.slow
def test_processes_lose_nothing_keep_order_and_never_share_a_group(
    queue: Transport[Event], queue_url: str, tmp_path: Path
) -> None:
    published: dict[int, tuple[str, int]] = {}
    items = [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
    for (group, event, _), seq in zip(items, queue.publish_many(items), strict=True):
        published[seq] = (group, event.n)
    spawn = multiprocessing.get_context("spawn")
    journals = [tmp_path / f"w{i}.journal" for i in range(PROCESSES)]
    children = [
        spawn.Process(target=_workers.drain, args=(queue_url, f"w{i}", str(journal), 2.0))
        for i, journal in enumerate(journals)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    rows = [line.split() for journal in journals for line in journal.read_text().splitlines()]
    seen = [int(row[0]) for row in rows]
    assert sorted(seen) == sorted(published), "lost or doubled messages"
    by_group: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for seq_text, group, n, attempt, claimed_at, acking_at in rows:
        assert published[int(seq_text)] == (group, int(n))
        assert attempt == "1"
        by_group[group].append((float(claimed_at), float(acking_at), int(n)))
    for group, spans in by_group.items():
        spans.sort()
        assert [n for *_, n in spans] == list(range(PER_GROUP)), f"{group} out of order"
        for (_, end, _), (start, _, _) in itertools.pairwise(spans):
            assert end <= start, f"{group}: two live leases at once ({end} > {start})"
    assert len({row[0] for row in rows}) == len(rows)


def test_a_sigkilled_lease_holder_loses_nothing(
    queue: Transport[Event], queue_url: str, tmp_path: Path
) -> None:
    seq = queue.publish("g", Event(n=1))
    ready = tmp_path / "ready"
    child = multiprocessing.get_context("spawn").Process(
        target=_workers.hold, args=(queue_url, str(ready))
    )
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text().endswith("\n"):
            assert time.monotonic() < deadline, "the child never claimed"
            assert child.is_alive()
            time.sleep(0.02)
        assert ready.read_text().split()[:2] == [str(seq), "1"]
        assert queue.claim("w", 60) is None  # the child's lease holds the group
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
    lease = queue.claim("w", 60, wait=20)  # woken when the dead worker's lease lapses
    assert lease is not None
    assert (lease.seq, lease.attempt) == (seq, 2)
    queue.ack(lease)
    assert queue.claim("w", 60) is None


def _terminate(raw: psycopg.Connection[Any], where: str) -> int:
    row = raw.execute(
        f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {where}"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _gone(raw: psycopg.Connection[Any], name: str) -> None:
    """Wait until the terminated backends have exited (termination is a signal)."""
    deadline = time.monotonic() + 20
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    while raw.execute(query, (name,)).fetchone() != (0,):
        assert time.monotonic() < deadline, "terminated backends still running"
        time.sleep(0.01)


def test_terminated_idle_connections_are_replaced_before_the_next_call(
    queue_url: str, raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    name = f"victim_{schema_url[1]}"
    with open_transport(f"{queue_url}&application_name={name}") as queue:
        queue.publish("g", Event(n=1))
        assert _terminate(raw, f"application_name = '{name}'") >= 1
        _gone(raw, name)
        lease = queue.claim("w", 60)  # on a fresh connection: none is sent down a dead one
        assert lease is not None
        queue.ack(lease)


def test_terminated_mid_ack_is_outcome_unknown_and_the_next_call_works(
    queue_url: str, raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    url, schema = schema_url
    name = f"victim_{schema}"
    queue = open_transport(f"{queue_url}&application_name={name}")
    queue.publish("g", Event(n=1))
    lease = queue.claim("w", 60)
    assert lease is not None
    blocker = psycopg.connect(url, autocommit=True)
    errors: list[BaseException] = []

    def ack() -> None:
        try:
            queue.ack(lease)
        except BaseException as exc:
            errors.append(exc)

    try:
        blocker.execute("BEGIN")
        blocker.execute(f"SELECT 1 FROM \"{schema}\".groups WHERE group_id = 'g' FOR UPDATE")
        thread = threading.Thread(target=ack)
        thread.start()
        deadline = time.monotonic() + 20
        # Terminated while its ack waits for the group: the call was sent, no answer came.
        while not _terminate(raw, f"application_name = '{name}' AND wait_event_type = 'Lock'"):
            assert time.monotonic() < deadline, "the ack never blocked"
            time.sleep(0.01)
        thread.join(20)
        assert len(errors) == 1
        assert isinstance(errors[0], OutcomeUnknown)
        assert isinstance(errors[0], TransportError)
        assert errors[0].operation.endswith("ack")
        assert "s3cret" not in str(errors[0])
    finally:
        blocker.close()
    # Its transaction died with its backend, so the ack did not happen: retried, it works.
    queue.ack(lease)
    assert queue.claim("w", 60) is None
    queue.close()
