"""``python -m bench.worker``: what the worker runtime costs, on a SQLite file or any URL.

    python -m bench.worker                # a short run (well under a minute)
    python -m bench.worker --quick        # seconds: checks the command works
    python -m bench.worker --url 'postgresql://postgres@127.0.0.1/test?schema=bench_worker'
    python -m bench.worker --out r.json
    python -m bench.worker --concurrency 32 --batch both   # batches on against off
    python -m bench.worker --flavour both  # the sync Worker and the AsyncWorker

Two measurements:

* idle: the CPU time (user + system, every thread) a `Worker` spends per second of wall
  time on an empty queue, as a share of one core; the target is under 1 %.
* claim+ack: messages per second drained by the runtime with a no-op handler, against
  the bare loop (``claim`` then ``ack``, one handle per thread) on the same backend, at
  concurrency 1 and 8; the target is a ratio of at least 0.8. Each is the median of
  several rounds, taken in alternation so that a noisy moment hits both. Beside the
  rates: the process's CPU time (every thread) and context switches per message while
  draining, which show where a ratio comes from (see docs/worker.md, "What the worker
  costs"). ``--batch`` runs the worker with its batches (on, the default), without them
  (off), or both ways in the same rounds, with the ratio of the two.

``--flavour`` picks the runtime: the sync `Worker` (the default), the `AsyncWorker`, or
both in the same rounds. The async twin is measured the same way, each round on an event
loop of its own: an `AsyncWorker` with an async no-op handler, against a bare loop of
the async transport's ``claim`` then ``ack`` in as many tasks on one event loop. Its
figures go under ``"async"`` in the JSON, in the same shape as the sync ones.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import NamedTuple

from transports_core import AsyncTransport, Event, Transport, open_async_transport, open_transport
from transports_worker import AsyncContext, AsyncWorker, Context, Delivery, Hooks, Outcome, Worker

from ._scratch import own_queue

GROUPS = 64
FLAVOURS = ("sync", "async")
TARGET_IDLE = 0.01
TARGET_RATIO = 0.8


def _usage() -> tuple[float, int]:
    """The process's CPU seconds (user + system, every thread) and context switches."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


class Drain(NamedTuple):
    """One round of draining ``n`` messages: the rate, and per message the CPU time
    (microseconds) and context switches the whole process spent."""

    rate: float
    cpu_us: float
    switches: float

    @classmethod
    def timed(cls, n: int, run: Callable[[], None]) -> Drain:
        began = cls._begin()
        run()
        return cls._since(began, n)

    @classmethod
    async def timed_async(cls, n: int, run: Callable[[], Awaitable[object]]) -> Drain:
        began = cls._begin()
        await run()
        return cls._since(began, n)

    @staticmethod
    def _begin() -> tuple[float, float, int]:
        return (time.perf_counter(), *_usage())

    @classmethod
    def _since(cls, began: tuple[float, float, int], n: int) -> Drain:
        elapsed = time.perf_counter() - began[0]
        cpu, switches = _usage()
        return cls(n / elapsed, (cpu - began[1]) / n * 1e6, (switches - began[2]) / n)


def _noop(event: Event, ctx: Context[Event]) -> None:
    pass


async def _noop_async(event: Event, ctx: AsyncContext[Event]) -> None:
    pass


class _Count(Hooks):
    """Sets ``all`` once ``total`` deliveries have been settled, and calls ``then`` (an
    event loop's waiter cannot wait on a thread's event)."""

    def __init__(self, total: int, then: Callable[[], object] | None = None) -> None:
        self.total, self.done, self.all, self._then = total, 0, threading.Event(), then
        # next() on a count is atomic: no lock shared by the slots, which the bare loop has not.
        self._settled = itertools.count(1)

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        done = self.done = next(self._settled)
        if done == self.total:
            self.all.set()
            if self._then is not None:
                self._then()


def _fill(url: str, n: int) -> None:
    with open_transport(url) as handle:
        batch = [(f"g{i % GROUPS}", Event(i=i), 0) for i in range(n)]
        for start in range(0, n, 500):
            handle.publish_many(batch[start : start + 500])


def idle(url: str, seconds: float, flavour: str = "sync") -> float:
    """Share of one core used by a worker (an `AsyncWorker` when ``flavour`` is async,
    on an event loop in a thread of its own) waiting on an empty queue."""
    worker: Worker[Event] | AsyncWorker[Event]
    if flavour == "async":
        worker = AsyncWorker(url, _noop_async, handle_signals=False, hooks=[])
        target: Callable[[], object] = partial(asyncio.run, worker.run())
    else:
        worker = Worker(url, _noop, handle_signals=False, hooks=[])
        target = worker.run
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    time.sleep(1.0)  # past start-up: opening handles is not idling
    cpu, wall = _usage()[0], time.monotonic()
    time.sleep(seconds)
    used = (_usage()[0] - cpu) / (time.monotonic() - wall)
    worker.stop()
    thread.join()
    return used


