"""Scenarios of long handlers and their leases: renewed while the handler runs, lost when
a renewal says so or when renewals fail until the lease's end, and the keeper alone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from transports_core import Event, Lease, LeaseLost, Transport
from transports_worker._context import AsyncContext, Context
from transports_worker._keeper import lease_keeper

from ._support import (
    PATIENCE,
    VISIBILITY,
    Flavour,
    Outage,
    Recorder,
    Start,
    TransportFactory,
    wait_for,
)


class LeaseScenarios:
    """A handler's lease, kept and lost."""

    def test_handler_lasting_three_visibilities_finishes_on_attempt_one(
        self, start: Start, store: Transport[Event], recorder: Recorder
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
        self, start: Start, store: Transport[Event], recorder: Recorder
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
        wait_for(running_flag, "the handler to start")
        # Another party takes the lease away, parking the message for a while: the worker
        # learns of it at its next renewal and must stop its handler before the park ends.
        park = 4 * VISIBILITY
        store.nack(leases[0], delay=park)
        parked_until = time.monotonic() + park
        wait_for(stopped, "the handler to be stopped")
        assert stopped_at[0] < parked_until, "the handler ran on after its lease was gone"
        recorder.wait_settled(1)
        assert recorder.outcomes() == [(1, 1, "lost")]
        assert running.stop() == 0
        again = store.claim("other", VISIBILITY, wait=park + PATIENCE)
        assert again is not None
        assert (again.seq, again.attempt) == (1, 2), "the worker settled a lease it had lost"

    def test_short_transient_renewal_errors_do_not_cancel(
        self, start: Start, recorder: Recorder, down: Outage
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
        wait_for(running_flag, "the handler to start")
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
        self, start: Start, recorder: Recorder, down: Outage
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
        wait_for(running_flag, "the handler to start")
        with down.during():
            wait_for(stopped, "the handler to be stopped", timeout=3 * VISIBILITY + PATIENCE)
        stopped_wall, expires_at = seen[0]
        assert lost, "the handler was not stopped by a lost lease"
        assert stopped_wall < expires_at, (
            f"the handler stopped {stopped_wall - expires_at:.3f}s after its lease ended"
        )
        recorder.wait_settled(1)
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "lost")]

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
