"""The runtime suite: what `Worker` and `AsyncWorker` promise, as pytest scenarios that
any backend runs from a short test file, beside the conformance suite.

    from transports_worker.testing import WorkerSuite

    class TestWorkerMine(WorkerSuite):
        @pytest.fixture
        def make_transport(self, tmp_path) -> TransportFactory:
            return lambda **options: open_transport(f"mine:///{tmp_path / 'q'}", **options)

        @pytest.fixture
        def make_async_transport(self, tmp_path) -> AsyncTransportFactory:  # optional
            return lambda **options: open_async_transport(f"mine:///{tmp_path / 'q'}", **options)

Each call of a factory opens an independent handle on one store, with real time (the runtime's
leases are real). Every scenario runs with a sync handler on `Worker` and, when
``make_async_transport`` is given, with an async handler on `AsyncWorker`. Scenarios
that need dead letters skip unless the transport is a `TransportAdmin` and ``max_attempts``
is left unset; the transient-failure scenarios need the ``outage`` fixture (see
`Outage`). Leases here are short (about a second) and every wait has a wide margin, so a
slow machine makes the suite slower, not flaky. Imports pytest; the only module here
that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, Protocol

import pytest

from transports_core import (
    AsyncTransport,
    Event,
    Lease,
    LeaseLost,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_core.backend import buried_reason
from transports_core.conformance.journal import Journal, check, read

from ._async import AsyncWorker
from ._context import AsyncContext, Context
from ._hooks import Delivery, Hooks
from ._keeper import lease_keeper
from ._outcomes import Bury, Cancelled, Outcome, Retry, RetryPolicy
from ._sync import Worker

__all__ = ["Outage", "QuickHandles", "Recorder", "WorkerSuite"]

# Called with open_transport's keywords (``event_type=``) or none; opens a new handle.
TransportFactory = Callable[..., Transport[Any]]
AsyncTransportFactory = Callable[..., AsyncTransport[Any]]
Flavour = Literal["sync", "async"]

VISIBILITY: Final = 1.0  # short, so that a handler outlives several renewals quickly
PATIENCE: Final = 30.0  # how long any wait for the worker may take before the test fails


class Outage(Protocol):
    """What the transient-failure scenarios need from a backend.

    ``transport()`` opens a handle that gives up quickly (well under a tenth of a second
    more than usual) while the store is unavailable, raising a `TransportError`;
    ``async_transport()`` its async twin; ``during()`` makes the store unavailable to
    such handles for the block's length.
    """

    def transport(self) -> Transport[Event]: ...

    def async_transport(self) -> AsyncTransport[Event]: ...

    def during(self) -> contextlib.AbstractContextManager[None]: ...


class QuickHandles:
    """The half of an `Outage` that opens handles: ``url`` with ``options`` that make a
    handle give up quickly. A backend's outage adds ``during``."""

    def __init__(self, url: str, **options: object) -> None:
        self.url, self.options = url, options

    def transport(self) -> Transport[Event]:
        return open_transport(self.url, **self.options)

    def async_transport(self) -> AsyncTransport[Event]:
        return open_async_transport(self.url, **self.options)


class Recorder(Hooks):
    """Hooks that remember every delivery's outcome, and let a test wait for them."""

    def __init__(self) -> None:
        self.started_: list[Delivery] = []
        self.settled_: list[tuple[Delivery, Outcome, BaseException | None]] = []
        self.renewals = 0
        self._cond = threading.Condition()

    def started(self, delivery: Delivery) -> None:
        with self._cond:
            self.started_.append(delivery)
            self._cond.notify_all()

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        with self._cond:
            self.settled_.append((delivery, outcome, error))
            self._cond.notify_all()

    def renewed(self, delivery: Delivery) -> None:
        with self._cond:
            self.renewals += 1

    def outcomes(self) -> list[tuple[int, int, Outcome]]:
        with self._cond:
            return [(d.seq, d.attempt, outcome) for d, outcome, _ in self.settled_]

    def wait_settled(self, count: int, timeout: float = PATIENCE) -> None:
        with self._cond:
            done = self._cond.wait_for(lambda: len(self.settled_) >= count, timeout)
        assert done, f"only {len(self.settled_)} of {count} deliveries settled: {self.outcomes()}"


class _Held:
    """When a handler held its lease, as the journal wants it: from its start (just after
    the claim returned) to its end (just before the worker settles)."""

    spans: ClassVar[dict[tuple[int, int, str], list[int]]] = {}
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, key: tuple[int, int, str]) -> None:
        self.key = key
        with self.lock:
            self.spans[key] = [time.monotonic_ns(), 0]

    def end(self) -> None:
        with self.lock:
            self.spans[self.key][1] = time.monotonic_ns()


