"""``python -m bench.batch``: what batching buys on any backend: a claim+ack loop against
``claim_many`` + ``ack_many`` batches, and on PostgreSQL the same work as bare SQL.

    python -m bench.batch                                        # a SQLite file of its own
    python -m bench.batch --url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.batch --url redis://127.0.0.1:6379/0 --rounds 9 -n 5000
    python -m bench.batch --quick                                # seconds: checks the command

On a server, the run gets a schema or queue of its own (removed at the end) unless the URL
names one. Only the public transport interface is used, so any backend's URL works.

Each round publishes ``n`` messages over `GROUPS` groups (not timed) and then drains them,
once per case, the cases taken in a different order each round so that a noisy moment
hits them alike: single claims and acks, then batches of `LIMIT` (``claim_many`` then
``ack_many``), and on PostgreSQL the raw floor: psycopg on a plain table of its own, in
batches of `LIMIT` too (``UPDATE ... FOR UPDATE SKIP LOCKED ... RETURNING`` to lease,
``DELETE ... = ANY`` to ack), each in its own autocommitted statement as the transport's
are. Printed: the medians of the rounds in messages per second, and the medians of the
rounds' own ratios against the issue's targets (batch at least 8x single on PostgreSQL,
and at least 0.7x the raw floor).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from transports_core import Event, Transport, open_transport

from ._scratch import own_queue, scratch

EVENT = Event(kind="order.created", order=12345, amount=99.5)
GROUPS = 500
LIMIT = 100
VISIBILITY = 60.0
WORKER = "bench-batch"
# The bounds on the ratios.
SINGLE_TARGET = 8.0
FLOOR_TARGET = 0.7

# A round of a case: make its n messages ready (not timed), then drain them (timed).
Case = tuple[Callable[[], None], Callable[[], None]]


class Run:
    """The transport's cases, on groups of this run's own."""

    def __init__(self, transport: Transport[Event], n: int) -> None:
        self.transport, self.n = transport, n
        token = uuid.uuid4().hex[:8]
        self.items = [(f"bench-batch-{token}-{i % GROUPS}", EVENT, 0) for i in range(n)]

    def fill(self) -> None:
        self.transport.publish_many(self.items)

    def single(self) -> None:
        t = self.transport
        for _ in range(self.n):
            lease = t.claim(WORKER, VISIBILITY)
            if lease is None:
                raise RuntimeError("single: the messages ran out (another consumer?)")
            t.ack(lease)

    def batches(self) -> None:
        t, left = self.transport, self.n
        while left:
            leases = t.claim_many(WORKER, VISIBILITY, min(LIMIT, left))
            if not leases:
                raise RuntimeError("batches: the messages ran out (another consumer?)")
            stale = t.ack_many(leases)
            if stale:
                raise RuntimeError(f"batches: {len(stale)} leases lost")
            left -= len(leases)


# The raw floor: a plain table, no groups, the same batches in bare SQL.
FLOOR_TABLE = """
CREATE TABLE {t} (
    id          bigserial PRIMARY KEY,
    group_id    text   NOT NULL,
    event       text   NOT NULL,
    locked_by   text,
    lock_expiry float8
)"""
FLOOR_FILL = "INSERT INTO {t} (group_id, event) SELECT g, %s FROM unnest(%s::text[]) AS g"
FLOOR_CLAIM = """
WITH c AS (
    SELECT id FROM {t} WHERE locked_by IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE {t} j SET locked_by = %s, lock_expiry = date_part('epoch', now()) + %s
  FROM c WHERE j.id = c.id
RETURNING j.id, j.group_id, j.event"""
FLOOR_ACK = "DELETE FROM {t} WHERE id = ANY (%s)"


@contextmanager
def floor(url: str, n: int) -> Iterator[Case]:
    """The raw floor's round on a PostgreSQL server: its table in a schema of its own."""
    import psycopg

    server = url.partition("?")[0]
    conn = psycopg.connect(server, autocommit=True)

    def drop(name: str) -> None:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    with conn, scratch("bench_batch_floor_", drop) as name:
        table = f'"{name}".jobs'
        conn.execute(f'CREATE SCHEMA "{name}"')
        conn.execute(FLOOR_TABLE.format(t=table))
        groups = [f"g{i % GROUPS}" for i in range(n)]
        raw = EVENT.model_dump_json()
        claim, ack = FLOOR_CLAIM.format(t=table), FLOOR_ACK.format(t=table)

        def fill() -> None:
            conn.execute(FLOOR_FILL.format(t=table), (raw, groups))

        def drain() -> None:
            left = n
            while left:
                rows = conn.execute(claim, (min(LIMIT, left), WORKER, VISIBILITY)).fetchall()
                if not rows:
                    raise RuntimeError("floor: the rows ran out")
                conn.execute(ack, ([row[0] for row in rows],))
                left -= len(rows)

        yield fill, drain


def rounds_of(cases: dict[str, Case], rounds: int, n: int) -> dict[str, list[float]]:
    """Messages per second of each case, every round, the cases' order turned each round."""
    rates: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fill, drain = cases[name]
            fill()
            started = time.perf_counter()
            drain()
            rates[name].append(n / (time.perf_counter() - started))
    return rates


def ratio(rates: dict[str, list[float]], top: str, bottom: str) -> float | None:
    """The median of the rounds' own ratios ``top`` / ``bottom`` (None: not measured)."""
    if top not in rates or bottom not in rates:
        return None
    return statistics.median(a / b for a, b in zip(rates[top], rates[bottom], strict=True))


def measure(url: str | None, rounds: int, n: int) -> tuple[str, dict[str, list[float]]]:
    """The URL measured and every round's rate of each case."""
    with own_queue(url, "bench-batch-") as queue, open_transport(queue) as transport:
        run = Run(transport, n)
        cases: dict[str, Case] = {
            "single": (run.fill, run.single),
            "batch": (run.fill, run.batches),
        }
        with ExitStack() as stack:
            if queue.split("://")[0] in ("postgresql", "postgres"):
                cases["floor"] = stack.enter_context(floor(queue, n))
            # Connect and warm the statements up (and the floor's), then measure.
            rounds_of(cases, 1, n)
            return queue, rounds_of(cases, rounds, n)


def report(url: str, rates: dict[str, list[float]], rounds: int, n: int) -> list[str]:
    def rate(name: str) -> str:
        return f"{statistics.median(rates[name]):12,.0f}" if name in rates else f"{'-':>12}"

    def shown(value: float | None) -> str:
        return f"{'-':>12}" if value is None else f"{value:12.2f}"

    scheme = url.split("://")[0]
    single = shown(ratio(rates, "batch", "single"))
    raw = shown(ratio(rates, "batch", "floor"))
    return [
        f"{scheme}: {rounds} rounds of {n} messages over {GROUPS} groups, batches of {LIMIT}",
        f"claim+ack, one at a time (msg/s)             {rate('single')}",
        f"claim_many+ack_many (msg/s)                  {rate('batch')}",
        f"raw floor, bare SQL batches (msg/s)          {rate('floor')}",
        f"  batch / single (target >= {SINGLE_TARGET:g} on PG)       {single}",
        f"  batch / floor (target >= {FLOOR_TARGET:g})            {raw}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__)
    parser.add_argument("--url", help="the queue to measure (default: a SQLite file of its own)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7)")
    parser.add_argument("-n", type=int, default=None, help="messages a round (default 3000)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 7)
    n = args.n or (200 if args.quick else 3000)
    url, rates = measure(args.url, rounds, n)
    print("\n".join(report(url, rates, rounds, n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
