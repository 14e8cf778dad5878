"""Bad input is refused before anything reaches the server: no key of the queue appears."""

from __future__ import annotations

import pytest
import redis

from transports_core import Event, Transport


def test_a_bad_batch_writes_nothing(
    queue: Transport[Event], raw: redis.Redis, server_queue: tuple[str, str]
) -> None:
    pattern = f"dt:{{{server_queue[1]}}}:*"
    with pytest.raises(ValueError, match=r"items\[2\]"):
        queue.publish_many([("a", Event(n=1), 0), ("b", Event(n=2), 0), ("c", Event(n=3), 7)])
    with pytest.raises(ValueError, match="worker_id"):
        queue.claim("", 5)
    with pytest.raises(ValueError, match="wait"):
        queue.claim("w", 5, wait=-1)
    assert list(raw.scan_iter(match=pattern)) == []
    assert queue.publish_many([]) == []
    assert list(raw.scan_iter(match=pattern)) == []
