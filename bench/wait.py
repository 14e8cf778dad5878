"""``python -m bench.wait``: how soon a waiting claim wakes, and what waiting costs.

    python -m bench.wait                 # 200 wake-ups, a 10 s idle wait
    python -m bench.wait --quick         # 30 wake-ups, a 2 s idle wait

Wake latency: a claimer process blocks in ``claim(wait=...)`` on an empty SQLite queue; a
publisher process publishes at random moments and notes when each publish returned
(committed). The claimer notes when its claim returned. Both are one machine's
``time.time()``, so the difference is the wake latency. Idle cost: one process waits on a
queue nobody writes to, and its CPU time over the wait is reported as a share of a core,
with the number of claims it tried (each takes the write lock) per second.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from transports_core import Event, open_transport
from transports_sqlite import _sync


def _claimer(url: str, count: int, ready: multiprocessing.synchronize.Event, out: object) -> None:
    with open_transport(url) as transport:
        ready.set()
        returned: list[tuple[int, float]] = []
        while len(returned) < count:
            lease = transport.claim("claimer", 30, wait=10)
            now = time.time()
            if lease is not None:
                returned.append((lease.event.n, now))
                transport.ack(lease)
        out.send(returned)  # type: ignore[attr-defined]


def _publisher(url: str, count: int, ready: multiprocessing.synchronize.Event, out: object) -> None:
    rng = random.Random(5)
    with open_transport(url) as transport:
        ready.wait()
        committed: list[tuple[int, float]] = []
        for n in range(count):
            time.sleep(rng.uniform(0.005, 0.03))
            transport.publish(f"g{n}", Event(n=n))
            committed.append((n, time.time()))
        out.send(committed)  # type: ignore[attr-defined]


def wake_latency(directory: Path, count: int) -> list[float]:
    """Seconds from each publish's commit (in one process) to the claim's return (in
    another), for ``count`` publishes."""
    url = f"sqlite:///{directory / 'wake.db'}"
    open_transport(url).close()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    claims_r, claims_w = ctx.Pipe(duplex=False)
    pubs_r, pubs_w = ctx.Pipe(duplex=False)
    procs = [
        ctx.Process(target=_claimer, args=(url, count, ready, claims_w)),
        ctx.Process(target=_publisher, args=(url, count, ready, pubs_w)),
    ]
    for proc in procs:
        proc.start()
    returned = dict(claims_r.recv())
    committed = dict(pubs_r.recv())
    for proc in procs:
        proc.join()
    return [returned[n] - committed[n] for n in committed]


def idle_cost(directory: Path, seconds: float) -> tuple[float, float]:
    """The share of a core, and the claims per second, of one claim waiting ``seconds``
    on a queue nobody writes to (measured in this process)."""
    url = f"sqlite:///{directory / 'idle.db'}"
    tries = 0
    perform = _sync.Engine.run

    def counting(self: _sync.Engine, op: object) -> object:
        nonlocal tries
        tries += op.__class__.__name__ == "Claim"
        return perform(self, op)  # type: ignore[arg-type]

    with open_transport(url) as transport:
        _sync.Engine.run = counting  # type: ignore[assignment,method-assign]
        try:
            cpu, wall = time.process_time(), time.monotonic()
            assert transport.claim("idle", 30, wait=seconds) is None
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        finally:
            _sync.Engine.run = perform  # type: ignore[method-assign]
    return cpu / wall, tries / wall


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wait", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    args = parser.parse_args()
    count, idle = (30, 2.0) if args.quick else (200, 10.0)
    with tempfile.TemporaryDirectory() as tmp:
        latencies = sorted(wake_latency(Path(tmp), count))
        share, tries = idle_cost(Path(tmp), idle)
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"machine: {os.cpu_count()} cores")
    print(f"wake latency over {count} publishes from another process:")
    print(f"  p50 {p50 * 1000:.2f} ms (target <= 5), p99 {p99 * 1000:.2f} ms (target <= 50)")
    print(f"idle wait of {idle:.0f} s: {share * 100:.3f} % of a core (target < 1),")
    print(f"  {tries:.2f} claims a second, each taking the write lock (target <= about 1)")


if __name__ == "__main__":
    main()
