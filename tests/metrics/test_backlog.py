"""`QueueBacklog`: what it reads through the admin interface, and how seldom."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from transports_core import (
    DeadLetter,
    Event,
    GroupInfo,
    HeldGroup,
    QueueStats,
    TransportAdmin,
    open_transport,
)
from transports_worker import QueueBacklog


class Counting:
    """A real SQLite queue's admin interface, counting the reads."""

    def __init__(self, url: str) -> None:
        handle = open_transport(url)
        assert isinstance(handle, TransportAdmin)
        self.inner = handle
        self.reads = 0
        self.group_reads = 0
        self.closed = False

    def stats(self) -> QueueStats:
        self.reads += 1
        return self.inner.stats()

    def groups(self, limit: int = 10) -> list[GroupInfo]:
        self.group_reads += 1
        return self.inner.groups(limit)

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        return self.inner.dead_letters(limit)

    def held_groups(self) -> list[HeldGroup]:
        return self.inner.held_groups()

    def requeue(self, seq: int) -> bool:
        return self.inner.requeue(seq)

    def discard(self, seq: int) -> bool:
        return self.inner.discard(seq)

    def purge_group(self, group_id: str) -> int:
        return self.inner.purge_group(group_id)

    def close(self) -> None:
        self.closed = True
        close = getattr(self.inner, "close", None)
        assert close is not None
        close()


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        store.publish_many([("a", Event(n=1), 0), ("a", Event(n=2), 0), ("b", Event(n=3), 3)])
    return url


def test_a_sample_reads_the_totals_priorities_and_deepest_groups(url: str) -> None:
    backlog = QueueBacklog(url, groups=1)
    try:
        sample = backlog.sample()
    finally:
        backlog.close()
    assert sample.ok
    assert sample.totals == {"ready": 3, "in_flight": 0, "parked": 0, "dead": 0, "delayed": 0}
    assert sample.by_priority[(0, "ready")] == 2
    assert sample.by_priority[(3, "ready")] == 1
    assert (sample.keys, sample.held_groups) == (0, 0)
    assert sample.deepest == (("a", 2),)


def test_samples_within_the_cache_share_one_read(url: str) -> None:
    handles: list[Counting] = []

    def opener() -> TransportAdmin:
        handles.append(Counting(url))
        return cast(TransportAdmin, handles[-1])

    backlog = QueueBacklog(opener, cache=3600)
    first, second = backlog.sample(), backlog.sample()
    backlog.close()
    assert second is first
    [handle] = handles
    assert handle.reads == 1
    assert handle.closed


def test_with_no_cache_every_sample_reads_again_on_one_handle(url: str) -> None:
    handles: list[Counting] = []

    def opener() -> TransportAdmin:
        handles.append(Counting(url))
        return cast(TransportAdmin, handles[-1])

    backlog = QueueBacklog(opener, cache=0, groups=0)
    backlog.sample()
    backlog.sample()
    backlog.close()
    [handle] = handles
    assert handle.reads == 2
    assert handle.group_reads == 0, "groups=0 still listed groups"


def test_a_failed_read_is_cached_too_then_the_handle_is_opened_again(url: str) -> None:
    opened = 0

    def failing() -> TransportAdmin:
        nonlocal opened
        opened += 1
        raise ConnectionError("the store is down")

    cached = QueueBacklog(failing, cache=3600)
    sample = cached.sample()
    assert (sample.ok, sample.error, sample.totals) == (False, "the store is down", {})
    assert cached.sample() is sample
    assert opened == 1, "a failed read was not kept for the cache period"
    again = QueueBacklog(failing, cache=0)
    again.sample()
    again.sample()
    assert opened == 3, "no new handle after a failure"


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"groups": -1}, ValueError, "groups must be >= 0, got -1"),
        ({"groups": 1.5}, TypeError, "groups must be an int"),
        ({"cache": -1}, ValueError, "cache must be >= 0 seconds, got -1"),
    ],
)
def test_bad_options_are_refused_naming_them(
    url: str, options: dict[str, object], error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=said):
        QueueBacklog(url, **options)  # type: ignore[arg-type]
