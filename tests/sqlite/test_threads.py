"""One transport object shared by several threads publishing and consuming at once."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from transports_core import Event, open_transport

from ._support import message_count

PUBLISHERS = 4
CONSUMERS = 4
PER_PUBLISHER = 60
GROUPS = 6


class Handled(NamedTuple):
    consumer: int
    group: str
    seq: int
    attempt: int
    publisher: int
    number: int
    claimed: int
    acking: int


def test_threads_sharing_one_transport_lose_nothing_and_keep_group_order(
    tmp_path: Path,
) -> None:
    db = tmp_path / "queue.db"
    total = PUBLISHERS * PER_PUBLISHER
    published: list[tuple[str, int]] = []
    handled: list[Handled] = []
    errors: list[BaseException] = []
    count_lock = threading.Lock()
    start = threading.Barrier(PUBLISHERS + CONSUMERS, timeout=30)

    with open_transport(f"sqlite:///{db}", synchronous="normal") as t:

        def publisher(p: int) -> None:
            start.wait()
            for index in range(PER_PUBLISHER):
                group = f"g{(p + index) % GROUPS}"
                published.append((group, t.publish(group, Event(p=p, number=index))))

        def consumer(c: int) -> None:
            start.wait()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                with count_lock:
                    if len(handled) >= total:
                        return
                lease = t.claim(f"c{c}", visibility=60)
                if lease is None:
                    time.sleep(0.0005)
                    continue
                claimed = time.monotonic_ns()
                acking = time.monotonic_ns()
                t.ack(lease)
                event = lease.event
                with count_lock:
                    handled.append(
                        Handled(
                            c,
                            lease.group_id,
                            lease.seq,
                            lease.attempt,
                            event.p,
                            event.number,
                            claimed,
                            acking,
                        )
                    )
            raise AssertionError(f"consumer c{c} gave up with {len(handled)}/{total} handled")

        def guarded(target: Callable[[int], None], n: int) -> Callable[[], None]:
            def run() -> None:
                try:
                    target(n)
                except BaseException as exc:
                    errors.append(exc)
                    start.abort()

            return run

        threads = [threading.Thread(target=guarded(publisher, n)) for n in range(PUBLISHERS)] + [
            threading.Thread(target=guarded(consumer, n)) for n in range(CONSUMERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
    assert errors == []

    seqs = Counter(h.seq for h in handled)
    assert sorted(seqs) == sorted(seq for _, seq in published), "a message was lost"
    assert [seq for seq, n in seqs.items() if n > 1] == [], "a message was delivered twice"
    assert {h.attempt for h in handled} == {1}
    assert message_count(db) == 0

    by_group: dict[str, list[Handled]] = defaultdict(list)
    for h in handled:
        by_group[h.group].append(h)
    assert len(by_group) == GROUPS
    for group, items in by_group.items():
        items.sort(key=lambda h: h.claimed)
        assert [h.seq for h in items] == sorted(h.seq for h in items), f"{group} out of order"
        for before, after in pairwise(items):
            assert before.acking < after.claimed, f"two leases live at once on {group}"
        per_publisher: dict[int, list[int]] = defaultdict(list)
        for h in items:
            per_publisher[h.publisher].append(h.number)
        for indexes in per_publisher.values():
            assert indexes == sorted(indexes)
    assert len({h.consumer for h in handled}) > 1, "one consumer did all the work"
