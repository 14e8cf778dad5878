"""The demo's worker process: claim, sometimes park or fail, now and then extend, ack.

Runs in a process started with the ``spawn`` method, so everything it needs arrives in
one picklable `WorkerSpec`. It journals each settled lease (see `_journal`) and
reports progress over a queue for the live view; the verdict reads only the journal.
"""

from __future__ import annotations

import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from transports_core import LeaseLost, open_transport

from ._journal import Record

__all__ = ["Decision", "WorkerSpec", "decide", "work"]

# Leases are far longer than any handling here: a lapse would be a bug, reported as such.
VISIBILITY = 30.0
PARK_RATE = 0.04
FAIL_RATE = 0.04
EXTEND_RATE = 0.05


class ProgressQueue(Protocol):
    def put(self, obj: tuple[str, ...], /) -> None: ...


class StopFlag(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = ..., /) -> bool: ...


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    worker_id: str
    journal: Path
    prefix: str  # the groups of this run start with it; any other group is not ours
    seed: int
    min_priority: int = 0
    debug: bool = False


@dataclass(frozen=True)
class Decision:
    action: Literal["ack", "park", "retry"]
    extend: bool
    delay: float = 0.0


def decide(seed: int, execution: str, step: int, attempt: int) -> Decision:
    """What happens to one delivery. Drawn from the message (the execution's number, not
    the run's group name), not the worker, so a seed gives the same parks and retries
    whichever worker gets which message, run after run."""
    rng = random.Random(f"{seed}/{execution}/{step}/{attempt}")
    roll, extend = rng.random(), rng.random() < EXTEND_RATE
    if attempt == 1 and roll < PARK_RATE:
        return Decision("park", extend, delay=round(rng.uniform(0.05, 0.25), 3))
    if attempt == 1 and roll < PARK_RATE + FAIL_RATE:
        return Decision("retry", extend)
    return Decision("ack", extend)


def work(spec: WorkerSpec, stop: StopFlag, progress: ProgressQueue) -> None:
    """The worker process's body: runs until ``stop`` is set."""
    try:
        _work(spec, stop, progress)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        sys.exit(1)
    except Exception as exc:
        if spec.debug:
            traceback.print_exc()
        progress.put(("error", spec.worker_id, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)


def _work(spec: WorkerSpec, stop: StopFlag, progress: ProgressQueue) -> None:
    worker = spec.worker_id
    with open_transport(spec.url) as transport, spec.journal.open("a", buffering=1) as journal:
        progress.put(("ready", worker))
        while not stop.is_set():
            lease = transport.claim(worker, visibility=VISIBILITY, min_priority=spec.min_priority)
            if lease is None:
                stop.wait(0.005)
                continue
            claimed = time.monotonic_ns()
            if not lease.group_id.startswith(spec.prefix):
                # Someone else's message: hand it back untouched and let it be.
                transport.nack(lease)
                progress.put(("foreign", worker, lease.group_id))
                stop.wait(0.05)
                continue
            group, step = lease.group_id, int(lease.event.step)
            progress.put(("claim", worker, group, str(step)))
            decision = decide(spec.seed, group.removeprefix(spec.prefix), step, lease.attempt)
            extended = 0
            kind: Literal["ack", "park", "retry", "lost"] = decision.action
            try:
                if decision.extend:
                    lease = transport.extend(lease, VISIBILITY)
                    extended = 1
                released = time.monotonic_ns()
                if decision.action == "ack":
                    transport.ack(lease)
                else:
                    transport.nack(lease, delay=decision.delay)
            except LeaseLost:
                released, kind = time.monotonic_ns(), "lost"
            record = Record(kind, group, step, lease.attempt, claimed, released, extended, worker)
            journal.write(record.line() + "\n")
            progress.put((kind, worker, group, str(step)))
