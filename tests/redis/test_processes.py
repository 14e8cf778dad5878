"""Several OS processes on one queue, checked from an independent journal, and a SIGKILLed
lease holder whose message comes back once its lease lapses."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from transports_core import Event, LeaseLost, Transport

from . import _workers

GROUPS = 12
PER_GROUP = 25
WORKERS = 4


def test_processes_share_a_queue_in_order_and_one_at_a_time_per_group(
    queue: Transport[Event], queue_url: str, tmp_path: Path
) -> None:
    published: dict[int, tuple[str, int]] = {}
    items = [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
    for (group, event, _), given in zip(items, queue.publish_many(items), strict=True):
        published[given] = (group, event.n)
    spawn = multiprocessing.get_context("spawn")
    journals = [tmp_path / f"w{i}.journal" for i in range(WORKERS)]
    together = spawn.Barrier(WORKERS)
    children = [
        spawn.Process(target=_workers.work, args=(queue_url, f"w{i}", str(journal), together))
        for i, journal in enumerate(journals)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    _workers.check_journals(journals, published)
    assert sum(1 for journal in journals if journal.read_text()) >= 2  # the work was shared
    assert queue.claim("after", 5) is None


@pytest.mark.slow
def test_a_sigkilled_holder_s_message_comes_back_after_its_lease(
    queue: Transport[Event], queue_url: str, tmp_path: Path
) -> None:
    seq = queue.publish("g", Event(n=1))
    queue.publish("g", Event(n=2))
    report = tmp_path / "held.json"
    child = multiprocessing.get_context("spawn").Process(
        target=_workers.hold, args=(queue_url, 1.0, str(report))
    )
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not report.exists():
            assert child.is_alive()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        held = json.loads(report.read_text())
        assert (held["seq"], held["attempt"]) == (seq, 1)
        assert queue.claim("other", 5) is None  # the group is held by the child
    finally:
        child.kill()
        child.join()
    lease = queue.claim("other", 5, wait=5)
    assert lease is not None
    assert (lease.seq, lease.attempt, lease.event.n) == (seq, 2, 1)
    assert time.time() >= held["expires_at"]
    queue.ack(lease)
    nxt = queue.claim("other", 5)
    assert nxt is not None
    assert nxt.event.n == 2
    queue.ack(nxt)
    with pytest.raises(LeaseLost):
        queue.ack(lease)
