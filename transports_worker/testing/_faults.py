"""Scenarios of faults between the worker and a working store: a claim that stalls before
it reaches the store (a pool that waits for a connection, a server that restarts), and a
settle that fails in passing. Each wraps the backend's own handles (`Faulty`,
`AsyncFaulty`), so the store underneath is real and only the fault is made up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

import pytest

from transports_core import (
    AsyncTransport,
    Event,
    Lease,
    OutcomeUnknown,
    Transport,
    TransportError,
)
from transports_core.backend import AsyncClosing, Closing
from transports_worker._context import Running

from ._support import (
    VISIBILITY,
    AsyncTransportFactory,
    Flavour,
    Recorder,
    Start,
    TransportFactory,
)

AckFault = Literal["fails", "unknown"]


class Faults:
    """The faults that the handles of one worker inject, in turn, and what reached the
    store. Shared by the worker's handles, so guarded by a lock."""

    def __init__(self, *, stalls: Iterable[float] = (), acks: Iterable[AckFault] = ()) -> None:
        self._stalls = list(stalls)
        self._acks = list(acks)
        self._lock = threading.Lock()
        self.acked = 0  # acks the store took
        self.ack_calls = 0

    def stall(self) -> float:
        """How long the next claim stalls before it reaches the store."""
        with self._lock:
            return self._stalls.pop(0) if self._stalls else 0.0

    def ack_fault(self) -> AckFault | None:
        with self._lock:
            self.ack_calls += 1
            return self._acks.pop(0) if self._acks else None

    def took_ack(self) -> None:
        with self._lock:
            self.acked += 1


def _ack_failed(fault: AckFault | None, made: bool) -> TransportError | None:
    """The error an ack with ``fault`` raises, before (``made`` False) or after the store
    took it."""
    if fault == "fails" and not made:
        return TransportError("injected: the ack never reached the store")
    if fault == "unknown" and made:
        return OutcomeUnknown("ack", "injected: the connection broke after the ack was sent")
    return None


class Faulty(Closing):
    """A `Transport` that injects `Faults` around a real one. The two calls that fail come
    first (claim, ack), then the worker's other calls, then those it never makes."""

    def __init__(self, inner: Transport[Any], faults: Faults) -> None:
        self._inner, self._faults = inner, faults

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[Any] | None:
        time.sleep(self._faults.stall())
        return self._inner.claim(worker_id, visibility, min_priority, wait)

    def ack(self, lease: Lease[object]) -> None:
        fault = self._faults.ack_fault()
        if (error := _ack_failed(fault, made=False)) is not None:
            raise error
        self._inner.ack(lease)
        self._faults.took_ack()
        if (error := _ack_failed(fault, made=True)) is not None:
            raise error

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._inner.nack(lease, delay)

    def extend(self, lease: Lease[Any], visibility: float) -> Lease[Any]:
        return self._inner.extend(lease, visibility)

    def bury(self, lease: Lease[object], reason: str) -> None:
        self._inner.bury(lease, reason)

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        return self._inner.publish(group_id, event, priority)

    def publish_many(self, items: Iterable[tuple[str, Any, int]]) -> list[int]:
        return self._inner.publish_many(items)

    def close(self) -> None:
        self._inner.close()


class AsyncFaulty(AsyncClosing):
    """`Faulty` for an `AsyncTransport`."""

    def __init__(self, inner: AsyncTransport[Any], faults: Faults) -> None:
        self._inner, self._faults = inner, faults

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[Any] | None:
        await asyncio.sleep(self._faults.stall())
        return await self._inner.claim(worker_id, visibility, min_priority, wait)

    async def ack(self, lease: Lease[object]) -> None:
        fault = self._faults.ack_fault()
        if (error := _ack_failed(fault, made=False)) is not None:
            raise error
        await self._inner.ack(lease)
        self._faults.took_ack()
        if (error := _ack_failed(fault, made=True)) is not None:
            raise error

    async def nack(self, lease: Lease[object], delay: float = 0) -> None:
        await self._inner.nack(lease, delay)

    async def extend(self, lease: Lease[Any], visibility: float) -> Lease[Any]:
        return await self._inner.extend(lease, visibility)

    async def bury(self, lease: Lease[object], reason: str) -> None:
        await self._inner.bury(lease, reason)

    async def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        return await self._inner.publish(group_id, event, priority)

    async def publish_many(self, items: Iterable[tuple[str, Any, int]]) -> list[int]:
        return await self._inner.publish_many(items)

    async def close(self) -> None:
        await self._inner.close()


class FaultScenarios:
    """The worker between a working store and handles that stall or fail in passing."""

    @pytest.fixture
    def acked_once(
        self,
        start: Start,
        flavour: Flavour,
        make_transport: TransportFactory,
        make_async_transport: AsyncTransportFactory | None,
        store: Transport[Event],
        recorder: Recorder,
    ) -> Callable[[Faults], list[int]]:
        """``acked_once(faults)``: one message through a worker whose every handle
        injects ``faults``; fails unless the message is acked once and for good, and
        returns the seqs the handler was called with."""

        def run(faults: Faults) -> list[int]:
            handled: list[int] = []

            def handle(event: Event, ctx: Running[Event]) -> None:
                handled.append(ctx.lease.seq)

            async def ahandle(event: Event, ctx: Running[Event]) -> None:
                handle(event, ctx)

            store.publish("g", Event(n=1))
            if flavour == "sync":
                start(handle, ahandle, source=lambda: Faulty(make_transport(), faults))
            else:
                assert make_async_transport is not None
                start(handle, ahandle, source=lambda: AsyncFaulty(make_async_transport(), faults))
            recorder.wait_settled(1)
            assert recorder.outcomes() == [(1, 1, "acked")], "not acked once, when first handled"
            assert store.claim("check", VISIBILITY) is None, "the acked message came back"
            return handled

        return run

    def test_a_claim_stalled_past_the_visibility_is_handled_once_and_acked_once(
        self, acked_once: Callable[[Faults], list[int]]
    ) -> None:
        # The claim reaches the store only after a visibility and a half: dated from when
        # it was sent, the lease is already past its end when the claim returns, though
        # the store granted it just now. The worker must renew it before handling it.
        faults = Faults(stalls=[1.5 * VISIBILITY])
        assert acked_once(faults) == [1]
        assert faults.acked == 1

    def test_an_ack_failing_in_passing_is_retried_until_the_store_takes_it(
        self, acked_once: Callable[[Faults], list[int]]
    ) -> None:
        faults = Faults(acks=["fails", "fails"])
        assert acked_once(faults) == [1]
        assert (faults.ack_calls, faults.acked) == (3, 1)

    def test_an_ack_of_unknown_outcome_then_lease_lost_counts_as_acked(
        self, acked_once: Callable[[Faults], list[int]]
    ) -> None:
        # The first ack is made, but the caller hears OutcomeUnknown; the retry finds the
        # lease gone (LeaseLost), which is what the first ack did.
        faults = Faults(acks=["unknown"])
        acked_once(faults)
        assert (faults.ack_calls, faults.acked) == (2, 1)