def bare(url: str, n: int, concurrency: int) -> Drain:
    """``n`` messages drained by ``concurrency`` threads looping claim, ack."""
    _fill(url, n)
    handles = [open_transport(url) for _ in range(concurrency)]

    def drain(handle: Transport[Event]) -> None:
        while (lease := handle.claim("bare", 30.0)) is not None:
            handle.ack(lease)

    threads = [threading.Thread(target=drain, args=(h,)) for h in handles]

    def run() -> None:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    drained = Drain.timed(n, run)
    for handle in handles:
        handle.close()
    return drained


@contextmanager
def draining(
    source: Callable[[], Transport[Event]], n: int, concurrency: int, batch: bool = True
) -> Iterator[Callable[[], None]]:
    """A `Worker` with a no-op handler on handles from ``source``: the block gets the
    call that starts it and returns once it has settled ``n`` messages (the part to
    time); the worker is stopped when the block ends."""
    count = _Count(n)
    worker = Worker(
        source, _noop, concurrency=concurrency, handle_signals=False, hooks=[count], batch=batch
    )
    thread = threading.Thread(target=worker.run, daemon=True)

    def run() -> None:
        thread.start()
        if not count.all.wait(120):
            raise RuntimeError(f"the worker settled only {count.done} of {n}")

    try:
        yield run
    finally:
        worker.stop()
        if thread.ident is not None:
            thread.join()


def runtime(url: str, n: int, concurrency: int, batch: bool = True) -> Drain:
    """``n`` messages drained by a `Worker` with a no-op handler."""
    _fill(url, n)
    # Opened before the clock starts, as the bare loop's handles are: a claimer per slot
    # and one to renew (in batches, the worker takes three of them).
    handles = [open_transport(url) for _ in range(concurrency + 1)]
    try:
        with draining(handles.pop, n, concurrency, batch) as run:
            return Drain.timed(n, run)
    finally:
        for handle in handles:  # those the worker did not take
            handle.close()


async def _connected(handles: Sequence[AsyncTransport[Event]]) -> None:
    """Each handle connected before the clock starts, as the sync cases open theirs
    before it: the async twins connect on first use. Every message is published at
    priority 0, so a claim above it finds nothing."""
    await asyncio.gather(*(handle.claim("bench-warm", 30.0, min_priority=1) for handle in handles))


def bare_async(url: str, n: int, concurrency: int) -> Drain:
    """``n`` messages drained by ``concurrency`` tasks on one event loop, each looping
    claim, ack on a handle of its own."""
    _fill(url, n)

    async def drain(handle: AsyncTransport[Event]) -> None:
        while (lease := await handle.claim("bare", 30.0)) is not None:
            await handle.ack(lease)

    async def measure() -> Drain:
        handles = [open_async_transport(url) for _ in range(concurrency)]
        try:
            await _connected(handles)
            return await Drain.timed_async(
                n, lambda: asyncio.gather(*(drain(handle) for handle in handles))
            )
        finally:
            for handle in handles:
                await handle.close()

    return asyncio.run(measure())