class _Journaling(Hooks):
    """Writes one journal entry per delivery that reached its settle."""

    OUTCOMES: ClassVar[dict[str, str]] = {"acked": "ack", "retried": "nack", "failed": "nack"}

    def __init__(self, path: Path, total: int) -> None:
        self._journal = Journal(path)
        self.acked = 0
        self._cond = threading.Condition()

    @staticmethod
    def begin(lease: Lease[Event]) -> _Held:
        return _Held((lease.seq, lease.attempt, lease.worker_id))

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        with _Held.lock:
            claimed, released = _Held.spans.pop(
                (delivery.seq, delivery.attempt, delivery.worker_id)
            )
        self._journal.record(delivery, claimed, released, self.OUTCOMES.get(outcome, outcome))
        with self._cond:
            self.acked += outcome == "acked"
            self._cond.notify_all()

    def wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def close(self) -> None:
        self._journal.close()


class Running:
    """A worker running on a thread of its own (its own event loop for `AsyncWorker`)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            if isinstance(self.worker, AsyncWorker):
                self.code = asyncio.run(self.worker.run())
            else:
                self.code = self.worker.run()
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = PATIENCE) -> int:
        """Stop the worker (draining), and return its exit code."""
        self.worker.stop()
        return self.join(timeout)

    def join(self, timeout: float = PATIENCE) -> int:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.worker!r} did not stop in {timeout}s"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code


def _wait(flag: threading.Event, what: str, timeout: float = PATIENCE) -> None:
    assert flag.wait(timeout), f"timed out after {timeout}s waiting for {what}"


def _sleepers(
    flag: threading.Event, seconds: float, cancelled: threading.Event | None = None
) -> tuple[
    Callable[[Event, Context[Event]], None],
    Callable[[Event, AsyncContext[Event]], Awaitable[None]],
]:
    """A sync and an async handler that set ``flag`` as they start, then sleep through
    the context for ``seconds`` (so that a cancel or a lost lease ends them); a cancel
    also sets ``cancelled``."""
    said = threading.Event() if cancelled is None else cancelled

    def sleeps(event: Event, ctx: Context[Event]) -> None:
        flag.set()
        try:
            ctx.sleep(seconds)
        except Cancelled:
            said.set()
            raise

    async def asleeps(event: Event, ctx: AsyncContext[Event]) -> None:
        flag.set()
        try:
            await ctx.sleep(seconds)
        except asyncio.CancelledError:
            said.set()
            raise

    return sleeps, asleeps


class WorkerSuite:
    """Every scenario of the runtime, for one backend. Override ``make_transport`` (and
    ``make_async_transport`` for the async worker; ``outage`` for transient failures)."""

    flavours: ClassVar[tuple[Flavour, ...]] = ("sync", "async")

    @pytest.fixture
    def make_transport(self) -> TransportFactory:
        raise NotImplementedError("override the make_transport fixture")

    @pytest.fixture
    def make_async_transport(self) -> AsyncTransportFactory | None:
        return None

    @pytest.fixture
    def outage(self) -> Outage | None:
        return None

    @pytest.fixture(params=["sync", "async"])
    def flavour(self, request: pytest.FixtureRequest) -> Flavour:
        chosen: Flavour = request.param
        return chosen

    @pytest.fixture
    def store(self, make_transport: TransportFactory) -> Iterator[Transport[Event]]:
        """A handle of the test's own, beside the worker's."""
        with make_transport() as handle:
            yield handle

    @pytest.fixture
    def down(self, outage: Outage | None, store: Transport[Event]) -> Outage:
        """The ``outage`` fixture, for a scenario that needs it, with one message queued."""
        if outage is None:
            pytest.skip("no outage fixture: the backend cannot be made briefly unavailable")
        store.publish("g", Event(n=1))
        return outage

    @pytest.fixture
    def recorder(self) -> Recorder:
        return Recorder()

    @pytest.fixture
    def start(
        self,
        flavour: Flavour,
        make_transport: TransportFactory,
        make_async_transport: AsyncTransportFactory | None,
        recorder: Recorder,
    ) -> Iterator[Callable[..., Running]]:
        """``start(sync_handler, async_handler, **options)``: run a worker of the test's
        flavour on its own thread; every worker still running is stopped at the end."""
        if flavour == "async" and make_async_transport is None:
            pytest.skip("no make_async_transport fixture: the async worker is not run")
        started: list[Running] = []

        def run(
            sync: Callable[[Event, Context[Event]], object],
            asynchronous: Callable[[Event, AsyncContext[Event]], Awaitable[object]],
            source: Any = None,
            **options: Any,
        ) -> Running:
            options.setdefault("visibility", VISIBILITY)
            options.setdefault("grace", PATIENCE)
            options.setdefault("hooks", [recorder])
            worker: Any
            event_type = options.pop("event_type", Event)
            if flavour == "sync":
                if source is None:
                    source = lambda: make_transport(event_type=event_type)  # noqa: E731
                elif not callable(source):
                    source = source.transport
                worker = Worker(source, sync, handle_signals=False, **options)
            else:
                assert make_async_transport is not None
                if source is None:
                    source = lambda: make_async_transport(event_type=event_type)  # noqa: E731
                elif not callable(source):
                    source = source.async_transport
                worker = AsyncWorker(source, asynchronous, handle_signals=False, **options)
            running = Running(worker)
            started.append(running)
            return running

        yield run
        for running in started:
            running.worker.stop()
            running.worker.stop()
            with contextlib.suppress(Exception):
                running.join()

    def _dead(self, store: Transport[Event]) -> TransportAdmin:
        if not isinstance(store, TransportAdmin):
            pytest.skip("the transport is not a TransportAdmin: its dead letters cannot be read")
        return store

    # -- long handlers ---------------------------------------------------------------

    def test_handler_lasting_three_visibilities_finishes_on_attempt_one(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("g", Event(n=1))

        def slow(event: Event, ctx: Context[Event]) -> None:
            ctx.sleep(3 * VISIBILITY)

        async def aslow(event: Event, ctx: AsyncContext[Event]) -> None:
            await ctx.sleep(3 * VISIBILITY)

        running = start(slow, aslow)
        recorder.wait_settled(1)
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "acked")]
        assert recorder.renewals >= 2, "the lease was not renewed while the handler ran"
        assert store.claim("check", VISIBILITY) is None, "the acked message came back"

    def test_lease_lost_on_renewal_cancels_the_handler_before_a_reclaim_and_settles_nothing(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("g", Event(n=1))
        leases: list[Lease[Event]] = []
        running_flag, stopped = threading.Event(), threading.Event()
        stopped_at: list[float] = []

        def long(event: Event, ctx: Context[Event]) -> None:
            leases.append(ctx.lease)
            running_flag.set()
            try:
                ctx.sleep(PATIENCE)
            finally:
                stopped_at.append(time.monotonic())
                stopped.set()

        async def along(event: Event, ctx: AsyncContext[Event]) -> None:
            leases.append(ctx.lease)
            running_flag.set()
            try:
                await asyncio.sleep(PATIENCE)
            finally:
                stopped_at.append(time.monotonic())
                stopped.set()

        running = start(long, along)
        _wait(running_flag, "the handler to start")
        # Another party takes the lease away, parking the message for a while: the worker
        # learns of it at its next renewal and must stop its handler before the park ends.
        park = 4 * VISIBILITY
        store.nack(leases[0], delay=park)
        parked_until = time.monotonic() + park
        _wait(stopped, "the handler to be stopped")
        assert stopped_at[0] < parked_until, "the handler ran on after its lease was gone"
        recorder.wait_settled(1)
        assert recorder.outcomes() == [(1, 1, "lost")]
        assert running.stop() == 0
        again = store.claim("other", VISIBILITY, wait=park + PATIENCE)
        assert again is not None
        assert (again.seq, again.attempt) == (1, 2), "the worker settled a lease it had lost"

    def test_short_transient_renewal_errors_do_not_cancel(
        self, start: Callable[..., Running], recorder: Recorder, down: Outage
    ) -> None:
        running_flag, release = threading.Event(), threading.Event()

        def waits(event: Event, ctx: Context[Event]) -> None:
            running_flag.set()
            while not release.is_set():
                ctx.sleep(0.05)

        async def awaits(event: Event, ctx: AsyncContext[Event]) -> None:
            running_flag.set()
            while not release.is_set():
                await ctx.sleep(0.05)

        running = start(waits, awaits, source=down)
        _wait(running_flag, "the handler to start")
        # Shorter than the time left on a lease renewed a third of a visibility ago.
        for _ in range(3):
            with down.during():
                time.sleep(VISIBILITY / 4)
            time.sleep(VISIBILITY / 4)
        release.set()
        recorder.wait_settled(1)
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "acked")]

    def test_long_transient_renewal_errors_cancel_before_the_lease_ends(
        self, start: Callable[..., Running], recorder: Recorder, down: Outage
    ) -> None:
        running_flag, stopped = threading.Event(), threading.Event()
        seen: list[tuple[float, float]] = []  # (wall clock when stopped, lease's expires_at)
        lost: list[BaseException] = []

        def long(event: Event, ctx: Context[Event]) -> None:
            running_flag.set()
            try:
                ctx.sleep(PATIENCE)
            except LeaseLost as exc:
                lost.append(exc)
                raise
            finally:
                seen.append((time.time(), ctx.lease.expires_at))
                stopped.set()

        async def along(event: Event, ctx: AsyncContext[Event]) -> None:
            running_flag.set()
            try:
                await asyncio.sleep(PATIENCE)
            except asyncio.CancelledError:
                lost.append(LeaseLost(ctx.lease))
                raise
            finally:
                seen.append((time.time(), ctx.lease.expires_at))
                stopped.set()

        running = start(long, along, source=down)
        _wait(running_flag, "the handler to start")
        with down.during():
            _wait(stopped, "the handler to be stopped", timeout=3 * VISIBILITY + PATIENCE)
        stopped_wall, expires_at = seen[0]
        assert lost, "the handler was not stopped by a lost lease"
        assert stopped_wall < expires_at, (
            f"the handler stopped {stopped_wall - expires_at:.3f}s after its lease ended"
        )
        recorder.wait_settled(1)
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "lost")]

    # -- shutdown --------------------------------------------------------------------

    def test_stop_mid_handler_drains_within_grace_and_claims_nothing_new(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("a", Event(n=1))
        store.publish("b", Event(n=2))
        running_flag = threading.Event()
        running = start(*_sleepers(running_flag, 1.5 * VISIBILITY), concurrency=1)
        _wait(running_flag, "the handler to start")
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "acked")]
        assert len(recorder.started_) == 1
        left = store.claim("check", VISIBILITY)
        assert left is not None
        assert (left.seq, left.attempt) == (2, 1), "the worker claimed after it was stopped"

    def test_past_grace_the_lease_is_handed_back_to_another_worker(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("g", Event(n=1))
        running_flag, cancelled = threading.Event(), threading.Event()
        running = start(*_sleepers(running_flag, PATIENCE, cancelled), grace=0.2)
        _wait(running_flag, "the handler to start")
        assert running.stop() == 75
        _wait(cancelled, "the handler to be cancelled")
        assert recorder.outcomes() == [(1, 1, "handed_back")]
        # Handed back with nack(0): claimable at once, not after the lease would lapse.
        again = store.claim("other", VISIBILITY, wait=1.0)
        assert again is not None, "the handed-back message was not claimable within a second"
        assert (again.seq, again.attempt) == (1, 2)

    def test_a_second_stop_cancels_without_waiting_for_grace(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("g", Event(n=1))
        running_flag = threading.Event()
        running = start(*_sleepers(running_flag, 10 * PATIENCE), grace=10 * PATIENCE)
        _wait(running_flag, "the handler to start")
        running.worker.stop()
        running.worker.stop()
        assert running.join(PATIENCE) == 75
        assert recorder.outcomes() == [(1, 1, "handed_back")]

    # -- outcomes --------------------------------------------------------------------

    def test_retries_keep_group_order(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        for n in range(1, 4):
            store.publish("g", Event(n=n))
        store.publish("h", Event(n=10))
        order: list[tuple[int, int]] = []

        def flaky(event: Event, ctx: Context[Event]) -> None:
            order.append((event.n, ctx.attempt))
            if event.n == 2 and ctx.attempt == 1:
                raise Retry(0.2)
            if event.n == 3 and ctx.attempt == 1:
                raise ValueError("first try fails")

        async def aflaky(event: Event, ctx: AsyncContext[Event]) -> None:
            flaky(event, ctx)  # type: ignore[arg-type]

        running = start(flaky, aflaky, concurrency=4, retry=RetryPolicy(base=0.1))
        recorder.wait_settled(6)
        assert running.stop() == 0
        in_g = [step for step in order if step[0] < 10]
        assert in_g == [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2)]
        assert sorted(outcome for _, _, outcome in recorder.outcomes()) == [
            "acked",
            "acked",
            "acked",
            "acked",
            "failed",
            "retried",
        ]

    def test_permanent_errors_and_the_last_attempt_bury_with_the_exception_text(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        admin = self._dead(store)
        store.publish("p", Event(kind="permanent"))
        store.publish("l", Event(kind="always"))
        store.publish("b", Event(kind="bury"))

        def failing(event: Event, ctx: Context[Event]) -> None:
            if event.kind == "permanent":
                raise KeyError("missing")
            if event.kind == "bury":
                raise Bury("not for us")
            raise ValueError(f"boom {ctx.attempt}")

        async def afailing(event: Event, ctx: AsyncContext[Event]) -> None:
            failing(event, ctx)  # type: ignore[arg-type]

        policy = RetryPolicy(max_attempts=2, base=0.05, permanent=(KeyError,))
        running = start(failing, afailing, retry=policy)
        recorder.wait_settled(4)
        assert running.stop() == 0
        dead = {letter.group_id: letter for letter in admin.dead_letters()}
        assert set(dead) == {"p", "l", "b"}
        assert dead["p"].reason == buried_reason("KeyError: 'missing'")
        assert dead["p"].attempts == 1
        assert dead["l"].reason == buried_reason("ValueError: boom 2")
        assert dead["l"].attempts == 2
        assert dead["b"].reason == buried_reason("not for us")

    def test_timeout_cancels_the_handler_and_counts_as_a_failure(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        admin = self._dead(store)
        store.publish("g", Event(n=1))
        cancelled = threading.Event()
        handlers = _sleepers(threading.Event(), PATIENCE, cancelled)
        running = start(*handlers, timeout=0.3, retry=RetryPolicy(max_attempts=1))
        recorder.wait_settled(1)
        _wait(cancelled, "the handler to be cancelled")
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "buried")]
        (letter,) = admin.dead_letters()
        assert letter.reason.startswith(buried_reason("TimeoutError: "))

    def test_an_event_that_does_not_decode_is_buried(
        self, start: Callable[..., Running], store: Transport[Event], recorder: Recorder
    ) -> None:
        from pydantic import BaseModel

        class Strict(BaseModel):
            amount: int

        admin = self._dead(store)
        store.publish("g", Event(note="no amount"))
        store.publish("h", Event(amount=3))
        amounts: list[int] = []

        def handle(event: Any, ctx: Any) -> None:
            amounts.append(event.amount)

        async def ahandle(event: Any, ctx: Any) -> None:
            amounts.append(event.amount)

        running = start(handle, ahandle, event_type=Strict)
        recorder.wait_settled(2)
        assert running.stop() == 0
        assert amounts == [3]
        (letter,) = admin.dead_letters()
        assert letter.group_id == "g"
        assert "does not decode" in letter.reason

    # -- contention ------------------------------------------------------------------

    def test_two_workers_keep_each_group_in_order_one_at_a_time_and_lose_nothing(
        self,
        start: Callable[..., Running],
        store: Transport[Event],
        tmp_path: Path,
    ) -> None:
        groups, per_group = 6, 8
        published: dict[int, str] = {}
        for n in range(per_group):
            for g in range(groups):
                published[store.publish(f"g{g}", Event(n=n))] = f"g{g}"
        journals = [tmp_path / "w0.jsonl", tmp_path / "w1.jsonl"]
        recorders = [_Journaling(path, len(published)) for path in journals]
        rng = random.Random(17)
        holds = [rng.uniform(0, 0.02) for _ in range(64)]

        def handle(event: Event, ctx: Context[Event]) -> None:
            held = _Journaling.begin(ctx.lease)
            try:
                ctx.sleep(holds[ctx.lease.seq % len(holds)])
                if ctx.lease.seq % 5 == 0 and ctx.attempt == 1:
                    raise Retry(0.01)
            finally:
                held.end()

        async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
            held = _Journaling.begin(ctx.lease)
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

    # -- the lease keeper alone ------------------------------------------------------

    def test_lease_keeper_keeps_a_lease_around_plain_code(
        self, store: Transport[Event], make_transport: TransportFactory, flavour: Flavour
    ) -> None:
        if flavour == "async":
            pytest.skip("the sync keeper; the async one is covered through AsyncWorker")
        store.publish("g", Event(n=1))
        lease = store.claim("me", VISIBILITY)
        assert lease is not None
        with make_transport() as other:
            with lease_keeper(store, lease, visibility=VISIBILITY) as keeper:
                assert not keeper.wait_lost(3 * VISIBILITY)
                assert other.claim("other", VISIBILITY) is None, "the kept lease lapsed"
                keeper.check()
            store.ack(keeper.lease)
        assert keeper.renewals >= 2
