"""A Redis server (private, AOF with an fsync per write) killed with SIGKILL and started
again under a running worker process: every message is handled, none more than twice,
and the runtime hands out no more duplicates than a bare loop that retries its acks,
under the same kill at the same point of the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from transports_core import Event, TransportAdmin, TransportError, open_transport

from .server import PrivateServer, private_server

pytestmark = pytest.mark.slow

GROUPS = 30
PER_GROUP = 10
TOTAL = GROUPS * PER_GROUP
ROOT = Path(__file__).resolve().parents[2]


def _handlings(journal: Path) -> list[int]:
    if not journal.exists():
        return []
    return [int(line.split()[0]) for line in journal.read_text(encoding="utf-8").splitlines()]


def _until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.02)


def _left(url: str) -> int | None:
    """Messages still queued or in flight, or None while the server does not answer."""
    try:
        with open_transport(url) as transport:
            assert isinstance(transport, TransportAdmin)
            stats = transport.stats()
    except TransportError:
        return None
    return int(stats.ready + stats.in_flight + stats.parked)


def _run(server: PrivateServer, mode: str, journal: Path) -> Counter[int]:
    url = f"{server.url}?queue=restart-{mode}"
    with open_transport(url) as transport:
        transport.publish_many(
            (f"g{g}", Event(kind="step", n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)
        )
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.redis._restart", mode, url, str(journal)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        _until(lambda: len(_handlings(journal)) >= TOTAL // 3, 60, f"{mode}: a third handled")
        server.kill()
        time.sleep(0.3)
        server.start()
        _until(lambda: _left(url) == 0, 90, f"{mode}: the queue drained after the restart")
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return Counter(_handlings(journal))


def test_a_restart_under_a_worker_loses_nothing_and_duplicates_no_more_than_a_bare_loop(
    tmp_path: Path,
) -> None:
    with private_server() as server:
        handled = {
            mode: _run(server, mode, tmp_path / f"{mode}.journal") for mode in ("bare", "worker")
        }
    for mode, counts in handled.items():
        assert set(counts) == set(range(min(counts), min(counts) + TOTAL)), f"{mode}: lost"
        assert max(counts.values()) <= 2, (
            f"{mode}: handled more than twice: {counts.most_common(3)}"
        )
    duplicates = {
        mode: sum(1 for c in counts.values() if c > 1) for mode, counts in handled.items()
    }
    assert duplicates["worker"] <= duplicates["bare"], duplicates
