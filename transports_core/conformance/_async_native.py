"""Async-only scenarios: ``async with``, many coroutines sharing one transport object on
one event loop, and claims whose task is cancelled. They run on the suite's private loop
(see `_blocking.Portal`), so no async pytest plugin is involved."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, Final, TypeVar

import pytest

from transports_core import (
    AsyncTransport,
    AsyncTransportAdmin,
    Duplicate,
    Event,
    Lease,
    LeaseLost,
    TransportError,
)

from ._base import ADMIN, DURABLE, AsyncTransportFactory, SuiteBase, checks, seen
from ._blocking import Portal
from ._contention import GROUPS, PER_GROUP, check_journal
from ._properties import (
    ASYNC_CONTEXT,
    CANCELLED_BATCH,
    CANCELLED_CLAIM,
    CONTENTION_TASKS,
    KEY_TASKS,
    ONE_IN_FLIGHT,
)
from ._steps import ev

T = TypeVar("T")
TASKS = 8
KEYS = 25  # keys each task publishes, the same keys in every task

# The visibility of a cancelled claim: far longer than the test, so that a message
# claimable again cannot be explained by its lease lapsing.
CANCEL_VISIBILITY: Final = 30.0
# A waiting claim that a publish wakes, to be cancelled around its wake.
CANCEL_WAIT: Final = 20.0
# Where a claim's task is cancelled: after this many turns of the event loop, then after
# these real delays (s), which reach into the store's call on any backend.
CANCEL_TURNS: Final = range(25)
CANCEL_DELAYS: Final = (0.0001, 0.0003, 0.001, 0.002, 0.004, 0.008, 0.016)


async def _cancel_point(when: int | float) -> str:
    """Wait until a claim's task is to be cancelled: ``when`` turns of the event loop
    (an int) or seconds (a float); returns that moment, said for a failure message."""
    if isinstance(when, int):
        for _ in range(when):
            await asyncio.sleep(0)
        return f"{when} turns of the event loop"
    await asyncio.sleep(when)
    return f"{when * 1000:g} ms"


class AsyncNativeScenarios(SuiteBase):
    @pytest.fixture
    def make_async_transport(self) -> AsyncTransportFactory:
        """Override: return a callable that opens a new async handle on one store, fresh
        for the test. It is called on the suite's event loop."""
        pytest.fail(f"{type(self).__name__} must override the make_async_transport fixture")

    @pytest.fixture
    def _conformance_portal(self) -> Iterator[Portal]:
        portal = Portal()
        yield portal
        portal.close()

    @pytest.fixture(autouse=True)
    def _conformance_async_handles(
        self, make_async_transport: AsyncTransportFactory, _conformance_portal: Portal
    ) -> Iterator[None]:
        self._portal = _conformance_portal
        self._async_factory = make_async_transport
        self._async_handles: list[AsyncTransport[Event]] = []
        yield
        handles, self._async_handles = self._async_handles, []
        for handle in reversed(handles):
            self._portal.run(handle.close())

    def open_async(self) -> AsyncTransport[Event]:
        """A new async handle on the test's store (made on the suite's loop), closed when
        the test ends."""
        handle = self._portal.call(self._async_factory)
        self._async_handles.append(handle)
        return handle

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._portal.run(coroutine)

    @checks(ASYNC_CONTEXT)
    def test_async_context_returns_the_transport_and_closes_it(self) -> None:
        async def scenario() -> tuple[int, Lease[Event] | None]:
            t = self.open_async()
            async with t as entered:
                assert entered is t, f"{ASYNC_CONTEXT}: __aenter__ returned {entered!r}"
                seq = await t.publish("a", ev(1))
            try:
                await t.publish("a", ev(2))
            except TransportError:
                pass  # closed, as it must be
            else:
                raise AssertionError(
                    f"{ASYNC_CONTEXT}: after async with, the transport still published: "
                    "__aexit__ did not close it"
                )
            await t.close()  # closing again is harmless
            if not self.has(DURABLE):
                return seq, None
            async with self.open_async() as again:
                lease = await again.claim("w1", self.hold)
                if lease is not None:
                    await again.ack(lease)
                return seq, lease

        seq, lease = self.run(scenario())
        if self.has(DURABLE):
            assert seen(lease, "seq") == (seq,), (
                f"{ASYNC_CONTEXT}: what was published before async with closed: {lease}"
            )

    @checks(ONE_IN_FLIGHT)
    def test_one_in_flight_per_group_under_concurrent_claims(self) -> None:
        async def scenario() -> list[Lease[Event] | None]:
            t = self.open_async()
            await t.publish_many([(f"g{i % 3}", ev(i), 0) for i in range(12)])
            leases = await asyncio.gather(*(t.claim(f"w{i}", self.hold) for i in range(10)))
            # Leave nothing behind (the store may be shared with the next test).
            for lease in leases:
                if lease is not None:
                    await t.ack(lease)
            while (rest := await t.claim("w0", self.hold)) is not None:
                await t.ack(rest)
            return leases

        leases = [lease for lease in self.run(scenario()) if lease is not None]
        groups = sorted(lease.group_id for lease in leases)
        assert groups == ["g0", "g1", "g2"], (
            f"{ONE_IN_FLIGHT}: ten concurrent claims over three groups leased {groups}"
        )
        assert sorted(lease.event.n for lease in leases) == [0, 1, 2], (
            f"{ONE_IN_FLIGHT}: concurrent claims did not take each group's head: {leases}"
        )

    @checks(CONTENTION_TASKS)
    def test_contention_tasks_lose_nothing_and_keep_groups_exclusive(self) -> None:
        published: dict[int, tuple[str, int]] = {}
        journal: list[tuple[int, str, int, int]] = []
        order: dict[str, list[int]] = {}
        in_flight: dict[str, str] = {}
        overlaps: list[str] = []

        publishing = [2]

        async def publisher(t: AsyncTransport[Event], groups: list[str]) -> None:
            for n in range(PER_GROUP):
                for group in groups:
                    published[await t.publish(group, ev(n))] = (group, n)
            publishing[0] -= 1

        async def worker(t: AsyncTransport[Event], worker_id: str) -> None:
            while True:  # until None after publishing is over (see the threads version)
                done = publishing[0] == 0
                lease = await t.claim(worker_id, self.hold)
                if lease is None:
                    if done:
                        return
                    await asyncio.sleep(0.001)
                    continue
                group = lease.group_id
                if group in in_flight:
                    overlaps.append(f"{group}: {in_flight[group]} and {worker_id}")
                in_flight[group] = worker_id
                await asyncio.sleep(0)  # let the others try this group while it is held
                del in_flight[group]
                journal.append((lease.seq, group, lease.event.n, lease.attempt))
                order.setdefault(group, []).append(lease.event.n)
                await t.ack(lease)

        async def scenario() -> None:
            t = self.open_async()  # one object shared by every task
            names = [f"g{i}" for i in range(GROUPS)]
            await asyncio.wait_for(
                asyncio.gather(
                    publisher(t, names[::2]),
                    publisher(t, names[1::2]),
                    *(worker(t, f"w{i}") for i in range(TASKS)),
                ),
                60,
            )

        self.run(scenario())
        assert not overlaps, f"{CONTENTION_TASKS}: groups leased twice at once: {overlaps}"
        check_journal(CONTENTION_TASKS, published, journal)
        for group, got in order.items():
            assert got == list(range(PER_GROUP)), (
                f"{CONTENTION_TASKS}: group {group!r} was handled in order {got}"
            )

    @checks(CANCELLED_CLAIM)
    def test_cancelled_claim_gives_back_at_once_with_the_same_attempt(self) -> None:
        group = "cancelled"

        async def one_round(
            t: AsyncTransport[Event], other: AsyncTransport[Event], when: int | float, woken: bool
        ) -> None:
            if woken:
                # A claim already waiting, woken by the publish, cancelled around its wake.
                task = asyncio.ensure_future(t.claim("w1", CANCEL_VISIBILITY, wait=CANCEL_WAIT))
                await asyncio.sleep(0.05)
                seq = await other.publish(group, ev(0))
            else:
                seq = await other.publish(group, ev(0))
                task = asyncio.ensure_future(t.claim("w1", CANCEL_VISIBILITY))
            how = f"a claim(wait={CANCEL_WAIT:g}) woken by a publish" if woken else "a claim"
            after = await _cancel_point(when)
            task.cancel()
            try:
                finished = await task
            except asyncio.CancelledError:
                pass
            else:  # the claim was over before the cancel: an ordinary delivery
                assert seen(finished, "seq", "attempt") == (seq, 1), (
                    f"{CANCELLED_CLAIM}: {how} that finished before its cancel gave {finished}"
                )
                assert finished is not None
                await t.ack(finished)
                return
            began = time.monotonic()
            back = await other.claim("w2", CANCEL_VISIBILITY)
            took = time.monotonic() - began
            assert seen(back, "seq", "attempt") == (seq, 1), (
                f"{CANCELLED_CLAIM}: {how} cancelled after {after}; then a claim gave {back} after "
                f"{took:.2f} s; expected seq {seq} with attempt 1, given back before the "
                f"cancelled task ended (visibility {CANCEL_VISIBILITY} s, so not by a lapse)"
            )
            assert back is not None
            await other.ack(back)

        async def scenario() -> None:
            t, other = self.open_async(), self.open_async()
            try:
                for woken in (False, True):
                    for when in (*CANCEL_TURNS, *CANCEL_DELAYS):
                        await one_round(t, other, when, woken)
            finally:
                # A message a broken backend kept leased would block the next test of a
                # shared store for the whole visibility.
                if self.has(ADMIN) and isinstance(other, AsyncTransportAdmin):
                    await other.purge_group(group)

        self.run(scenario())

    @checks(CANCELLED_BATCH)
    def test_cancelled_batch_claims_give_back_at_once_with_the_same_attempt(self) -> None:
        """As the claim's scenario, for ``claim_many`` (three groups) and for the claim
        that ``ack_and_claim`` makes after its ack."""
        groups = ("batch-a", "batch-b", "batch-c")

        async def cancelled(task: asyncio.Task[Any], when: int | float) -> str | None:
            """When ``task`` was cancelled; None if it was over before that."""
            after = await _cancel_point(when)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return after
            return None

        async def many_round(
            t: AsyncTransport[Event], other: AsyncTransport[Event], when: Any
        ) -> None:
            seqs = {await other.publish(group, ev(n)) for n, group in enumerate(groups)}
            task = asyncio.ensure_future(t.claim_many("w1", CANCEL_VISIBILITY, len(groups)))
            after = await cancelled(task, when)
            if after is None:  # over before its cancel: delivered
                leases = task.result()
                assert {(lease.seq, lease.attempt) for lease in leases} == {(s, 1) for s in seqs}
                await t.ack_many(leases)
                return
            back = await other.claim_many("w2", CANCEL_VISIBILITY, len(groups))
            assert {seen(lease, "seq", "attempt") for lease in back} == {(s, 1) for s in seqs}, (
                f"{CANCELLED_BATCH}: a claim_many of {len(groups)} cancelled after {after}; then "
                f"a claim_many gave {back}, expected seqs {sorted(seqs)} each with attempt 1"
            )
            await other.ack_many(back)

        async def chain_round(
            t: AsyncTransport[Event], other: AsyncTransport[Event], when: Any
        ) -> None:
            first = await other.publish(groups[0], ev(0))
            second = await other.publish(groups[1], ev(1))
            lease = await t.claim("w1", CANCEL_VISIBILITY)
            assert lease is not None
            nxt = second if lease.seq == first else first
            task = asyncio.ensure_future(t.ack_and_claim(lease, "w1", CANCEL_VISIBILITY))
            after = await cancelled(task, when)
            if after is None:
                got = task.result()
                assert seen(got, "seq", "attempt") == (nxt, 1), got
                assert got is not None
                await t.ack(got)
                return
            # Acked or not, the next message is claimable: given back if it was leased.
            back = await other.claim("w2", CANCEL_VISIBILITY)
            assert seen(back, "seq", "attempt") == (nxt, 1), (
                f"{CANCELLED_BATCH}: an ack_and_claim cancelled after {after}; then a claim "
                f"gave {back}, expected seq {nxt} with attempt 1"
            )
            assert back is not None
            await other.ack(back)
            with contextlib.suppress(LeaseLost):  # the cancelled call's ack did not take
                await t.ack(lease)

        async def scenario() -> None:
            t, other = self.open_async(), self.open_async()
            try:
                for when in (*CANCEL_TURNS, *CANCEL_DELAYS):
                    await many_round(t, other, when)
                    await chain_round(t, other, when)
            finally:
                if self.has(ADMIN) and isinstance(other, AsyncTransportAdmin):
                    for group in groups:
                        await other.purge_group(group)

        self.run(scenario())

    @checks(KEY_TASKS)
    def test_key_tasks_store_once_racing_on_the_same_keys(self) -> None:
        token = uuid.uuid4().hex[:12]  # a store shared by the tests remembers keys

        async def publisher(t: AsyncTransport[Event]) -> list[int]:
            return [await t.publish("keys", ev(n), key=f"{token}-{n}") for n in range(KEYS)]

        async def scenario() -> tuple[list[list[int]], list[int]]:
            t, other = self.open_async(), self.open_async()  # one object shared, and another
            answers = await asyncio.wait_for(
                asyncio.gather(*(publisher(t if i % 2 else other) for i in range(TASKS))), 60
            )
            got = []
            while (lease := await t.claim("w1", self.hold)) is not None:
                got.append(lease.event.n)
                await t.ack(lease)
            return answers, got

        answers, got = self.run(scenario())
        assert sorted(got) == list(range(KEYS)), (
            f"{KEY_TASKS}: {TASKS} tasks publishing the same {KEYS} keys stored n={sorted(got)}"
        )
        for n in range(KEYS):
            seqs = [answer[n] for answer in answers]
            stored = [seq for seq in seqs if not isinstance(seq, Duplicate)]
            why = "expected one seq, stored once and a Duplicate of it for every other task"
            assert len(set(seqs)) == 1, f"{KEY_TASKS}: key {n} gave the tasks {seqs}: {why}"
            assert len(stored) == 1, f"{KEY_TASKS}: key {n} gave the tasks {seqs}: {why}"