@asynccontextmanager
async def draining_async(
    source: Callable[[], AsyncTransport[Event]], n: int, concurrency: int, batch: bool = True
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """`draining` for an `AsyncWorker`, run as a task of the running event loop."""
    finished = asyncio.Event()
    count = _Count(n, finished.set)
    worker = AsyncWorker(
        source,
        _noop_async,
        concurrency=concurrency,
        handle_signals=False,
        hooks=[count],
        batch=batch,
    )
    running: list[asyncio.Task[int]] = []

    async def run() -> None:
        task = asyncio.create_task(worker.run())
        running.append(task)
        waiting = asyncio.create_task(finished.wait())
        # A worker that fails ends its task: it is not waited on for the whole time.
        await asyncio.wait([task, waiting], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if task.done():
            task.result()  # what it raised
        if not finished.is_set():
            raise RuntimeError(f"the worker settled only {count.done} of {n}")

    try:
        yield run
    finally:
        worker.stop()
        for task in running:
            await task


def runtime_async(url: str, n: int, concurrency: int, batch: bool = True) -> Drain:
    """``n`` messages drained by an `AsyncWorker` with an async no-op handler."""
    _fill(url, n)

    async def measure() -> Drain:
        # Opened and connected before the clock starts, as `runtime` opens its handles.
        handles = [open_async_transport(url) for _ in range(concurrency + 1)]
        try:
            await _connected(handles)
            async with draining_async(handles.pop, n, concurrency, batch) as run:
                return await Drain.timed_async(n, run)
        finally:
            for handle in handles:  # those the worker did not take
                await handle.close()

    return asyncio.run(measure())


# Each flavour's bare loop and runtime.
LOOPS: dict[str, tuple[Callable[[str, int, int], Drain], Callable[..., Drain]]] = {
    "sync": (bare, runtime),
    "async": (bare_async, runtime_async),
}


def _report(label: str, concurrency: int, drains: dict[str, list[Drain]]) -> dict[str, object]:
    """Print one flavour's figures at one concurrency (``label`` leads its lines), and
    return them for the JSON."""
    rates = {name: [d.rate for d in values] for name, values in drains.items()}
    costs = {  # each column's median: rate, CPU and switches per message
        name: Drain(*(statistics.median(column) for column in zip(*values, strict=True)))
        for name, values in drains.items()
    }
    medians = {name: cost.rate for name, cost in costs.items()}
    ratio = medians["runtime"] / medians["bare"]
    entry: dict[str, object] = {
        **medians,
        "ratio": ratio,
        "all": rates,
        "per_message": {name: cost._asdict() for name, cost in costs.items()},
    }
    if "unbatched" in medians:
        batched = medians["runtime"] / medians["unbatched"]
        entry["batches_ratio"] = batched
        print(
            f"{label}batches, concurrency {concurrency}: on {medians['runtime']:,.0f}/s, "
            f"off {medians['unbatched']:,.0f}/s, ratio {batched:.2f}"
        )
    verdict = "ok" if ratio >= TARGET_RATIO else "MISSED"
    spread = ", ".join(f"{name} {min(v):,.0f}-{max(v):,.0f}" for name, v in rates.items())
    print(
        f"{label}claim+ack, concurrency {concurrency}: bare {medians['bare']:,.0f}/s, "
        f"runtime {medians['runtime']:,.0f}/s, ratio {ratio:.2f} "
        f"(target >= {TARGET_RATIO}) {verdict}; rounds' spread: {spread}"
    )
    print(
        "  per message: "
        + "; ".join(
            f"{name} {cost.cpu_us:.0f} us CPU, {cost.switches:.1f} context switches"
            for name, cost in costs.items()
        )
    )
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--messages", type=int, default=None, help="per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=None, help="per case (default 5)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        default=None,
        help="slots (repeat for several; default 1 and 8)",
    )
    parser.add_argument(
        "--batch",
        choices=["on", "off", "both"],
        default="on",
        help="the worker's batches: on (default), off, or both ways in the same rounds",
    )
    parser.add_argument(
        "--flavour",
        choices=["sync", "async", "both"],
        default="sync",
        help="the runtime: the sync Worker (default), the AsyncWorker, or both in the same rounds",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="the server to use: a schema or queue of the run's own, removed at the end,"
        " unless the URL names one (default: a new SQLite file per round)",
    )
    args = parser.parse_args(argv)
    n = args.messages or (200 if args.quick else 3000)
    rounds = args.rounds or (1 if args.quick else 5)
    idle_seconds = 1.0 if args.quick else 10.0
    results: dict[str, object] = {"messages": n, "rounds": rounds}
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-worker-"))
        # On a server, a schema or queue of the run's own: a shared one keeps the dead
        # rows of every earlier run where nothing vacuums them.
        url = args.url and stack.enter_context(own_queue(args.url, "bench-worker-"))
        counter = iter(range(10**6))

        def fresh() -> str:
            # Each round drains what it publishes, so a given queue is empty again after.
            return url or f"sqlite:///{Path(tmp) / f'q{next(counter)}.db'}"

        flavours = FLAVOURS if args.flavour == "both" else (args.flavour,)
        # The sync figures where they always were; the async ones under "async".
        into: dict[str, dict[str, object]] = {}
        for flavour in flavours:
            into[flavour] = results if flavour == "sync" else {}
            label = "" if flavour == "sync" else "async "
            share = idle(fresh(), idle_seconds, flavour)
            into[flavour]["idle_core_share"] = share
            verdict = "ok" if share < TARGET_IDLE else "MISSED"
            print(
                f"idle {label}worker: {share:.3%} of a core (target < {TARGET_IDLE:.0%}) {verdict}"
            )
        if "async" in into:
            results["async"] = into["async"]
        for concurrency in args.concurrency or (1, 8):
            cases: dict[tuple[str, str], Callable[[str, int, int], Drain]] = {}
            for flavour in flavours:
                bare_loop, worker_loop = LOOPS[flavour]
                cases[flavour, "bare"] = bare_loop
                if args.batch != "off":
                    cases[flavour, "runtime"] = worker_loop
                if args.batch != "on":
                    key = "runtime" if args.batch == "off" else "unbatched"
                    cases[flavour, key] = partial(worker_loop, batch=False)
            drains: dict[tuple[str, str], list[Drain]] = {case: [] for case in cases}
            for _ in range(rounds):
                for case, measure in cases.items():
                    drains[case].append(measure(fresh(), n, concurrency))
            for flavour in flavours:
                label = "" if flavour == "sync" else "async "
                own = {name: values for (of, name), values in drains.items() if of == flavour}
                into[flavour][f"concurrency_{concurrency}"] = _report(label, concurrency, own)
    results["cpus"] = os.cpu_count()
    results["backend"] = (args.url or "sqlite:").partition(":")[0]
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
