"""The transport-level benchmark cases, against any transport: publish, publish_many,
claim+ack, claim_many+ack_many, an ack_and_claim loop (the claim+ack and ack_and_claim
ones through the async twin too) and several worker processes draining one store; and
what a run of them needs besides: its sizes, the machine's description and a progress bar.

``transports bench`` runs them against a URL; the repository's ``python -m bench`` runs
the same functions against fresh SQLite files next to its raw-sqlite floor, so there is
one copy of the timing code. A case is a context manager: entering it prepares (not
timed), and it yields a *round*, a callable doing ``n`` operations that `interleaved`
times. Results are plain data: rates in messages per second, every round kept. The
drains (``drain_*``) are the rounds' bodies on their own, for callers that fill the queue
their own way (``python -m bench.batch`` refills it before each round).

Imports no backend: a case gets an open transport, or a URL and options to open one.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import platform
import queue
import statistics
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from transports_core import AsyncTransport, Event, Transport, open_transport

__all__ = [
    "BATCH",
    "BATCH_GROUPS",
    "EVENT",
    "FULL",
    "LIMIT",
    "QUICK",
    "VISIBILITY",
    "WORKER",
    "Result",
    "Round",
    "Sizes",
    "ack_and_claim",
    "ack_and_claim_async",
    "claim_ack",
    "claim_ack_async",
    "claim_many",
    "drain_ack_and_claim",
    "drain_ack_and_claim_async",
    "drain_batches",
    "drain_claim_ack",
    "drain_claim_ack_async",
    "interleaved",
    "items",
    "machine",
    "processes",
    "progress",
    "publish",
    "publish_many",
    "summary",
]

# Every case sends this event (the raw cases of `python -m bench` its JSON text).
EVENT = Event(kind="step.completed", execution="exec-000042", step=7, payload="x" * 64)
WORKER = "bench-worker"
VISIBILITY = 30.0
BATCH = 1000  # messages per publish_many call
LIMIT = 50  # messages per claim_many call
BATCH_GROUPS = 500  # groups of the claim_many case's backlog: at least LIMIT

Result = dict[str, Any]
Round = Callable[[], None]


@dataclass(frozen=True)
class Sizes:
    """How much one run of the cases does."""

    n: int  # publish calls, and claim+ack cycles, per round
    rounds: int
    batches: int  # publish_many calls of `BATCH` messages per round
    total: int  # messages drained by each worker-process case


FULL = Sizes(n=500, rounds=5, batches=5, total=2000)
QUICK = Sizes(n=50, rounds=2, batches=1, total=200)


def machine() -> dict[str, Any]:
    """What a report says about where it ran."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "thread_trip_us": thread_trip() * 1e6,
    }


def thread_trip(trips: int = 2000) -> float:
    """Median seconds for an event loop to hand a call to another thread and be woken
    with its answer: what an async transport pays for each call it runs off the loop."""
    calls: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None]
    calls = queue.SimpleQueue()

    def serve() -> None:
        while (call := calls.get()) is not None:
            loop, future = call
            loop.call_soon_threadsafe(future.set_result, None)

    async def trip() -> list[float]:
        loop = asyncio.get_running_loop()
        times = []
        for _ in range(trips):
            began = time.perf_counter()
            future = loop.create_future()
            calls.put((loop, future))
            await future
            times.append(time.perf_counter() - began)
        return times

    thread = threading.Thread(target=serve, name="bench-thread-trip", daemon=True)
    thread.start()
    try:
        return statistics.median(asyncio.run(trip()))
    finally:
        calls.put(None)
        thread.join()


