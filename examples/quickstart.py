"""Publish the events of a few executions, work them off with several worker processes,
and check that every execution's events were handled in order, one at a time.

    python examples/quickstart.py [DIRECTORY]
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

from transports_core import Event, open_transport

EXECUTIONS = 50
EVENTS_PER_EXECUTION = 8
WORKERS = 3


def work(url: str, worker_id: str, journal: Path) -> None:
    with open_transport(url) as transport, journal.open("a") as log:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 0.3:
            lease = transport.claim(worker_id, visibility=30)
            if lease is None:
                time.sleep(0.01)
                continue
            # One monotonic clock serves all processes on Linux and macOS. `claimed` is read
            # after claim returned and `done` before ack is called, so for one group the
            # next event's `claimed` must be later than this one's `done`.
            claimed = time.monotonic_ns()
            step = lease.event.step
            log.write(f"{lease.group_id} {step} {claimed} {time.monotonic_ns()}\n")
            log.flush()
            transport.ack(lease)
            idle_since = time.monotonic()


def main(directory: Path) -> int:
    url = f"sqlite:///{directory / 'quickstart.db'}"
    started = time.perf_counter()
    with open_transport(url) as transport:
        transport.publish_many(
            (f"execution-{e}", Event(step=step), e % 5)
            for step in range(EVENTS_PER_EXECUTION)
            for e in range(EXECUTIONS)
        )
    journals = [directory / f"worker-{n}.log" for n in range(WORKERS)]
    workers = [
        multiprocessing.Process(target=work, args=(url, f"worker-{n}", journals[n]))
        for n in range(WORKERS)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join()
    elapsed = time.perf_counter() - started

    seen: dict[str, list[tuple[int, int, int]]] = {}
    for journal in journals:
        for line in journal.read_text().splitlines():
            group, step, claimed, done = line.split()
            seen.setdefault(group, []).append((int(claimed), int(done), int(step)))
    expected = list(range(EVENTS_PER_EXECUTION))
    # In order: by claim time, the steps count up. One at a time: each event of a group
    # was claimed after the previous one was done.
    in_order = all(
        [step for _, _, step in sorted(events)] == expected
        and all(later[0] > earlier[1] for earlier, later in pairwise(sorted(events)))
        for events in seen.values()
    )
    handled = sum(len(steps) for steps in seen.values())
    ok = len(seen) == EXECUTIONS and in_order and handled == EXECUTIONS * EVENTS_PER_EXECUTION
    print(
        f"{'OK' if ok else 'FAILED'}: {handled} events of {len(seen)} executions handled by "
        f"{WORKERS} worker processes in {elapsed:.2f}s ({handled / elapsed:.0f} events/s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(tmp)))
