"""The demo's worker process: the worker runtime (`transports_worker.Worker`) with a
handler that sometimes parks or fails a message.

Runs in a process forked by a fork server (or spawned, where there is none), so
everything it needs arrives in one picklable `WorkerSpec`. The workers that ``meets``
each hold their first message until all of them hold one, so that every one of them
takes part by construction, not by luck of scheduling. `_Demo` is both the handler and
the runtime's hooks: the handler reads the clock as it starts and as it ends, and the
``settled`` hook journals the delivery (in the conformance journal's format) with the
outcome the runtime carried out, and reports progress over a queue for the live view.
The verdict reads only the journals.

The handlers take milliseconds, so no lease lives long enough to be renewed, and the demo
counts no renewals (its predecessor's own loop called ``extend`` at random; the runtime's
keeper renews only what needs it, which the runtime suite proves with handlers lasting
several leases).
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from transports_core import Event
from transports_core.conformance.journal import Journal
from transports_worker import Context, Delivery, Hooks, Outcome, Retry, RetryPolicy, Worker

__all__ = ["Decision", "WorkerSpec", "decide", "work"]

# Far longer than any handling here: a lease lost would be a fault, reported as such.
VISIBILITY: Final = 30.0
PARK_RATE: Final = 0.04
FAIL_RATE: Final = 0.04
# A failed delivery comes back at once, and no message is ever buried for its attempts.
POLICY: Final = RetryPolicy(max_attempts=None, base=0.0, cap=0.0, jitter=0.0)
GRACE: Final = 10.0
# The progress message for each outcome the runtime reports (see `_live`).
KINDS: Final[dict[str, str]] = {
    "acked": "ack",
    "retried": "park",
    "failed": "retry",
    "lost": "lost",
    "buried": "lost",
    "handed_back": "retry",
}


class ProgressQueue(Protocol):
    def put(self, obj: tuple[str, ...], /) -> None: ...


class Meeting(Protocol):
    def wait(self, timeout: float | None = ..., /) -> int: ...


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
    meets: bool = False  # waits, holding its first message, until the others hold theirs


@dataclass(frozen=True)
class Decision:
    action: Literal["ack", "park", "retry"]
    delay: float = 0.0


class DemoFailure(Exception):
    """What the handler raises for a delivery the seed says fails."""


def decide(seed: int, execution: str, step: int, attempt: int) -> Decision:
    """What happens to one delivery. Drawn from the message (the execution's number, not
    the run's group name), not the worker, so a seed gives the same parks and retries
    whichever worker gets which message, run after run."""
    rng = random.Random(f"{seed}/{execution}/{step}/{attempt}")
    roll = rng.random()
    if attempt == 1 and roll < PARK_RATE:
        return Decision("park", delay=round(rng.uniform(0.05, 0.25), 3))
    if attempt == 1 and roll < PARK_RATE + FAIL_RATE:
        return Decision("retry")
    return Decision("ack")


class _Demo(Hooks):
    def __init__(
        self, spec: WorkerSpec, journal: Journal, progress: ProgressQueue, meet: Meeting
    ) -> None:
        self.spec, self.journal, self.progress = spec, journal, progress
        self._meet: Meeting | None = meet if spec.meets else None
        # (seq, attempt) -> (step, claimed_ns, released_ns), from the handler to the hook
        self._held: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def handle(self, event: Event, ctx: Context[Event]) -> None:
        claimed = time.monotonic_ns()
        lease, spec = ctx.lease, self.spec
        if not lease.group_id.startswith(spec.prefix):
            # Someone else's message: hand it back untouched, unjournaled.
            self.progress.put(("foreign", spec.worker_id, lease.group_id))
            raise Retry(0)
        group, step = lease.group_id, int(event.step)
        self.progress.put(("claim", spec.worker_id, group, str(step)))
        if self._meet is not None:
            meet, self._meet = self._meet, None
            with contextlib.suppress(threading.BrokenBarrierError):  # the run is ending
                meet.wait()
        decision = decide(spec.seed, group.removeprefix(spec.prefix), step, lease.attempt)
        try:
            if decision.action == "park":
                raise Retry(decision.delay)
            if decision.action == "retry":
                raise DemoFailure(f"step {step} fails on attempt {lease.attempt}")
        finally:
            with self._lock:
                self._held[lease.seq, lease.attempt] = (step, claimed, time.monotonic_ns())

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        with self._lock:
            held = self._held.pop((delivery.seq, delivery.attempt), None)
            if held is None:  # a foreign message, or one handed back before its end
                return
            step, claimed, released = held
            self.journal.record(
                delivery, claimed, released, "ack" if outcome == "acked" else outcome
            )
        self.progress.put((KINDS[outcome], delivery.worker_id, delivery.group_id, str(step)))


def work(spec: WorkerSpec, stop: StopFlag, progress: ProgressQueue, meet: Meeting) -> None:
    """The worker process's body: runs until ``stop`` is set."""
    try:
        code = _work(spec, stop, progress, meet)
    except Exception as exc:
        if spec.debug:
            traceback.print_exc()
        progress.put(("error", spec.worker_id, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    sys.exit(code)


def _work(spec: WorkerSpec, stop: StopFlag, progress: ProgressQueue, meet: Meeting) -> int:
    with Journal(spec.journal) as journal:
        demo = _Demo(spec, journal, progress, meet)
        worker = Worker(
            spec.url,
            demo.handle,
            worker_id=spec.worker_id,
            visibility=VISIBILITY,
            min_priority=spec.min_priority,
            retry=POLICY,
            grace=GRACE,
            hooks=[demo],
        )

        def stop_when_told() -> None:
            stop.wait()
            worker.stop()

        threading.Thread(target=stop_when_told, name="demo-stop", daemon=True).start()
        progress.put(("ready", spec.worker_id))
        return worker.run()
