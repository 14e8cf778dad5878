"""Several real OS processes on one database file, and a worker SIGKILLed mid-lease."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

from transports_core import Event, Lease, open_transport

from . import _workers
from ._support import message_count

WORKERS = 3
GROUPS = 12
PER_GROUP = 20


def test_processes_share_a_file_without_loss_duplicates_or_overlap(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    with open_transport(f"sqlite:///{db}") as t:
        items = [
            (f"g{group}", Event(index=index), 0)
            for index in range(PER_GROUP)
            for group in range(GROUPS)
        ]
        published = t.publish_many(items)
    expected_order = defaultdict(list)
    for seq, (group, _, _) in zip(published, items, strict=True):
        expected_order[group].append(seq)

    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    journals = [tmp_path / f"journal-{n}.jsonl" for n in range(WORKERS)]
    workers = [
        ctx.Process(target=_workers.consume, args=(str(db), f"w{n}", str(journals[n]), ready, go))
        for n in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=60)
        go.set()
        for worker in workers:
            worker.join(timeout=60)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
    records: list[dict[str, Any]] = [
        json.loads(line)
        for journal in journals
        if journal.exists()
        for line in journal.read_text().splitlines()
    ]
    assert [r for r in records if "error" in r] == []
    assert [w.exitcode for w in workers] == [0] * WORKERS
    seqs = Counter(r["seq"] for r in records)
    assert sorted(seqs) == sorted(published), "a message was lost"
    assert [seq for seq, n in seqs.items() if n > 1] == [], "a message was delivered twice"
    assert {r["attempt"] for r in records} == {1}, "a lease lapsed: the test proves less"
    assert len({r["worker"] for r in records}) > 1, "one process did all the work"
    assert message_count(db) == 0

    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_group[record["group"]].append(record)
    for group, handled in by_group.items():
        handled.sort(key=lambda r: r["claimed"])
        assert [r["seq"] for r in handled] == expected_order[group], f"{group} out of order"
        assert [r["index"] for r in handled] == list(range(PER_GROUP))
        for before, after in pairwise(handled):
            assert before["acking"] < after["claimed"], (
                f"two leases live at once on {group}: {before} and {after}"
            )


class RecordingClock:
    """The real clock, remembering the last time it gave out (a transaction's `now`)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        self.last = time.time()
        return self.last


def test_message_of_a_sigkilled_worker_is_redelivered_after_its_lease_lapses(
    tmp_path: Path,
) -> None:
    db = tmp_path / "queue.db"
    clock = RecordingClock()
    with open_transport(f"sqlite:///{db}", clock=clock) as t:
        first_seq = t.publish("g", Event(n=1))
        t.publish("g", Event(n=2))
        t.publish("h", Event(n=3))

        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_workers.hold_lease, args=(str(db), 1.0, send))
        child.start()
        try:
            assert receive.poll(60), "the child never reported its lease"
            seq, group, attempt, expires_at = receive.recv()
        finally:
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL
        assert (seq, group, attempt) == (first_seq, "g", 1)

        other = t.claim("rescuer", visibility=30)
        assert other is not None
        assert other.group_id == "h", "the dead worker's group must still be held"
        t.ack(other)

        redelivered: Lease[Any] | None = None
        deadline = time.monotonic() + 10
        while redelivered is None and time.monotonic() < deadline:
            redelivered = t.claim("rescuer", visibility=30)
            if redelivered is None:
                time.sleep(0.02)
        assert redelivered is not None, "the message was not delivered again within 10 s"
        assert (redelivered.seq, redelivered.attempt) == (first_seq, 2)
        assert redelivered.event == Event(n=1)
        assert clock.last > expires_at, "redelivered before the first lease expired"
        t.ack(redelivered)
        follower = t.claim("rescuer", visibility=30)
        assert follower is not None
        assert follower.event == Event(n=2)
