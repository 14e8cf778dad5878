"""The admin interface's reads: what they count, in what order, and that they change
nothing."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from transports_core import (
    Event,
    PriorityStats,
    QueueStats,
    TransportAdmin,
    open_transport,
)
from transports_core.conformance import ManualClock


def test_stats_count_each_state_per_priority(tmp_path: Path) -> None:
    clock = ManualClock()
    with open_transport(f"sqlite:///{tmp_path / 'q.db'}", clock=clock) as queue:
        assert isinstance(queue, TransportAdmin)
        assert queue.stats() == QueueStats(0, 0, 0, 0, ())
        for group, priority in [("a", 0), ("b", 0), ("c", 2), ("d", 2), ("e", 4)]:
            queue.publish(group, Event(), priority)
            queue.publish(group, Event(), priority)
        leased = [queue.claim("w", 10) for _ in range(3)]  # a, b (priority 0), c (2)
        assert [lease.group_id for lease in leased if lease] == ["a", "b", "c"]
        assert leased[1] is not None
        queue.nack(leased[1], delay=30)  # b parked
        lapsing = queue.claim("w", 1)  # d, with a short lease
        assert lapsing is not None
        clock.advance(5)  # d's lease lapses: its head counts as ready again

        stats = queue.stats()
        # Every ready message was published about 5 s ago (the clock ticks 1 us a read).
        ages = [p.oldest_ready_age for p in stats.by_priority]
        assert ages == pytest.approx([5, 5, 5], abs=1e-3)
        assert stats.oldest_ready_age == max(age for age in ages if age is not None)
        unaged = replace(
            stats,
            oldest_ready_age=None,
            by_priority=tuple(replace(p, oldest_ready_age=None) for p in stats.by_priority),
        )
        # Groups: a in flight and b parked are busy, d (lapsed) and e ready, c in flight.
        assert unaged == QueueStats(
            ready=7,
            in_flight=2,
            parked=1,
            dead=0,
            by_priority=(
                PriorityStats(0, 2, 1, 1, 0, ready_groups=0, busy_groups=2),
                PriorityStats(2, 3, 1, 0, 0, ready_groups=1, busy_groups=1),
                PriorityStats(4, 2, 0, 0, 0, ready_groups=1, busy_groups=0),
            ),
            ready_groups=2,
            busy_groups=3,
        )


def test_groups_lists_the_deepest_backlog_first_with_its_state(tmp_path: Path) -> None:
    clock = ManualClock()
    with open_transport(f"sqlite:///{tmp_path / 'q.db'}", clock=clock) as queue:
        assert isinstance(queue, TransportAdmin)
        for group, depth in [("shallow", 1), ("deep", 4), ("mid", 2), ("mid-later", 2)]:
            for _ in range(depth):
                queue.publish(group, Event())
        lease = queue.claim("w", 10)
        assert lease is not None
        assert lease.group_id == "shallow"
        claimed_at = lease.expires_at - 10
        parked = queue.claim("w", 10)
        assert parked is not None
        before = clock.now()
        queue.nack(parked, delay=60)
        after = clock.now()

        rows = [(g.group_id, g.depth, g.state) for g in queue.groups(limit=3)]
        assert rows == [("deep", 4, "parked"), ("mid", 2, "ready"), ("mid-later", 2, "ready")]
        busy_until = queue.groups(limit=1)[0].busy_until
        assert busy_until is not None
        assert before + 60 < busy_until <= after + 60
        assert [g.group_id for g in queue.groups(limit=10)][-1] == "shallow"
        shallow = queue.groups(limit=10)[-1]
        assert shallow.state == "in_flight"
        assert shallow.last_claimed_at == pytest.approx(claimed_at, abs=1e-6)
        with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
            queue.groups(limit=0)


def test_reads_take_no_lease_and_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with open_transport(f"sqlite:///{db}") as queue:
        assert isinstance(queue, TransportAdmin)
        queue.publish("g", Event(n=1))
        watcher = sqlite3.connect(db)
        (version,) = watcher.execute("PRAGMA data_version").fetchone()
        queue.stats()
        queue.groups()
        queue.dead_letters()
        queue.held_groups()
        assert watcher.execute("PRAGMA data_version").fetchone() == (version,)
        watcher.close()
        lease = queue.claim("w", 10)
        assert lease is not None
        assert lease.attempt == 1
