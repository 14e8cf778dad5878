"""Scenarios of many workers at once: threads, and OS processes where the store can be
opened by URL from another process. Each checks that nothing is lost, nothing is
delivered twice, every group keeps its order, and no group is ever leased twice at once.
(The asyncio-task version is in `_async_native`.)"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from transports_core import Event, Transport

from . import journal
from ._base import MULTI_HANDLE, MULTIPROCESS, SuiteBase, checks
from ._properties import CONTENTION_PROCESSES, CONTENTION_THREADS
from ._steps import ev
from ._workers import work, work_async

GROUPS = 6
PER_GROUP = 12
THREADS = 4
PROCESSES = 3
PROCESS_PER_GROUP = 40


def check_journal(
    prop: str, published: dict[int, tuple[str, int]], journal: list[tuple[int, str, int, int]]
) -> None:
    """``journal``: (seq, group, n, attempt) in the order each worker finished them."""
    counts = Counter(seq for seq, *_ in journal)
    duplicates = sorted(seq for seq, c in counts.items() if c > 1)
    lost = sorted(set(published) - set(counts))
    assert not lost, f"{prop}: {len(lost)} of {len(published)} messages never delivered: {lost}"
    assert not duplicates, f"{prop}: messages delivered more than once: seqs {duplicates}"
    for seq, group, n, attempt in journal:
        assert (*published.get(seq, ()), attempt) == (group, n, 1), (
            f"{prop}: seq {seq} came as group {group!r} n={n} attempt {attempt}; "
            f"it was published as {published.get(seq)}, and no lease ran out"
        )


class ContentionScenarios(SuiteBase):
    @checks(CONTENTION_THREADS)
    def test_contention_threads_lose_nothing_and_keep_groups_exclusive(self) -> None:
        # Independent handles when the backend has them, else one handle shared by all.
        shared = None if self.has(MULTI_HANDLE) else self.open()
        handles = [self.open() if shared is None else shared for _ in range(THREADS + 2)]
        for handle in handles:  # connect now: lazy connects are not what this is about
            handle.publish_many([])
        published: dict[int, tuple[str, int]] = {}
        journal: list[tuple[int, str, int, int]] = []
        order: dict[str, list[int]] = {}
        in_flight: dict[str, str] = {}
        overlaps: list[str] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        deadline = time.monotonic() + 60

        publishing = [2]

        def publisher(t: Transport[Event], groups: list[str]) -> None:
            for n in range(PER_GROUP):
                for group in groups:
                    seq = t.publish(group, ev(n))
                    with lock:
                        published[seq] = (group, n)
            with lock:
                publishing[0] -= 1

        def worker(t: Transport[Event], worker_id: str) -> None:
            hold = random.Random(worker_id)
            # Stop at the first None once publishing is over: whoever holds a lease then
            # claims again after its ack, so no deliverable message is left behind.
            while time.monotonic() < deadline:
                with lock:
                    done = publishing[0] == 0
                lease = t.claim(worker_id, self.hold)
                if lease is None:
                    if done:
                        return
                    time.sleep(0.001)
                    continue
                group = lease.group_id
                with lock:
                    if group in in_flight:
                        overlaps.append(f"{group}: {in_flight[group]} and {worker_id}")
                    in_flight[group] = worker_id
                time.sleep(hold.uniform(0, 0.002))  # others try this group while it is held
                with lock:
                    in_flight.pop(group, None)
                    journal.append((lease.seq, group, lease.event.n, lease.attempt))
                    order.setdefault(group, []).append(lease.event.n)
                t.ack(lease)

        def guarded(target: Callable[..., object], *args: object) -> threading.Thread:
            def run() -> None:
                try:
                    target(*args)
                except BaseException as exc:  # reported below, in the test's thread
                    errors.append(exc)

            return threading.Thread(target=run, daemon=True)

        names = [f"g{i}" for i in range(GROUPS)]
        threads = [
            guarded(publisher, handles[0], names[::2]),
            guarded(publisher, handles[1], names[1::2]),
            *(guarded(worker, handles[2 + i], f"w{i}") for i in range(THREADS)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(70)
        if errors:
            raise AssertionError(
                f"{CONTENTION_THREADS}: a thread raised {errors[0]!r}"
            ) from errors[0]
        assert not overlaps, f"{CONTENTION_THREADS}: groups leased twice at once: {overlaps}"
        check_journal(CONTENTION_THREADS, published, journal)
        for group in names:
            assert order[group] == list(range(PER_GROUP)), (
                f"{CONTENTION_THREADS}: group {group!r} was handled in order {order[group]}"
            )

    @checks(CONTENTION_PROCESSES)
    def test_contention_processes_lose_nothing_and_keep_groups_exclusive(
        self, tmp_path: Path
    ) -> None:
        self.require(MULTIPROCESS)
        url = self._request_url()
        t = self.open()
        # Few groups and many messages: every claim contends for the same few heads.
        items = [(f"g{i}", ev(k), 0) for k in range(PROCESS_PER_GROUP) for i in range(3)]
        seqs = t.publish_many(items)
        published = {seq: group for seq, (group, _, _) in zip(seqs, items, strict=True)}
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Barrier(PROCESSES)
        target = work_async if self._async_twin else work
        journals = [tmp_path / f"worker-{i}.jsonl" for i in range(PROCESSES)]
        children = [
            ctx.Process(target=target, args=(url, f"p{i}", str(journals[i]), start))
            for i in range(PROCESSES)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(120)
        codes = [child.exitcode for child in children]
        entries = journal.read(journals)
        problems = journal.check(published, entries)
        assert not problems, f"{CONTENTION_PROCESSES}: " + "; ".join(problems)
        assert codes == [0] * PROCESSES, f"{CONTENTION_PROCESSES}: worker exit codes {codes}"
        again = sorted(e.seq for e in entries if e.attempt != 1)
        assert not again, (
            f"{CONTENTION_PROCESSES}: seqs {again} were delivered more than once, and no "
            "lease ran out"
        )
        assert t.claim("w1", self.hold) is None, f"{CONTENTION_PROCESSES}: messages left over"

    def _request_url(self) -> str:
        url: str = self._request.getfixturevalue("transport_url")
        return url
