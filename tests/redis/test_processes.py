"""A SIGKILLed lease holder whose message comes back once its lease lapses. (Several
processes draining one queue is the conformance suite's contention-processes scenario.)"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from transports_core import Event, LeaseLost, Transport

from . import _workers


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
