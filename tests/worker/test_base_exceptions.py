"""A handler that raises a `BaseException` that is no `Exception` (SystemExit,
KeyboardInterrupt, GeneratorExit, an application's own): both twins, in batches or not,
hand its lease back at once, stop claiming, drain the other running handlers as a first
`stop` does, and only then raise it from `run`. On SQLite files, with a visibility long
enough to tell a lease handed back from one left to lapse."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest

from transports_core import Event, Transport, TransportAdmin, open_transport
from transports_worker import AsyncContext, AsyncWorker, Context, Worker
from transports_worker.testing._support import PATIENCE, Recorder, RunningWorker

# Long: a message claimable again right after the run was handed back, not left to lapse.
VISIBILITY = 30.0
POLL = 0.005


class Abort(BaseException):
    """An application's own BaseException."""


ESCAPING = [SystemExit, KeyboardInterrupt, GeneratorExit, Abort]


def _queue(tmp_path: Path, count: int) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        for n in range(count):
            store.publish(f"g{n}", Event(n=n))
    return url


def _ready_and_in_flight(store: Transport[Event]) -> tuple[int, int]:
    stats = cast(TransportAdmin, store).stats()
    return stats.ready, stats.in_flight


def _worker(
    flavour: str, url: str, raiser: Any, other: Any, **options: Any
) -> Worker[Event] | AsyncWorker[Event]:
    """A worker of two slots whose handler for message 0 is ``raiser`` and for the rest
    ``other``: sync functions ``(event, ctx, others_started)``, made async here."""
    started: list[int] = []
    options = {"concurrency": 2, "visibility": VISIBILITY, "handle_signals": False} | options

    if flavour == "sync":

        def handle(event: Event, ctx: Context[Event]) -> None:
            if event.n != 0:
                started.append(event.n)
                other(ctx)
                return
            deadline = time.monotonic() + PATIENCE
            while not started and time.monotonic() < deadline:
                time.sleep(POLL)  # the other handler runs when this one raises
            raiser()

        return Worker(url, handle, **options)

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        if event.n != 0:
            started.append(event.n)
            await other(ctx)
            return
        deadline = time.monotonic() + PATIENCE
        while not started and time.monotonic() < deadline:
            await asyncio.sleep(POLL)
        raiser()

    return AsyncWorker(url, ahandle, **options)


def _finishes_once_stopping(flavour: str) -> Any:
    """The other handler: it runs until the worker stops claiming, then returns."""

    def finishes(ctx: Context[Event]) -> None:
        deadline = time.monotonic() + PATIENCE
        while not ctx.stopping and time.monotonic() < deadline:
            ctx.sleep(POLL)

    async def afinishes(ctx: AsyncContext[Event]) -> None:
        deadline = time.monotonic() + PATIENCE
        while not ctx.stopping and time.monotonic() < deadline:
            await ctx.sleep(POLL)

    return finishes if flavour == "sync" else afinishes


def _never_finishes(flavour: str) -> Any:
    """The other handler: it runs until the worker cancels it."""

    def sleeps(ctx: Context[Event]) -> None:
        ctx.sleep(PATIENCE)

    async def asleeps(ctx: AsyncContext[Event]) -> None:
        await ctx.sleep(PATIENCE)

    return sleeps if flavour == "sync" else asleeps


@pytest.mark.parametrize("kind", ESCAPING, ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("batch", [True, False], ids=["batch", "no-batch"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_base_exception_hands_its_lease_back_drains_the_others_then_leaves_run(
    tmp_path: Path, flavour: str, batch: bool, kind: type[BaseException]
) -> None:
    # Three messages on two slots: message 0 raises while another runs; the third must
    # not be claimed once the worker stops claiming.
    url = _queue(tmp_path, 3)
    raised: list[BaseException] = []

    def raiser() -> None:
        raised.append(kind())
        raise raised[0]

    recorder = Recorder()
    worker = _worker(
        flavour, url, raiser, _finishes_once_stopping(flavour), batch=batch, hooks=[recorder]
    )
    running = RunningWorker(worker)
    with pytest.raises(kind) as info:
        running.join()
    assert info.value is raised[0]  # the handler's own object

    outcomes = {d.group_id: (outcome, error) for d, outcome, error in recorder.settled_}
    assert outcomes.keys() == {"g0", "g1"}, recorder.outcomes()  # the third was never claimed
    assert outcomes["g0"] == ("handed_back", raised[0])
    assert outcomes["g1"] == ("acked", None)  # drained, not abandoned
    assert len(recorder.started_) == 2
    assert worker.handed_back == 1
    with open_transport(url) as store:
        # Not in flight until its visibility lapses: claimable again at once.
        assert _ready_and_in_flight(store) == (2, 0)
        leases = [store.claim("checker", VISIBILITY) for _ in range(3)]
    claimed = sorted((lease.event.n, lease.attempt) for lease in leases if lease is not None)
    assert claimed == [(0, 2), (2, 1)]
    assert leases[2] is None


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "no-batch"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_base_exception_hands_back_the_others_too_once_grace_runs_out(
    tmp_path: Path, flavour: str, batch: bool
) -> None:
    url = _queue(tmp_path, 2)
    raised = SystemExit(3)

    def raiser() -> None:
        raise raised

    recorder = Recorder()
    worker = _worker(
        flavour, url, raiser, _never_finishes(flavour), batch=batch, hooks=[recorder], grace=0.2
    )
    running = RunningWorker(worker)
    with pytest.raises(SystemExit) as info:
        running.join()
    assert info.value is raised
    outcomes = {d.group_id: (outcome, error) for d, outcome, error in recorder.settled_}
    assert outcomes == {"g0": ("handed_back", raised), "g1": ("handed_back", None)}
    assert worker.handed_back == 2
    with open_transport(url) as store:
        assert _ready_and_in_flight(store) == (2, 0)
