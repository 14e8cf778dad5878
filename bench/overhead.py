"""``python -m bench.overhead``: the worker runtime's own cost per delivery, with no I/O.

    python -m bench.overhead                      # microseconds a delivery, both loops
    python -m bench.overhead --quick              # seconds: checks the command works
    python -m bench.overhead --deliveries 20000 --loop runtime   # one loop, for callgrind

A transport that keeps nothing and waits for nothing (`Hollow`: ``claim`` makes a lease,
``ack`` returns) is drained by the bare claim+ack loop and by a `Worker` with a no-op
handler; the difference is what the runtime adds to every delivery. Timings move with
the machine. Instruction counts do not: run one loop under
``valgrind --tool=callgrind`` at two sizes and divide the difference in instructions by
the difference in deliveries (see docs/worker.md, "What the worker costs").
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import cast

from transports_core import Event, Lease, Transport

from .worker import draining

EVENT = Event(n=1)


class Hollow:
    """Just enough of a `Transport` for the worker: ``claim`` hands out the next of
    ``total`` leases (shared by every handle made from one counter), then None."""

    def __init__(self, counter: itertools.count[int], total: int) -> None:
        self._counter, self._total = counter, total

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[Event] | None:
        seq = next(self._counter)
        if seq > self._total:
            time.sleep(min(wait, 0.01))  # as a waiting claim would, briefly
            return None
        return Lease(seq, "g", EVENT, worker_id, 1, 0.0)

    def ack(self, lease: Lease[Event]) -> None:
        pass

    def nack(self, lease: Lease[Event], delay: float = 0) -> None:
        pass

    def bury(self, lease: Lease[Event], reason: str) -> None:
        pass

    def extend(self, lease: Lease[Event], visibility: float) -> Lease[Event]:
        return lease

    def close(self) -> None:
        pass


def bare(total: int) -> float:
    """Seconds for the bare loop to drain ``total`` leases."""
    handle = Hollow(itertools.count(1), total)
    began = time.perf_counter()
    while (lease := handle.claim("bare", 30.0)) is not None:
        handle.ack(lease)
    return time.perf_counter() - began


def runtime(total: int, concurrency: int = 1) -> float:
    """Seconds for a `Worker` to settle ``total`` leases."""
    counter = itertools.count(1)

    def hollow() -> Transport[Event]:
        # Only what a worker calls: the rest of the protocol is left out.
        return cast("Transport[Event]", Hollow(counter, total))

    with draining(hollow, total, concurrency) as run:
        began = time.perf_counter()
        run()
        return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--deliveries", type=int, default=None, help="per round (100,000)")
    parser.add_argument("--rounds", type=int, default=None, help="per loop (default 5)")
    parser.add_argument("--concurrency", type=int, default=1, help="the worker's slots")
    parser.add_argument(
        "--loop", choices=("both", "bare", "runtime"), default="both", help="which to run"
    )
    args = parser.parse_args(argv)
    total = args.deliveries or (2_000 if args.quick else 100_000)
    rounds = args.rounds or (1 if args.quick else 5)
    loops: dict[str, Callable[[], float]] = {
        "bare": lambda: bare(total),
        "runtime": lambda: runtime(total, args.concurrency),
    }
    chosen = list(loops) if args.loop == "both" else [args.loop]
    best: dict[str, float] = {}
    for name in chosen:
        costs = [loops[name]() / total * 1e6 for _ in range(rounds)]
        # The least of the rounds: the cost with the least interference from the machine.
        best[name] = min(costs)
        print(
            f"{name}: {best[name]:.2f} us a delivery "
            f"(rounds' median {statistics.median(costs):.2f})"
        )
    if len(best) == 2:
        print(f"the runtime adds {best['runtime'] - best['bare']:.2f} us a delivery")
    return 0


if __name__ == "__main__":
    sys.exit(main())
