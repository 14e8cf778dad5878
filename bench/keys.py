"""``python -m bench.keys``: what an idempotency key costs on any backend: a keyed publish
against a plain one, and a ``publish_many`` of 100 keyed items against 100 plain ones.

    python -m bench.keys                                   # a SQLite file of its own
    python -m bench.keys --url postgresql://127.0.0.1/test  # any backend's URL
    python -m bench.keys --url redis://127.0.0.1:6379/0 --rounds 9
    python -m bench.keys --quick                           # seconds: checks the command

On a server, the run gets a schema or queue of its own (removed at the end) unless the URL
names one: a queue that other runs filled remembers their keys, and its figures drift.

Each round runs the plain case and then the keyed one (the other way round every other
round), so a noisy moment hits both alike; each key is fresh (never used before, so every
keyed publish stores a message). Printed: the medians over the rounds, in microseconds a
message, and the median of the rounds' own ratios, against the issue's targets (keyed
publish at most 1.4x plain, keyed ``publish_many`` at most 1.5x). Messages go to groups of
this run's own; with a backend that implements the admin interface they are purged at the
end (the keys stay: a queue forgets keys only when its window has passed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable

from transports_core import Event, Message, Transport, TransportAdmin, open_transport

from ._scratch import own_queue

EVENT = Event(kind="order.created", order=12345, amount=99.5)
GROUPS = 100
BATCH = 100
# The ceilings on keyed / plain.
PUBLISH_TARGET = 1.4
BATCH_TARGET = 1.5


class Run:
    """The cases on one handle: groups and keys unique to this run, never a key twice."""

    def __init__(self, transport: Transport[Event]) -> None:
        self.transport = transport
        self.token = uuid.uuid4().hex[:8]
        self.groups = [f"bench-keys-{self.token}-{i}" for i in range(GROUPS)]
        self._next = 0

    def _keys(self, n: int) -> list[str]:
        first, self._next = self._next, self._next + n
        return [f"{self.token}-{k}" for k in range(first, first + n)]

    def publish(self, n: int, keyed: bool) -> float:
        """Seconds for ``n`` publishes, each with a fresh key if ``keyed``."""
        t, groups = self.transport, self.groups
        if not keyed:
            started = time.perf_counter()
            for i in range(n):
                t.publish(groups[i % GROUPS], EVENT)
            return time.perf_counter() - started
        keys = self._keys(n)
        started = time.perf_counter()
        for i, key in enumerate(keys):
            t.publish(groups[i % GROUPS], EVENT, key=key)
        return time.perf_counter() - started

    def publish_many(self, batches: int, keyed: bool) -> float:
        """Seconds for ``batches`` publish_many of `BATCH` items, one to each group: fresh
        keyed messages if ``keyed``, else plain triples; built before the clock starts."""
        t, groups = self.transport, self.groups
        plans: list[list[tuple[str, Event, int] | Message[Event]]]
        if keyed:
            keys = self._keys(batches * BATCH)
            plans = [
                [Message(groups[i], EVENT, key=keys[b * BATCH + i]) for i in range(BATCH)]
                for b in range(batches)
            ]
        else:  # today's triples: what publish_many cost before keys
            plans = [[(groups[i], EVENT, 0) for i in range(BATCH)]] * batches
        started = time.perf_counter()
        for items in plans:
            t.publish_many(items)
        return time.perf_counter() - started

    def purge(self) -> None:
        if isinstance(self.transport, TransportAdmin):
            for group in self.groups:
                self.transport.purge_group(group)


def paired(
    rounds: int, items: int, plain: Callable[[], float], keyed: Callable[[], float]
) -> tuple[float, float, float]:
    """Microseconds an item of each case (medians over ``rounds``) and the median of the
    rounds' ratios keyed / plain; the two run in turn, swapped every other round."""
    plains: list[float] = []
    keyeds: list[float] = []
    for r in range(rounds):
        order = [(plains, plain), (keyeds, keyed)]
        for costs, run in order if r % 2 == 0 else order[::-1]:
            costs.append(run() / items * 1e6)
    ratio = statistics.median(k / p for p, k in zip(plains, keyeds, strict=True))
    return statistics.median(plains), statistics.median(keyeds), ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keys", description=__doc__)
    parser.add_argument("--url", help="the queue to measure (default: a SQLite file of its own)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds a pair (default 7)")
    parser.add_argument("-n", type=int, default=None, help="publishes a round (default 2000)")
    parser.add_argument("--batches", type=int, default=None, help="batches a round (default 40)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 7)
    n = args.n or (50 if args.quick else 2000)
    batches = args.batches or (2 if args.quick else 40)
    with own_queue(args.url, "bench-keys-") as url, open_transport(url) as transport:
        run = Run(transport)
        try:
            run.publish(10, keyed=True)  # connect, warm the statements
            plain, keyed, ratio = paired(
                rounds, n, lambda: run.publish(n, False), lambda: run.publish(n, True)
            )
            many, many_keyed, many_ratio = paired(
                rounds,
                batches * BATCH,
                lambda: run.publish_many(batches, False),
                lambda: run.publish_many(batches, True),
            )
        finally:
            run.purge()
    print(f"{url.split('://')[0]}: {rounds} rounds, {n} publishes, {batches} batches of {BATCH}")
    print(f"publish, plain (us a message)               {plain:9.1f}")
    print(f"publish, keyed (us a message)               {keyed:9.1f}")
    print(f"  keyed / plain (target <= {PUBLISH_TARGET})            {ratio:9.2f}")
    print(f"publish_many of {BATCH}, plain (us a message)   {many:9.1f}")
    print(f"publish_many of {BATCH}, keyed (us a message)   {many_keyed:9.1f}")
    print(f"  keyed / plain (target <= {BATCH_TARGET})            {many_ratio:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
