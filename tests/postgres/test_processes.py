"""A worker SIGKILLed while it holds a lease, and server connections terminated under the
transport: nothing lost, nothing doubled. (Several processes draining one queue is the
conformance suite's contention-processes scenario.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from transports_core import Event, OutcomeUnknown, Transport, TransportError, open_transport

from . import _workers


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
