"""The contention scenario: two workers on one queue, checked by the journal."""

from __future__ import annotations

import random
import time
from pathlib import Path

from transports_core import Event, Transport
from transports_core.conformance.journal import check, read
from transports_worker._context import AsyncContext, Context
from transports_worker._outcomes import Retry

from ._support import PATIENCE, Journaling, Start


class ContentionScenarios:
    """Several workers share a queue: per-group order, one holder at a time, no loss."""

    def test_two_workers_keep_each_group_in_order_one_at_a_time_and_lose_nothing(
        self,
        start: Start,
        store: Transport[Event],
        tmp_path: Path,
    ) -> None:
        groups, per_group = 6, 8
        published: dict[int, str] = {}
        for n in range(per_group):
            for g in range(groups):
                published[store.publish(f"g{g}", Event(n=n))] = f"g{g}"
        journals = [tmp_path / "w0.jsonl", tmp_path / "w1.jsonl"]
        recorders = [Journaling(path, len(published)) for path in journals]
        rng = random.Random(17)
        holds = [rng.uniform(0, 0.02) for _ in range(64)]

        def handle(event: Event, ctx: Context[Event]) -> None:
            held = Journaling.begin(ctx.lease)
            try:
                ctx.sleep(holds[ctx.lease.seq % len(holds)])
                if ctx.lease.seq % 5 == 0 and ctx.attempt == 1:
                    raise Retry(0.01)
            finally:
                held.end()

        async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
            held = Journaling.begin(ctx.lease)
            try:
                await ctx.sleep(holds[ctx.lease.seq % len(holds)])
                if ctx.lease.seq % 5 == 0 and ctx.attempt == 1:
                    raise Retry(0.01)
            finally:
                held.end()

        running = [start(handle, ahandle, concurrency=4, hooks=[r]) for r in recorders]
        deadline = time.monotonic() + PATIENCE
        while sum(r.acked for r in recorders) < len(published):
            assert time.monotonic() < deadline, "the two workers did not drain the queue"
            recorders[0].wait(0.1)
        for worker in running:
            assert worker.stop() == 0
        for recorder in recorders:
            recorder.close()
        problems = check(published, read(journals))
        assert not problems, "\n".join(problems)
