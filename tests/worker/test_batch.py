"""The worker in batches: with several slots it claims for all its free slots in one
``claim_many`` and settles in one ``settle_many``, claiming for a batch's slots while
the batch goes out (`Overlapping`); a stale lease in a batch is reported alone; what
waits to be settled is sent before the worker closes its handles; a transport without
the batch calls, or ``batch=False``, gets single calls; and a worker killed in the
middle of its batches loses nothing.

The calls are counted by `Counting`, which forwards every call to the real transport
underneath (SQLite files and PostgreSQL schemas, see ``conftest.py``)."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from tests.worker.test_api import REPO
from transports_core import (
    Event,
    LeaseLost,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_worker import AsyncContext, AsyncWorker, Context, Worker
from transports_worker._common import SettleQueue
from transports_worker.testing._support import PATIENCE, Recorder, RunningWorker

BATCH_CALLS = ("claim_many", "settle_many")
SLOTS = 4


class Counting:
    """A transport (either twin) that counts the calls made on it and the sizes of the
    batches, and forwards everything to ``inner``; with ``old`` it has no batch calls,
    as a backend written before them."""

    def __init__(
        self, inner: Any, calls: Counter[str], sizes: list[tuple[str, int]], *, old: bool = False
    ) -> None:
        self._inner, self._calls, self._sizes, self._old = inner, calls, sizes, old

    def __getattr__(self, name: str) -> Any:
        if self._old and name in BATCH_CALLS:
            raise AttributeError(name)
        value = getattr(self._inner, name)
        if not callable(value):
            return value
        calls, sizes = self._calls, self._sizes

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            if name == "settle_many":
                args = (list(args[0]),)
                sizes.append((name, len(args[0])))
            elif name == "claim_many":
                sizes.append((name, args[2]))
            return value(*args, **kwargs)

        return counted


class Run:
    """One worker of a flavour, on counted handles of ``url``, run on a thread."""

    def __init__(self, url: str, flavour: str, *, old: bool = False) -> None:
        self.url, self.flavour, self.old = url, flavour, old
        self.calls: Counter[str] = Counter()
        self.sizes: list[tuple[str, int]] = []
        self.recorder = Recorder()
        # For `Overlapping`: the claim_many and settle_many calls begun, whether each
        # settle_many saw the next claim_many begin, and the leases held now and at most.
        self.changed = threading.Condition()
        self.claims = self.settles = 0
        self.met: list[bool] = []
        self.held = self.most = 0

    def source(self) -> Callable[[], Any]:
        opener = open_transport if self.flavour == "sync" else open_async_transport
        return lambda: Counting(opener(self.url), self.calls, self.sizes, old=self.old)

    def start(
        self,
        handle: Callable[[Event, Context[Event]], None],
        ahandle: Callable[[Event, AsyncContext[Event]], Awaitable[None]] | None = None,
        *,
        window: float | None = None,
        **options: Any,
    ) -> RunningWorker:
        """Run ``handle``, or ``ahandle`` on the async worker (by default ``handle`` on
        a thread of the loop's executor)."""
        options = {
            "concurrency": SLOTS,
            "hooks": [self.recorder],
            "handle_signals": False,
            "grace": PATIENCE,
            **options,
        }
        worker: Any
        if self.flavour == "sync":
            worker = Worker(self.source(), handle, **options)
        else:

            async def in_thread(event: Event, ctx: AsyncContext[Event]) -> None:
                await asyncio.to_thread(handle, event, ctx)  # type: ignore[arg-type]

            worker = AsyncWorker(self.source(), ahandle or in_thread, **options)
        if window is not None:  # how long a settle waits for others, unless all wait
            worker._settles = SettleQueue(window)
        return RunningWorker(worker)

    def sent(self, name: str) -> list[int]:
        return [size for call, size in self.sizes if call == name]


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    chosen: str = request.param
    return chosen


@pytest.fixture
def store(queue_url: str) -> Any:
    with open_transport(queue_url) as handle:
        yield handle


def admin(store: Transport[Event]) -> TransportAdmin:
    return cast(TransportAdmin, store)


def _publish(store: Transport[Event], n: int) -> set[int]:
    return set(store.publish_many([(f"g{i}", Event(n=i), 0) for i in range(n)]))


class Gate:
    """Holds each handler until ``size`` of them have started: so that the slots fill
    together, and their settles fall due together."""

    def __init__(self, size: int) -> None:
        self._barrier = threading.Barrier(size)

    def __call__(self, event: Event, ctx: Context[Event]) -> None:
        self._barrier.wait(PATIENCE)


def test_free_slots_are_filled_by_one_claim_many_and_settled_by_one_settle_many(
    queue_url: str, flavour: str, store: Transport[Event]
) -> None:
    total = 3 * SLOTS
    _publish(store, total)
    run = Run(queue_url, flavour)
    running = run.start(Gate(SLOTS), window=PATIENCE)
    run.recorder.wait_settled(total)
    assert running.stop() == 0
    assert [outcome for _, _, outcome in run.recorder.outcomes()] == ["acked"] * total
    assert store.claim("check", 1.0) is None
    assert run.calls["claim"] == run.calls["ack"] == 0, run.calls
    # Each round: the slots are all free, one claim_many asks for all of them; all their
    # settles wait for each other (a long window), and go in one settle_many.
    # The next claim waits for every slot of the batch to come back, and claims for all.
    assert run.sent("claim_many")[:3] == [SLOTS] * 3, run.sizes
    assert run.sent("settle_many") == [SLOTS] * 3


class Overlapping(Counting):
    """`Counting`, where the n-th ``settle_many`` first waits (up to `OVERLAP_WAIT`) for
    the (n+1)-th ``claim_many`` to begin, and notes whether it did (``met``); and the
    most leases the worker held at once (claimed, less those settled), in ``most``."""

    def __init__(self, inner: Any, run: Run) -> None:
        super().__init__(inner, run.calls, run.sizes)
        self._run = run

    def _claim_begins(self) -> None:
        run = self._run
        with run.changed:
            run.claims += 1
            run.changed.notify_all()

    def _wait_for_claim(self) -> None:
        run = self._run
        with run.changed:
            run.settles += 1
            wanted = run.settles + 1
            run.met.append(run.changed.wait_for(lambda: run.claims >= wanted, OVERLAP_WAIT))

    def _held(self, change: int) -> None:
        run = self._run
        with run.changed:
            run.held += change
            run.most = max(run.most, run.held)

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        asynchronous = inspect.iscoroutinefunction(getattr(self._inner, name, None))
        if name == "claim_many":

            def claim_many(*args: Any, **kwargs: Any) -> Any:
                self._claim_begins()
                if not asynchronous:
                    leases = value(*args, **kwargs)
                    self._held(len(leases))
                    return leases

                async def claimed() -> Any:
                    leases = await value(*args, **kwargs)
                    self._held(len(leases))
                    return leases

                return claimed()

            return claim_many
        if name == "settle_many":

            def settle_many(items: Any) -> Any:
                items = list(items)
                if not asynchronous:
                    self._wait_for_claim()
                    stale = value(items)
                    self._held(-len(items))
                    return stale

                async def settled() -> Any:
                    await asyncio.to_thread(self._wait_for_claim)
                    stale = await value(items)
                    self._held(-len(items))
                    return stale

                return settled()

            return settle_many
        return value


OVERLAP_WAIT = 5.0


def test_freed_slots_are_claimed_for_while_their_batch_goes_out(
    queue_url: str, flavour: str, store: Transport[Event]
) -> None:
    # Each settle_many waits for a claim_many to begin: one does only if the slots of
    # the batch are free as it goes out, not once it is done. The worker then holds at
    # most twice its concurrency: the slots' leases and those of the batch on its way.
    total = 3 * SLOTS
    _publish(store, total)
    run = Run(queue_url, flavour)
    opener = open_transport if flavour == "sync" else open_async_transport
    run.source = lambda: lambda: Overlapping(opener(queue_url), run)  # type: ignore[method-assign]
    running = run.start(Gate(SLOTS), window=PATIENCE)
    run.recorder.wait_settled(total)
    assert running.stop() == 0
    assert [outcome for _, _, outcome in run.recorder.outcomes()] == ["acked"] * total
    assert run.sent("settle_many") == [SLOTS] * 3
    assert run.met == [True] * 3, "a batch's slots were claimed for only once it was done"
    assert SLOTS <= run.most <= 2 * SLOTS, run.most
    assert store.claim("check", 1.0) is None


def test_a_stale_lease_in_a_batch_is_reported_lost_and_the_others_are_settled(
    queue_url: str, flavour: str, store: Transport[Event]
) -> None:
    _publish(store, SLOTS)
    gate = Gate(SLOTS)
    taken_over: list[int] = []

    def handle(event: Event, ctx: Context[Event]) -> None:
        gate(event, ctx)
        if event.n == 1:  # someone else settles this one first: the worker's lease is stale
            store.ack(ctx.lease)
            taken_over.append(ctx.lease.seq)

    run = Run(queue_url, flavour)
    running = run.start(handle, window=PATIENCE)
    run.recorder.wait_settled(SLOTS)
    assert running.stop() == 0
    assert run.sent("settle_many") == [SLOTS]
    outcomes = {d.seq: (outcome, type(error)) for d, outcome, error in run.recorder.settled_}
    (stale,) = taken_over
    assert outcomes.pop(stale) == ("lost", LeaseLost)
    (lost,) = [error for d, _, error in run.recorder.settled_ if d.seq == stale]
    assert isinstance(lost, LeaseLost)
    assert lost.reason == "gone"  # the store says why: it was acked before the worker's ack
    assert set(outcomes.values()) == {("acked", type(None))}
    assert len(outcomes) == SLOTS - 1
    assert store.claim("check", 1.0) is None


def test_settles_waiting_at_stop_are_sent_before_the_handles_close(
    queue_url: str, flavour: str, store: Transport[Event]
) -> None:
    # Two slots: one message is handled at once, and its ack waits for the other's
    # handler, which runs until shutdown hands its lease back (grace 0). The window is
    # longer than the test's patience: only the worker's last sends can make the ack.
    store.publish("quick", Event(n=0))
    store.publish("slow", Event(n=1))
    both = threading.Barrier(2)

    def handle(event: Event, ctx: Context[Event]) -> None:
        both.wait(PATIENCE)
        if ctx.lease.group_id == "slow":
            ctx.sleep(3 * PATIENCE)  # until cancelled

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        await asyncio.to_thread(both.wait, PATIENCE)
        if ctx.lease.group_id == "slow":
            await asyncio.sleep(3 * PATIENCE)  # until cancelled

    run = Run(queue_url, flavour)
    running = run.start(handle, ahandle, window=3 * PATIENCE, concurrency=2, grace=0.0)
    deadline = time.monotonic() + PATIENCE
    while not running.worker._settles and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(running.worker._settles) == 1, "the quick ack is not waiting"
    assert running.stop() == 75  # the slow one handed back
    outcomes = {d.group_id: outcome for d, outcome, _ in run.recorder.settled_}
    assert outcomes == {"quick": "acked", "slow": "handed_back"}
    assert run.sent("settle_many") == [1]
    lease = store.claim("check", 1.0)
    assert lease is not None
    assert lease.group_id == "slow"
    store.ack(lease)
    assert store.claim("check", 1.0) is None


@pytest.mark.parametrize("why", ["no batch calls", "batch=False"])
def test_single_calls_without_the_batch_calls_or_when_turned_off(
    queue_url: str, flavour: str, store: Transport[Event], why: str
) -> None:
    total = 3 * SLOTS
    _publish(store, total)
    run = Run(queue_url, flavour, old=why == "no batch calls")
    running = run.start(lambda event, ctx: None, batch=why != "batch=False")
    run.recorder.wait_settled(total)
    assert running.stop() == 0
    assert [outcome for _, _, outcome in run.recorder.outcomes()] == ["acked"] * total
    assert run.calls["ack"] == total
    assert run.calls["claim"] >= total
    assert run.calls["claim_many"] == run.calls["settle_many"] == 0
    assert store.claim("check", 1.0) is None


# -- a worker killed mid-batch ---------------------------------------------------------

VISIBILITY = 2.0
MESSAGES = 120

VICTIM = """
import sys, time
from transports_worker import Worker

url, journal = sys.argv[1], sys.argv[2]
out = open(journal, "a", buffering=1)

def handle(event, ctx):
    out.write(f"{ctx.lease.seq} {ctx.lease.attempt}\\n")
    time.sleep(0.005)

Worker(url, handle, concurrency=8, visibility=VISIBILITY, handle_signals=False).run()
"""


@pytest.mark.slow
def test_a_worker_killed_mid_batch_loses_nothing(
    queue_url: str, store: Transport[Event], tmp_path: Path
) -> None:
    seqs = _publish(store, MESSAGES)
    journal = tmp_path / "victim.txt"
    journal.touch()
    victim = subprocess.Popen(
        [
            sys.executable,
            "-c",
            VICTIM.replace("VISIBILITY", repr(VISIBILITY)),
            queue_url,
            str(journal),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + PATIENCE
        while len(journal.read_text().splitlines()) < MESSAGES // 3:
            assert time.monotonic() < deadline, "the victim handled too little"
            assert victim.poll() is None, "the victim ended by itself"
            time.sleep(0.01)
        os.kill(victim.pid, signal.SIGKILL)  # in the middle of its claims and settles
    finally:
        victim.kill()
        victim.wait()
    started = {int(line.split()[0]) for line in journal.read_text().splitlines()}
    assert 0 < len(started) < MESSAGES
    # What the victim held when it died (it may hold nothing, between a batch of settles
    # and its next claim_many): each must come back, delivered again, once it lapses.
    held = {g.head_seq for g in admin(store).groups(MESSAGES) if g.state == "in_flight"}

    # A second worker takes what is left, and what the victim held once its leases lapse.
    handled: list[tuple[int, int]] = []
    lock = threading.Lock()

    def handle(event: Event, ctx: Context[Event]) -> None:
        with lock:
            handled.append((ctx.lease.seq, ctx.lease.attempt))

    survivor = Worker(
        queue_url, handle, concurrency=8, visibility=VISIBILITY, handle_signals=False, hooks=[]
    )
    running = RunningWorker(survivor)
    try:
        deadline = time.monotonic() + PATIENCE

        def again() -> set[int]:
            with lock:
                return {seq for seq, attempt in handled if attempt > 1}

        while started | {seq for seq, _ in handled} != seqs or not held <= again():
            assert time.monotonic() < deadline, (
                f"never handled: {seqs - started - {seq for seq, _ in handled}}; "
                f"held by the victim and not delivered again: {held - again()}"
            )
            time.sleep(0.05)
    finally:
        assert running.stop() == 0
    assert store.claim("check", 1.0) is None, "a message is left"
    # Some of what the victim held may never have reached a handler (claimed by its last
    # claim_many), so it need not be among ``started``; it came back all the same.
    assert len(handled) == len(set(handled)), "the survivor handled a delivery twice"
