"""What `test_restart_under_worker` runs in its child processes: the worker runtime, or a
bare loop that retries its acks, each journaling every message it handles (one line a
handling: ``seq attempt``, flushed before the handling counts as done).

Run as ``python -m tests.redis._restart worker|bare URL JOURNAL``; stops on SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import TextIO

from transports_core import Event, Lease, LeaseLost, Transport, TransportError, open_transport
from transports_worker import Context, Worker

VISIBILITY = 5.0
SLOTS = 4  # messages in hand at once, in both modes
HANDLING = 0.01  # seconds a handling takes: a kill finds some under way


def _record(journal: TextIO, lease: Lease[Event]) -> None:
    time.sleep(HANDLING)
    journal.write(f"{lease.seq} {lease.attempt}\n")
    journal.flush()


def run_worker(url: str, journal: TextIO) -> int:
    lock = threading.Lock()

    def handle(event: Event, ctx: Context[Event]) -> None:
        with lock:
            _record(journal, ctx.lease)

    worker = Worker(url, handle, concurrency=SLOTS, visibility=VISIBILITY, grace=5)
    return worker.run()


def run_bare(url: str, journal: TextIO) -> int:
    """`SLOTS` threads, each with its own handle: claim, handle, ack; a failed claim is
    tried again after 0.1 s, and a failed ack until it succeeds or the lease is lost:
    what a careful hand-written loop does."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()

    def loop(worker_id: str) -> None:
        with open_transport(url) as transport:
            while not stop.is_set():
                try:
                    lease = transport.claim(worker_id, VISIBILITY, wait=0.5)
                except TransportError:
                    time.sleep(0.1)
                    continue
                if lease is None:
                    continue
                with lock:
                    _record(journal, lease)
                _ack(transport, lease)

    threads = [threading.Thread(target=loop, args=(f"bare-{n}",)) for n in range(SLOTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


def _ack(transport: Transport[Event], lease: Lease[Event]) -> None:
    while True:
        try:
            transport.ack(lease)
        except LeaseLost:
            return
        except TransportError:
            time.sleep(0.1)
            continue
        return


def main() -> int:
    mode, url, path = sys.argv[1:]
    with open(path, "a", encoding="utf-8") as journal:
        return (run_worker if mode == "worker" else run_bare)(url, journal)


if __name__ == "__main__":
    sys.exit(main())
