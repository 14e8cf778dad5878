"""``python -m bench.timers``: what a backlog of delayed messages costs a claim, and how
soon a waiting claim wakes for a message that comes due, next to how soon it wakes for a
publish.

    python -m bench.timers                                    # a SQLite file of its own
    python -m bench.timers --url postgresql://127.0.0.1/test  # any backend's URL
    python -m bench.timers --url redis://127.0.0.1:6379/0 --delayed 200000
    python -m bench.timers --quick                            # seconds: checks the command

Claim cost: ``--ready`` messages (one per group) are claimed and acked one by one, and each
claim is timed (the ack is not); then ``--delayed`` messages due in a day are published
(in batches, spread over groups of their own), the ready ones again, and the claims timed
again. Printed: the median claim of each run and their ratio, against the issue's ceiling
(1.3x). Wake latency: a second handle on a thread of its own blocks in ``claim(wait=)``;
the first publishes a message, plain or delayed by ``--due-in`` seconds; the latency is
from the moment the message became deliverable (the publish returned, or the due time on
this machine's clock, which the local stores share) to the moment the claim returned.
On a server, the run gets a schema or queue of its own (removed at the end) unless the URL
names one; there, everything this run published is purged at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from typing import cast

from transports_core import Event, Message, Transport, TransportAdmin, open_transport

from ._scratch import own_queue

EVENT = Event(kind="timer.fired", execution=12345)
DAY = 86_400.0
BATCH = 1000
# The ceiling: claim p50 with the delayed backlog / without.
CLAIM_TARGET = 1.3


class Run:
    """The cases on one handle, with groups unique to this run."""

    def __init__(self, transport: Transport[Event], delayed_groups: int) -> None:
        self.t = transport
        token = uuid.uuid4().hex[:8]
        self.prefix = f"bench-timers-{token}"
        self.delayed_groups = [f"{self.prefix}-d{i}" for i in range(delayed_groups)]
        self.used: set[str] = set()

    def claims(self, ready: int) -> list[float]:
        """Seconds of each of ``ready`` claims, over as many fresh groups, each acked."""
        groups = [f"{self.prefix}-r{i}-{uuid.uuid4().hex[:6]}" for i in range(ready)]
        self.used.update(groups)
        for start in range(0, ready, BATCH):
            self.t.publish_many([(g, EVENT, 0) for g in groups[start : start + BATCH]])
        took: list[float] = []
        for _ in range(ready):
            began = time.perf_counter()
            lease = self.t.claim("bench-timers", 60)
            took.append(time.perf_counter() - began)
            if lease is None:
                raise SystemExit("a ready message did not come: the run is not measuring claims")
            self.t.ack(lease)
        return took

    def delay(self, count: int) -> float:
        """Publish ``count`` messages due in a day; seconds it took."""
        groups = self.delayed_groups
        began = time.perf_counter()
        for start in range(0, count, BATCH):
            self.t.publish_many(
                [
                    Message(groups[i % len(groups)], EVENT, delay=DAY)
                    for i in range(start, min(start + BATCH, count))
                ]
            )
        self.used.update(groups)
        return time.perf_counter() - began

    def wake(self, waiter: Transport[Event], due_in: float | None) -> float:
        """Seconds from the moment a message became deliverable to a waiting claim's
        return: a plain publish (``due_in`` None) or one delayed by ``due_in``."""
        group = f"{self.prefix}-w{uuid.uuid4().hex[:6]}"
        self.used.add(group)
        returned: list[float] = []

        def wait() -> None:
            lease = waiter.claim("bench-timers-waiter", 60, wait=30)
            returned.append(time.time())
            if lease is not None:
                waiter.ack(lease)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)  # let it settle into its wait: the latency is measured either way
        if due_in is None:
            self.t.publish(group, EVENT)
            ready_at = time.time()
        else:
            ready_at = time.time() + due_in
            self.t.publish(group, EVENT, delay=due_in)
        thread.join(60)
        return returned[0] - ready_at

    def purge(self) -> None:
        if isinstance(self.t, TransportAdmin):
            admin = cast(TransportAdmin, self.t)
            for group in self.used:
                admin.purge_group(group)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timers", description=__doc__)
    parser.add_argument("--url", help="the queue to measure (default: a SQLite file of its own)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--delayed", type=int, default=None, help="default 1,000,000")
    parser.add_argument("--ready", type=int, default=None, help="default 1,000")
    parser.add_argument("--wakes", type=int, default=None, help="wake-ups of each kind (7)")
    parser.add_argument("--due-in", type=float, default=0.5, help="seconds (0.5)")
    args = parser.parse_args(argv)
    delayed = args.delayed if args.delayed is not None else 2000 if args.quick else 1_000_000
    ready = args.ready or (50 if args.quick else 1000)
    wakes = args.wakes or (2 if args.quick else 7)
    with (
        own_queue(args.url, "bench-timers-") as url,
        open_transport(url) as t,
        open_transport(url) as waiter,
    ):
        run = Run(t, delayed_groups=max(1, min(delayed // 100, 10_000)))
        try:
            run.claims(min(ready, 100))  # connect, warm the statements
            before = statistics.median(run.claims(ready))
            publishing = run.delay(delayed)
            after = statistics.median(run.claims(ready))
            publish_wakes = [run.wake(waiter, None) for _ in range(wakes)]
            due_wakes = [run.wake(waiter, args.due_in) for _ in range(wakes)]
        finally:
            run.purge()
    scheme = url.split("://")[0]
    rows = [
        ("publishing the delayed messages (s)", publishing),
        ("claim p50, no delayed messages (us)", before * 1e6),
        (f"claim p50, {delayed:,} delayed (us)", after * 1e6),
        (f"  with / without (target <= {CLAIM_TARGET})", after / before),
        ("wake for a publish, median (ms)", statistics.median(publish_wakes) * 1e3),
        ("wake for a due message, median (ms)", statistics.median(due_wakes) * 1e3),
        ("wake for a publish, worst (ms)", max(publish_wakes) * 1e3),
        ("wake for a due message, worst (ms)", max(due_wakes) * 1e3),
    ]
    print(f"{scheme}: {ready} claims a run, {delayed:,} delayed messages, {wakes} wake-ups each")
    for label, value in rows:
        print(f"{label:<44} {value:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