@contextmanager
def progress(show: bool, total: int, width: int = 16) -> Iterator[Callable[[str], None]]:
    """A callable telling a bar on stderr that one of ``total`` steps, ``name``, is done;
    it does nothing unless ``show``."""
    if not show:
        yield lambda name: None
        return
    columns = (
        TextColumn(f"{{task.description:<{width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("benchmark", total=total)
        yield lambda name: bar.update(task, advance=1, description=name)


def summary(unit: str, rounds: list[float], **extra: Any) -> Result:
    return {"unit": unit, "median": statistics.median(rounds), "rounds": rounds, **extra}


def items(n: int, groups: int, prefix: str = "group-") -> list[tuple[str, Event, int]]:
    """``n`` messages spread round-robin over ``groups`` groups named ``prefix`` + number."""
    return [(f"{prefix}{i % groups}", EVENT, 0) for i in range(n)]


def interleaved(
    rounds: int,
    n: int,
    cases: Mapping[str, AbstractContextManager[Round]],
    on_round: Callable[[str], None] | None = None,
) -> dict[str, Result]:
    """Messages per second of each case (``n`` per round), the cases' rounds taken in turn.

    On a shared, noisy machine a burst of load then hits every case of a comparison
    alike, so their ratio stays meaningful. ``on_round`` is told each finished round.
    """
    rates: dict[str, list[float]] = {name: [] for name in cases}
    with ExitStack() as stack:
        runs = {name: stack.enter_context(case) for name, case in cases.items()}
        for r in range(rounds):
            names = list(runs)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                runs[name]()
                rates[name].append(n / (time.perf_counter() - start))
                if on_round is not None:
                    on_round(name)
    return {name: summary("msg/s", rates[name]) for name in cases}


# -- drains: a round of each way of consuming, on whatever is queued --------------------


def drain_claim_ack(transport: Transport[Event], n: int) -> None:
    """``n`` messages, each claimed then acked on its own: two calls a message."""
    for _ in range(n):
        lease = transport.claim(WORKER, VISIBILITY)
        if lease is None:
            raise RuntimeError("claim+ack: the backlog ran out (another consumer?)")
        transport.ack(lease)


def drain_batches(transport: Transport[Event], n: int, limit: int = LIMIT) -> None:
    """``n`` messages, ``claim_many`` of ``limit`` then ``ack_many`` of what it leased."""
    left = n
    while left:
        leases = transport.claim_many(WORKER, VISIBILITY, min(limit, left))
        if not leases:
            raise RuntimeError("claim_many: the backlog ran out (another consumer?)")
        if stale := transport.ack_many(leases):
            raise RuntimeError(f"ack_many: {len(stale)} leases lost")
        left -= len(leases)


def drain_ack_and_claim(transport: Transport[Event], n: int) -> None:
    """``n`` messages the way a worker loop does it: a claim, then ``ack_and_claim`` of
    each lease, which leases the next, then an ack of the last: one call a message."""
    lease = transport.claim(WORKER, VISIBILITY)
    for _ in range(n - 1):
        if lease is None:
            break
        lease = transport.ack_and_claim(lease, WORKER, VISIBILITY)
    if lease is None:
        raise RuntimeError("ack_and_claim: the backlog ran out (another consumer?)")
    transport.ack(lease)


async def drain_claim_ack_async(transport: AsyncTransport[Event], n: int) -> None:
    """`drain_claim_ack` through the async twin."""
    for _ in range(n):
        lease = await transport.claim(WORKER, VISIBILITY)
        if lease is None:
            raise RuntimeError("claim+ack: the backlog ran out (another consumer?)")
        await transport.ack(lease)


async def drain_ack_and_claim_async(transport: AsyncTransport[Event], n: int) -> None:
    """`drain_ack_and_claim` through the async twin."""
    lease = await transport.claim(WORKER, VISIBILITY)
    for _ in range(n - 1):
        if lease is None:
            break
        lease = await transport.ack_and_claim(lease, WORKER, VISIBILITY)
    if lease is None:
        raise RuntimeError("ack_and_claim: the backlog ran out (another consumer?)")
    await transport.ack(lease)


# -- cases: a backlog published up front, then rounds of a drain ----------------------------


@contextmanager
def _case(
    transport: Transport[Event],
    n: int,
    rounds: int,
    prefix: str,
    groups: int,
    drain: Callable[[Transport[Event], int], None],
) -> Iterator[Round]:
    """A backlog of ``rounds`` x ``n`` messages over ``groups`` published up front, then
    ``drain`` of ``n`` a round."""
    transport.publish_many(items(n * rounds, groups, prefix))
    yield lambda: drain(transport, n)


def claim_ack(
    transport: Transport[Event], n: int, rounds: int, prefix: str = "group-", groups: int = 10
) -> AbstractContextManager[Round]:
    """Claim and ack ``n`` messages per round, from a backlog published up front."""
    return _case(transport, n, rounds, prefix, groups, drain_claim_ack)


def claim_many(
    transport: Transport[Event],
    n: int,
    rounds: int,
    prefix: str = "group-",
    limit: int = LIMIT,
    groups: int = BATCH_GROUPS,
) -> AbstractContextManager[Round]:
    """`drain_batches` of ``limit``, ``n`` messages per round, over enough groups that
    every batch can be full (a group leases one message at a time)."""
    drain = functools.partial(drain_batches, limit=limit)
    return _case(transport, n, rounds, prefix, max(groups, limit), drain)


def ack_and_claim(
    transport: Transport[Event], n: int, rounds: int, prefix: str = "group-", groups: int = 10
) -> AbstractContextManager[Round]:
    """`drain_ack_and_claim`, ``n`` messages per round."""
    return _case(transport, n, rounds, prefix, groups, drain_ack_and_claim)


@contextmanager
def _async_case(
    open_async: Callable[[], AsyncTransport[Event]],
    n: int,
    rounds: int,
    prefix: str,
    groups: int,
    drain: Callable[[AsyncTransport[Event], int], Coroutine[Any, Any, None]],
) -> Iterator[Round]:
    """A drain through the async twin, on an event loop of its own."""
    loop = asyncio.new_event_loop()
    try:
        transport = open_async()
        try:
            loop.run_until_complete(transport.publish_many(items(n * rounds, groups, prefix)))
            yield lambda: loop.run_until_complete(drain(transport, n))
        finally:
            loop.run_until_complete(transport.close())
    finally:
        loop.close()


def claim_ack_async(
    open_async: Callable[[], AsyncTransport[Event]],
    n: int,
    rounds: int,
    prefix: str = "group-",
    groups: int = 10,
) -> AbstractContextManager[Round]:
    """`claim_ack` through the async twin, on an event loop of its own."""
    return _async_case(open_async, n, rounds, prefix, groups, drain_claim_ack_async)


def ack_and_claim_async(
    open_async: Callable[[], AsyncTransport[Event]],
    n: int,
    rounds: int,
    prefix: str = "group-",
    groups: int = 10,
) -> AbstractContextManager[Round]:
    """`ack_and_claim` through the async twin, on an event loop of its own."""
    return _async_case(open_async, n, rounds, prefix, groups, drain_ack_and_claim_async)


@contextmanager
def publish(
    transport: Transport[Event], n: int, prefix: str = "group-", groups: int = 10
) -> Iterator[Round]:
    """``n`` calls of ``publish`` per round, one message each."""

    def run() -> None:
        for i in range(n):
            transport.publish(f"{prefix}{i % groups}", EVENT)

    yield run


@contextmanager
def publish_many(
    transport: Transport[Event], batches: int, prefix: str = "group-", groups: int = 10
) -> Iterator[Round]:
    """``batches`` calls of ``publish_many`` per round, `BATCH` messages each."""
    batch = items(BATCH, groups, prefix)

    def run() -> None:
        for _ in range(batches):
            transport.publish_many(batch)

    yield run


def _worker(url: str, options: Mapping[str, object], ready: Any, start: Any, out: Any) -> None:
    done, errors, signalled = 0, [], False
    try:
        with open_transport(url, **options) as t:
            ready.put(os.getpid())
            signalled = True
            start.wait()
            while True:
                lease = t.claim(f"worker-{os.getpid()}", VISIBILITY)
                if lease is None:
                    break
                t.ack(lease)
                done += 1
    except Exception as exc:  # reported, not raised: the parent counts what reached callers
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        if not signalled:
            ready.put(os.getpid())
    out.put((done, errors))


def processes(
    url: str,
    options: Mapping[str, object],
    workers: int,
    total: int,
    prefix: str = "group-",
    groups: int = 1000,
) -> Result:
    """``workers`` processes draining ``total`` messages from one store together: the
    total rate, from the moment all are connected until the last finds nothing left.

    ``drained`` is whether every message was acked exactly once and a claim afterwards
    finds nothing; a message left over is nacked, for the caller to clean up.
    """
    # spawn: fresh interpreters, as separate worker deployments would be.
    ctx = multiprocessing.get_context("spawn")
    with open_transport(url, **options) as t:
        t.publish_many(items(total, groups, prefix))
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, dict(options), ready, start, out))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every process has imported and connected before the clock starts
            ready.get(timeout=120)
        began = time.perf_counter()
        start.set()
        results = [out.get(timeout=600) for _ in procs]
        elapsed = time.perf_counter() - began
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    with open_transport(url, **options) as t:
        left = t.claim("bench-check", VISIBILITY)
        if left is not None:
            t.nack(left)
    done = sum(count for count, _ in results)
    errors = [e for _, errs in results for e in errs]
    return {
        "unit": "msg/s",
        "median": done / elapsed,
        "workers": workers,
        "done": done,
        "errors": errors,
        "drained": left is None and done == total,
    }
