"""Stopping, alike in both twins: `stop` before `run` claims nothing, leases are handed
back together when ``grace`` runs out, and a signal that comes while the worker opens
its transports is acted on once they are open. On SQLite files; signals in real
processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_api import REPO
from transports_core import Event, open_transport
from transports_worker import AsyncContext, AsyncWorker, Context, Worker
from transports_worker._async import UNWIND
from transports_worker.testing._support import PATIENCE, Recorder, RunningWorker, wait_for


def _queue(tmp_path: Path, count: int) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        store.publish_many([(f"g{n}", Event(n=n), 0) for n in range(count)])
    return url


def _handle(event: Event, ctx: Context[Event]) -> None:
    raise AssertionError("nothing is claimed")


async def _ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
    raise AssertionError("nothing is claimed")


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("batch", [True, False], ids=["batches", "single claims"])
def test_stop_before_run_claims_nothing(tmp_path: Path, flavour: str, batch: bool) -> None:
    url = _queue(tmp_path, 4)
    recorder = Recorder()
    options: dict[str, Any] = {
        "concurrency": 2,
        "batch": batch,
        "hooks": [recorder],
        "handle_signals": False,
    }
    worker: Any = (
        Worker(url, _handle, **options)
        if flavour == "sync"
        else AsyncWorker(url, _ahandle, **options)
    )
    worker.stop()
    assert RunningWorker(worker).join(PATIENCE) == 0
    assert recorder.started_ == []
    with open_transport(url) as store:
        assert store.stats().ready == 4  # type: ignore[attr-defined]


OPENING = """
import asyncio, sys
from transports_core import open_async_transport, open_transport
from transports_worker import AsyncWorker, Worker

flavour, url = sys.argv[1], sys.argv[2]

def opened(opener):
    # The first handle says it is opening, then waits for the parent, which has sent
    # the signal by then.
    first = []
    def factory():
        if not first:
            first.append(True)
            print("opening", flush=True)
            sys.stdin.readline()
        return opener(url)
    return factory

def handle(event, ctx):
    pass

async def ahandle(event, ctx):
    pass

if flavour == "sync":
    code = Worker(opened(open_transport), handle, hooks=[]).run()
else:
    code = asyncio.run(AsyncWorker(opened(open_async_transport), ahandle, hooks=[]).run())
print("returned", code, flush=True)
sys.exit(code)
"""


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_transports_open_is_acted_on_once_they_are(
    tmp_path: Path, flavour: str, signum: signal.Signals
) -> None:
    url = _queue(tmp_path, 0)
    child = subprocess.Popen(
        [sys.executable, "-c", OPENING, flavour, url],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline() == "opening\n"
        child.send_signal(signum)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=PATIENCE)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    assert out == "returned 0\n"


HANDLERS = 6


def test_async_worker_hands_back_every_lease_together_after_grace(tmp_path: Path) -> None:
    # Each handler takes UNWIND (1 s) and more to unwind once cancelled: one at a time,
    # the last lease would go back HANDLERS seconds after grace.
    url = _queue(tmp_path, HANDLERS)
    recorder = Recorder()
    started: list[int] = []
    all_started = threading.Event()

    async def slow_to_unwind(event: Event, ctx: AsyncContext[Event]) -> None:
        started.append(event.n)
        if len(started) == HANDLERS:
            all_started.set()
        try:
            await asyncio.sleep(PATIENCE)
        except asyncio.CancelledError:
            await asyncio.sleep(PATIENCE)  # swallows its cancellation for a while
            raise

    worker = AsyncWorker(
        url,
        slow_to_unwind,
        concurrency=HANDLERS,
        grace=0.1,
        hooks=[recorder],
        handle_signals=False,
    )
    running = RunningWorker(worker)
    wait_for(all_started, "every handler to start")
    stopped = time.monotonic()
    worker.stop()
    recorder.wait_settled(HANDLERS)
    took = time.monotonic() - stopped
    assert [outcome for _, _, outcome in recorder.outcomes()] == ["handed_back"] * HANDLERS
    assert took < 0.1 + 2 * UNWIND, f"the leases went back {took:.1f}s after stop()"
    assert running.join(PATIENCE) == 75
