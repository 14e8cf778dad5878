"""One handle shared: threads on the sync transport, tasks on the async one, each message
handled exactly once and each group in order."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from transports_core import Event, Transport, open_async_transport

GROUPS = 10
PER_GROUP = 20


def test_threads_share_one_transport(queue: Transport[Event]) -> None:
    seqs = set(
        queue.publish_many(
            [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
        )
    )
    done: list[tuple[int, str, int]] = []
    lock = threading.Lock()

    def work(name: str) -> None:
        while (lease := queue.claim(name, 30, wait=0.3)) is not None:
            with lock:
                done.append((lease.seq, lease.group_id, lease.event.n))
            queue.ack(lease)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert Counter(seq for seq, _, _ in done) == Counter(seqs)
    for g in range(GROUPS):
        ns = [n for _, group, n in sorted(done) if group == f"g{g}"]
        assert ns == list(range(PER_GROUP))


def test_tasks_share_one_async_transport(queue_url: str) -> None:
    async def main() -> list[tuple[int, str, int]]:
        done: list[tuple[int, str, int]] = []
        async with open_async_transport(queue_url) as transport:
            await transport.publish_many(
                [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
            )

            async def work(name: str) -> None:
                while (lease := await transport.claim(name, 30, wait=0.3)) is not None:
                    done.append((lease.seq, lease.group_id, lease.event.n))
                    await transport.ack(lease)

            await asyncio.gather(*(work(f"a{i}") for i in range(6)))
        return done

    done = asyncio.run(main())
    assert len(done) == len({seq for seq, _, _ in done}) == GROUPS * PER_GROUP
    for g in range(GROUPS):
        assert [n for _, group, n in sorted(done) if group == f"g{g}"] == list(range(PER_GROUP))
