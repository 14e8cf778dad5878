"""Running a worker in a test until it has settled a number of deliveries."""

from __future__ import annotations

from typing import Any

from transports_worker import AsyncWorker, Worker
from transports_worker.testing._support import Recorder, RunningWorker


def either(
    flavour: str, source: Any, handle: Any, ahandle: Any, **options: Any
) -> Worker[Any] | AsyncWorker[Any]:
    """A `Worker` of ``handle`` (``flavour`` "sync") or an `AsyncWorker` of ``ahandle``."""
    if flavour == "sync":
        return Worker(source, handle, **options)
    return AsyncWorker(source, ahandle, **options)


def drain(worker: Worker[Any] | AsyncWorker[Any], recorder: Recorder, settled: int) -> None:
    """Run ``worker`` until ``recorder`` has heard of ``settled`` settled deliveries, then
    stop it, which must drain (exit code 0)."""
    running = RunningWorker(worker)
    recorder.wait_settled(settled)
    assert running.stop() == 0
