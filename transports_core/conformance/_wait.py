"""Scenarios of waiting claims, ``claim(wait=)``: wait=0 never blocks, an empty wait ends
with None only once the wait has run, each way a message becomes deliverable wakes a
waiter, a wake that brings nothing takeable does not end a wait, a publish racing the
start of a wait is never missed (at random offsets either side of it), and close wakes a
waiter. ``claim_many`` and ``ack_and_claim`` wait as ``claim`` does, and a ``claim_many``
woken by a publish of several groups leases all of them.

Waits are real seconds whatever clock the backend reads. A waiter runs on a thread of its
own, on a handle of its own when the backend has several; the test measures how long it
blocked with `time.monotonic` and asserts it returned well before its wait ran out.

With the ``clock`` capability a lapse or a park's end happens when the test moves the
manual clock, which no store can observe. Such a backend must re-check, while it waits,
at the next deadline computed from its clock and at least about once a second of real
time; the suite allows `CLOCK_WAKE` real seconds for that after it moves the clock.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Generic, TypeVar

from transports_core import Lease, LeaseLost, Message, Transport

from ._base import MULTI_HANDLE, checks, must_raise, seen
from ._properties import (
    BATCH_WAIT,
    WAIT_CLOSE,
    WAIT_EMPTY,
    WAIT_ON,
    WAIT_RACE,
    WAIT_WAKE,
    WAIT_ZERO,
)
from ._steps import Steps, ev, publish, take

# A wait meant to be cut short by a wake.
LONG: Final = 20.0
# A publish, ack or nack must wake a waiter well within this many real seconds.
WAKE: Final = 2.0
# A lapse or park end on a manual clock must be noticed within this many real seconds.
CLOCK_WAKE: Final = 3.5
# How long the test lets a waiter settle into its wait before waking it (not a
# synchronisation: the property holds if the wake comes before the wait began, too).
SETTLE: Final = 0.1
# The wait of a batch claim with nothing to take.
EMPTY_WAIT: Final = 0.3
# The wait of a claim that is woken, for nothing it may take, during its wait.
NOTHING_WAIT: Final = 1.0
# The priority floor of that claim.
FLOOR: Final = 3
# Publishes racing the start of a waiting claim, and the spread of their offsets (s).
RACES: Final = 200
RACE_BEFORE: Final = 0.001
RACE_AFTER: Final = 0.003

T = TypeVar("T")


class Blocked(Generic[T]):
    """A call that may block, running on a thread of its own."""

    def __init__(self, call: Callable[[], T]) -> None:
        self.value: T | None = None
        self.error: BaseException | None = None
        self.began = self.ended = 0.0
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        self.began = time.monotonic()
        try:
            self.value = call()
        except BaseException as exc:  # re-raised in the test's thread
            self.error = exc
        finally:
            self.ended = time.monotonic()

    def result(self, prop: str, within: float) -> tuple[T | None, float]:
        """The call's value and how long it blocked; fails if it has not returned
        ``within`` seconds from now."""
        self._thread.join(within)
        assert not self._thread.is_alive(), (
            f"{prop}: the waiting claim had not returned {within:.1f} s after it was woken"
        )
        if self.error is not None:
            raise AssertionError(f"{prop}: the waiting claim raised {self.error!r}") from (
                self.error
            )
        return self.value, self.ended - self.began


class Waiter(Blocked[Lease[Any] | None]):
    """``claim(worker, visibility, wait=...)`` running on a thread of its own."""

    def __init__(
        self,
        t: Transport[Any],
        worker: str,
        visibility: float,
        wait: float,
        min_priority: int = 0,
    ) -> None:
        super().__init__(partial(t.claim, worker, visibility, min_priority, wait))


class WaitScenarios(Steps):
    def _waiter_handle(self, t: Transport[Any]) -> Transport[Any]:
        return self.open() if self.has(MULTI_HANDLE) else t

    def _lapse(self, deadline: float) -> float:
        """Let ``deadline`` pass, and return how long (real seconds) a waiter may then
        take to notice."""
        if self._clock is not None:
            self._clock.advance_to(deadline + 0.5)
            return CLOCK_WAKE
        left = deadline - time.time()
        return max(left, 0) + WAKE

    def _woken_at(self, t: Transport[Any], deadline: float, head: Lease[Any], what: str) -> None:
        """A claim waiting while ``head`` is held until ``deadline`` gets ``head``'s
        message again as soon as ``deadline`` passes (``what`` names the deadline)."""
        waiter = Waiter(self._waiter_handle(t), "w2", self.hold, LONG)
        time.sleep(SETTLE)
        lease, took = waiter.result(WAIT_WAKE, self._lapse(deadline))
        assert seen(lease, "seq", "attempt") == (head.seq, head.attempt + 1), (
            f"{WAIT_WAKE}: when {what}, the waiting claim gave {lease}"
        )
        assert took < LONG / 2, (
            f"{WAIT_WAKE}: when {what}, the waiting claim returned only after {took:.2f} s"
        )

    @checks(WAIT_ZERO)
    def test_wait_zero_never_blocks(self) -> None:
        t = self.open()
        began = time.monotonic()
        none = t.claim("w1", self.hold, wait=0)
        t.publish("a", ev(1))
        lease = take(t, "w1", self.hold)
        held = t.claim("w2", self.hold, wait=0)
        took = time.monotonic() - began
        assert (none, held) == (None, None), f"{WAIT_ZERO}: claims gave {none} and {held}"
        assert lease.event.n == 1
        assert took < WAKE, f"{WAIT_ZERO}: three claims with wait=0 took {took:.2f} s"

    @checks(WAIT_EMPTY)
    def test_wait_empty_returns_none_after_the_wait(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        take(t, "w1", self.hold)  # the one group is leased: nothing is deliverable
        for wait in (0.3, 0.6):
            began = time.monotonic()
            got = t.claim("w2", self.hold, wait=wait)
            took = time.monotonic() - began
            assert got is None, f"{WAIT_EMPTY}: claim(wait={wait}) on a held group gave {got}"
            assert took >= wait - 0.02, (
                f"{WAIT_EMPTY}: claim(wait={wait}) returned None after {took:.3f} s, "
                "before its wait ran out"
            )

    @checks(WAIT_WAKE)
    def test_wait_woken_by_a_publish(self) -> None:
        t = self.open()
        waiter = Waiter(self._waiter_handle(t), "w1", self.hold, LONG)
        time.sleep(SETTLE)
        seq = t.publish("a", ev(1))
        lease, took = waiter.result(WAIT_WAKE, WAKE)
        assert seen(lease, "seq") == (seq,), (
            f"{WAIT_WAKE}: a claim waiting {LONG} s when seq {seq} was published gave {lease}"
        )
        assert took < LONG / 2, f"{WAIT_WAKE}: the publish woke the waiter after {took:.2f} s"

    @checks(WAIT_WAKE)
    def test_wait_woken_by_an_ack_or_nack_that_frees_the_group(self) -> None:
        t = self.open()
        for settle in ("ack", "nack"):
            publish(t, "a", 1, 2)
            first = take(t, "w1", self.hold)
            waiter = Waiter(self._waiter_handle(t), "w2", self.hold, LONG)
            time.sleep(SETTLE)
            if settle == "ack":
                t.ack(first)
            else:
                t.nack(first)
            lease, took = waiter.result(WAIT_WAKE, WAKE)
            want = (2, 1) if settle == "ack" else (1, 2)
            got = None if lease is None else (lease.event.n, lease.attempt)
            assert got == want, (
                f"{WAIT_WAKE}: the {settle} of a's first message woke the waiter with {lease}; "
                f"expected n, attempt = {want}"
            )
            assert took < LONG / 2, f"{WAIT_WAKE}: the {settle} woke it after {took:.2f} s"
            assert lease is not None
            t.ack(lease)
            if settle == "nack":
                t.ack(take(t, "w1", self.hold))

    @checks(WAIT_WAKE)
    def test_wait_woken_by_a_lease_that_lapses(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        first = take(t, "w1", self.brief)
        self._woken_at(t, first.expires_at, first, "w1's lease lapsed")

    @checks(WAIT_WAKE)
    def test_wait_woken_by_the_end_of_a_park(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        first = take(t, "w1", self.hold)
        self._woken_at(t, self.park(t, first), first, "the park ended")

    @checks(WAIT_ON)
    def test_wait_goes_on_after_wakes_that_bring_nothing(self) -> None:
        t = self.open()
        publish(t, "x", 1, 2)
        t.publish("h", ev(10), FLOOR)
        x = take(t, "w1", self.hold)
        take(t, "w1", self.hold, FLOOR)  # h is held from now on
        # Each of these wakes a claim waiting with min_priority=FLOOR, but gives it
        # nothing it may take.
        wakes: list[tuple[str, Callable[[], object]]] = [
            ("a publish below its floor", lambda: t.publish("low", ev(20), 0)),
            ("a publish to a group another lease holds", lambda: t.publish("h", ev(11), FLOOR)),
            ("an ack that frees a group below its floor", lambda: t.ack(x)),
        ]
        waiter = Waiter(self._waiter_handle(t), "w2", self.hold, NOTHING_WAIT, FLOOR)
        for _, wake in wakes:
            time.sleep(SETTLE / 2)
            wake()
        lease, took = waiter.result(WAIT_ON, NOTHING_WAIT + WAKE)
        what = ", ".join(name for name, _ in wakes)
        assert lease is None, f"{WAIT_ON}: woken by {what}, the waiting claim gave {lease}"
        assert took >= NOTHING_WAIT - 0.02, (
            f"{WAIT_ON}: claim(min_priority={FLOOR}, wait={NOTHING_WAIT}) returned None after "
            f"{took:.3f} s, before its wait ran out; it was woken by {what}, which brought it "
            "nothing to take"
        )
        # The same wakes, then one that brings it a message: it must still be waiting.
        other = take(t, "w1", self.hold)  # a group below the floor, acked while it waits
        wakes[-1] = ("an ack that frees a group below its floor", lambda: t.ack(other))
        waiter = Waiter(self._waiter_handle(t), "w2", self.hold, LONG, FLOOR)
        for _, wake in wakes:
            time.sleep(SETTLE / 2)
            wake()
        time.sleep(SETTLE)
        seq = t.publish("top", ev(30), FLOOR + 1)
        lease, took = waiter.result(WAIT_ON, WAKE)
        assert seen(lease, "seq") == (seq,), (
            f"{WAIT_ON}: a claim waiting {LONG} s, woken first by {what}, then by the publish "
            f"of seq {seq} at priority {FLOOR + 1}, gave {lease} after {took:.2f} s"
        )

    @checks(WAIT_RACE)
    def test_wait_never_misses_a_racing_publish(self) -> None:
        t = self.open()
        waiting = self._waiter_handle(t)
        seed = random.randrange(2**32)
        offsets = random.Random(seed)
        start = threading.Barrier(2, timeout=30)
        got: list[Lease[Any] | None] = []
        took: list[float] = []
        began: list[float] = []
        errors: list[BaseException] = []
        # Both sides sleep a random while after the barrier: the publish lands anywhere
        # from about RACE_BEFORE before the claim starts to RACE_AFTER after it, where a
        # backend's first look and the start of its wait lie.
        claim_delays = [offsets.uniform(0, RACE_BEFORE) for _ in range(RACES)]
        publish_delays = [offsets.uniform(0, RACE_AFTER) for _ in range(RACES)]

        def claimer() -> None:
            try:
                for race in range(RACES):
                    start.wait()
                    time.sleep(claim_delays[race])
                    began.append(time.perf_counter())
                    lease = waiting.claim("w1", self.hold, wait=LONG)
                    took.append(time.perf_counter() - began[-1])
                    got.append(lease)
                    if lease is None or took[-1] > WAKE:
                        start.abort()  # missed: the publisher stops too
                        return
                    waiting.ack(lease)
                    start.wait()  # acked before the next publish
            except BaseException as exc:  # reported in the test's thread
                errors.append(exc)
                start.abort()

        thread = threading.Thread(target=claimer, daemon=True)
        thread.start()
        published: list[int] = []
        landed: list[float] = []
        try:
            for race in range(RACES):
                start.wait()
                time.sleep(publish_delays[race])
                landed.append(time.perf_counter())
                published.append(t.publish("a", ev(len(published))))
                start.wait(WAKE)  # the claim must have come back with it by then
        except threading.BrokenBarrierError:
            pass
        thread.join(WAKE)

        def missed(race: int) -> str:
            offset = (landed[race] - began[race]) * 1000 if race < len(began) else 0.0
            return (
                f"{WAIT_RACE}: race {race + 1} of {RACES} (offsets seeded {seed}): a publish "
                f"made {offset:+.2f} ms from the start of claim(wait={LONG}) was missed"
            )

        assert not thread.is_alive(), f"{missed(len(published) - 1)}: no return {WAKE} s later"
        if errors:
            raise AssertionError(f"{WAIT_RACE}: the claimer raised {errors[0]!r}") from errors[0]
        pairs = enumerate(zip(got, took, strict=True))
        late = [i for i, (lease, spent) in pairs if lease is None or spent > WAKE]
        assert not late, (
            f"{missed(late[0])}: it returned {got[late[0]]} after {took[late[0]]:.2f} s"
        )
        assert [lease.seq for lease in got if lease] == published, (
            f"{WAIT_RACE}: the waiting claims gave other messages than the {RACES} published"
        )

    @checks(BATCH_WAIT)
    def test_batch_claims_wait_as_claim_and_end_empty_after_the_wait(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        held = take(t, "w1", self.hold)
        calls: list[tuple[str, Callable[[float], object]]] = [
            ("claim_many", lambda wait: t.claim_many("w2", self.hold, 3, wait=wait)),
            # Its ack leaves nothing deliverable: the claim after it waits.
            ("ack_and_claim", lambda wait: t.ack_and_claim(held, "w1", self.hold, wait=wait)),
        ]
        for name, call in calls:
            began = time.monotonic()
            got = call(EMPTY_WAIT)
            took = time.monotonic() - began
            assert not got, f"{BATCH_WAIT}: {name}(wait={EMPTY_WAIT}), nothing to take, gave {got}"
            assert took >= EMPTY_WAIT - 0.02, (
                f"{BATCH_WAIT}: {name}(wait={EMPTY_WAIT}) with nothing to take returned after "
                f"{took:.3f} s, before its wait ran out"
            )
        must_raise(BATCH_WAIT, LeaseLost, "an ack after ack_and_claim's", lambda: t.ack(held))

    @checks(BATCH_WAIT)
    def test_batch_claims_wait_woken_by_a_publish(self) -> None:
        t = self.open()
        waiting = self._waiter_handle(t)
        many = Blocked(partial(waiting.claim_many, "w1", self.hold, 5, 0, LONG))
        time.sleep(SETTLE)
        seqs = t.publish_many([Message(group, ev(n)) for n, group in enumerate("abc")])
        leases, took = many.result(BATCH_WAIT, WAKE)
        assert sorted(lease.seq for lease in leases or ()) == seqs, (
            f"{BATCH_WAIT}: a claim_many(5) waiting {LONG} s when seqs {seqs} were published "
            f"at once, each to a group of its own, gave {leases}"
        )
        assert took < LONG / 2, f"{BATCH_WAIT}: the publish woke claim_many after {took:.2f} s"
        assert leases is not None
        waiting.ack_many(leases[1:])
        after = Blocked(partial(waiting.ack_and_claim, leases[0], "w1", self.hold, 0, LONG))
        time.sleep(SETTLE)
        seq = t.publish("d", ev(9))
        lease, took = after.result(BATCH_WAIT, WAKE)
        assert seen(lease, "seq") == (seq,), (
            f"{BATCH_WAIT}: an ack_and_claim waiting {LONG} s when seq {seq} was published "
            f"gave {lease}"
        )
        assert took < LONG / 2, f"{BATCH_WAIT}: the publish woke ack_and_claim after {took:.2f} s"

    @checks(WAIT_CLOSE)
    def test_wait_woken_by_close_from_another_thread(self) -> None:
        t = self.open()
        doomed = self.open() if self.has(MULTI_HANDLE) else t
        t.publish("a", ev(1))
        held = take(t, "w1", self.hold)  # nothing deliverable: the waiter blocks
        waiter = Waiter(doomed, "w2", self.hold, LONG)
        time.sleep(SETTLE)
        doomed.close()
        lease, took = waiter.result(WAIT_CLOSE, WAKE)
        assert lease is None, f"{WAIT_CLOSE}: the claim woken by close returned {lease}"
        assert took < LONG / 2, f"{WAIT_CLOSE}: close woke it after {took:.2f} s"
        if doomed is not t:
            t.ack(held)
            seq = t.publish("b", ev(2))
            after = t.claim("w3", self.hold)
            assert seen(after, "seq", "attempt") == (seq, 1), (
                f"{WAIT_CLOSE}: after close, the next message came as {after}: the closed "
                "claim leased something"
            )
