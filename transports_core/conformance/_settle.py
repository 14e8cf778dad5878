"""Scenarios of what happens to a lease: ack, lapse and recovery, park, immediate retry,
fencing of stale leases, extend, and attempt counting."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from transports_core import Event, Lease, LeaseLost, LostReason, Settlement, Transport

from ._base import checks, must_raise
from ._properties import (
    ATTEMPT,
    EXTEND,
    FENCING,
    LEASE_RECOVERY,
    LOST_REASON,
    NACK_NOW,
    NO_LOSS,
    PARK,
)
from ._steps import Steps, ev, must_not_lose, publish, take

# A call that settles a held lease (ack, nack, extend, bury), fenced alike.
LeaseCall = Callable[[Transport[Event], Lease[Event]], object]
SETTLES: list[tuple[str, LeaseCall]] = [
    ("ack", lambda t, lease: t.ack(lease)),
    ("nack", lambda t, lease: t.nack(lease)),
    ("nack-delay", lambda t, lease: t.nack(lease, 1.0)),
    ("extend", lambda t, lease: t.extend(lease, 60)),
    ("bury", lambda t, lease: t.bury(lease, "stale")),
]
settles = pytest.mark.parametrize("settle", [pytest.param(fn, id=name) for name, fn in SETTLES])


class SettleScenarios(Steps):
    @checks(NO_LOSS)
    def test_no_loss_acked_message_never_returns(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", self.brief)
        t.ack(lease)
        self.pass_deadline(lease.expires_at)
        again = t.claim("w2", self.brief)
        assert again is None, (
            f"{NO_LOSS}: an acked message came back after its lease ran out: {again}"
        )

    @checks(LEASE_RECOVERY)
    def test_lease_recovery_after_lapse(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        lease = take(t, "w1", self.brief)
        held = t.claim("w2", self.brief)
        assert held is None, f"{LEASE_RECOVERY}: a live lease was handed out again: {held}"
        self.pass_deadline(lease.expires_at)
        again = self.again(t, lease, "after w1's lease lapsed")
        assert again.worker_id == "w2", f"{LEASE_RECOVERY}: w2's claim gave {again}"

    @checks(PARK)
    def test_park_holds_the_group_then_releases_it(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        t.publish("b", ev(3))
        lease = take(t, "w1", self.hold)
        assert lease.group_id == "a"
        ends = self.park(t, lease)
        other = take(t, "w1", self.hold)
        assert other.group_id == "b", f"{PARK}: with 'a' parked, claim gave {other}, not b's"
        t.ack(other)
        held = t.claim("w2", self.hold)
        assert held is None, f"{PARK}: group 'a' is parked, yet claim gave {held}"
        self.pass_deadline(ends)
        self.again(t, lease, "when the park ran out")

    @checks(NACK_NOW)
    def test_nack_immediate_retry_comes_before_the_group_next(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        lease = take(t, "w1", self.hold)
        t.nack(lease)
        self.again(t, lease, "right after nack()")

    @checks(FENCING)
    @settles
    def test_fencing_stale_lease_raises_lease_lost_after_reclaim(self, settle: LeaseCall) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        stale, current = self.reclaimed(t)
        raised = must_raise(
            FENCING, LeaseLost, "a call on a re-claimed lease", lambda: settle(t, stale)
        )
        assert raised.lease == stale, f"{FENCING}: LeaseLost carries {raised.lease}"
        # w2's lease is untouched: still held, still current, message still there.
        intruder = t.claim("w3", self.hold)
        assert intruder is None, f"{FENCING}: the stale call released w2's lease: w3 got {intruder}"
        t.extend(current, self.hold)
        t.ack(current)
        nxt = take(t, "w3", self.hold)
        assert nxt.event.n == 2, f"{FENCING}: after w2's ack, claim gave {nxt}"

    @checks(FENCING)
    @settles
    def test_fencing_same_worker_older_attempt_raises_lease_lost(self, settle: LeaseCall) -> None:
        t = self.open()
        t.publish("a", ev(1))
        first = self.lapsed(t, "w1")
        second = take(t, "w1", self.hold)
        assert second.attempt == first.attempt + 1, f"{ATTEMPT}: {first} then {second}"
        must_raise(FENCING, LeaseLost, "a call on an older attempt", lambda: settle(t, first))
        assert t.claim("w2", self.hold) is None, f"{FENCING}: attempt 1 released attempt 2"
        t.ack(second)

    @checks(FENCING)
    @settles
    def test_fencing_settled_lease_raises_lease_lost(self, settle: LeaseCall) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        acked = take(t, "w1", self.hold)
        t.ack(acked)
        must_raise(FENCING, LeaseLost, "a call on an acked lease", lambda: settle(t, acked))
        nacked = take(t, "w1", self.hold)
        t.nack(nacked, self.brief)
        must_raise(FENCING, LeaseLost, "a call on a nacked lease", lambda: settle(t, nacked))
        assert t.claim("w2", self.hold) is None, f"{FENCING}: a stale call ended the park"

    @checks(FENCING)
    @settles
    def test_fencing_lapsed_lease_nobody_reclaimed_is_still_current(
        self, settle: LeaseCall
    ) -> None:
        t = self.open()
        t.publish("a", ev(1))
        lease = self.lapsed(t)
        must_not_lose("a call on a lapsed lease that nobody re-claimed", lambda: settle(t, lease))

    def _says_why(
        self, lost: LeaseLost, reason: LostReason, how: str, call: str = "a call"
    ) -> None:
        assert lost.reason == reason, (
            f"{LOST_REASON}: {call} on a lease {how} gave LeaseLost with reason "
            f"{lost.reason!r}, expected {reason!r}"
        )

    @checks(LOST_REASON)
    @settles
    def test_lease_lost_says_why_for_each_way_a_lease_is_lost(self, settle: LeaseCall) -> None:
        t = self.open()

        def lost(lease: Lease[Event], reason: LostReason, how: str) -> None:
            raised = must_raise(
                LOST_REASON, LeaseLost, f"a call on a lease {how}", lambda: settle(t, lease)
            )
            self._says_why(raised, reason, how)

        t.publish("a", ev(1))
        acked = take(t, "w1", self.hold)
        t.ack(acked)
        lost(acked, "gone", "that was acked")
        t.publish("b", ev(2))
        buried = self.buried(t)
        lost(buried, "gone", "that was buried")
        t.publish("c", ev(3))
        nacked = take(t, "w1", self.hold)
        t.nack(nacked)
        lost(nacked, "released", "that was nacked")
        t.ack(self.again(t, nacked, "after nack()"))
        t.publish("d", ev(4))
        stale, current = self.reclaimed(t)
        lost(stale, "redelivered", "that lapsed, its message claimed again")
        t.ack(current)
        t.publish("e", ev(5))
        parked = take(t, "w1", self.hold)
        self.park(t, parked)
        lost(parked, "parked", "that was nacked with a delay")

    @checks(LOST_REASON)
    def test_lease_lost_says_why_in_the_batch_calls(self) -> None:
        t = self.open()
        publish(t, "a", 1)
        publish(t, "b", 2)
        first, second = take(t, "w1", self.hold), take(t, "w1", self.hold)
        t.ack(first)
        stale = t.settle_many([Settlement(first), Settlement(second, "nack")])
        assert [x.lease for x in stale] == [first], f"{LOST_REASON}: settle_many gave {stale}"
        self._says_why(stale[0], "gone", "that was acked", "settle_many")
        again = t.ack_many([second])
        assert [x.lease for x in again] == [second], f"{LOST_REASON}: ack_many gave {again}"
        self._says_why(again[0], "released", "that settle_many nacked", "ack_many")
        raised = must_raise(
            LOST_REASON,
            LeaseLost,
            "ack_and_claim of an acked lease",
            lambda: t.ack_and_claim(first, "w1", self.hold),
        )
        self._says_why(raised, "gone", "that was acked", "ack_and_claim")
        t.ack(take(t, "w1", self.hold))

    @checks(EXTEND)
    def test_extend_keeps_the_message_past_its_first_deadline(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", self.brief)
        before = self.now()
        longer = t.extend(lease, self.brief * 3)
        assert (longer.seq, longer.worker_id, longer.attempt, longer.event) == (
            lease.seq,
            lease.worker_id,
            lease.attempt,
            lease.event,
        ), f"{EXTEND}: extend returned {longer} for {lease}"
        assert longer.expires_at >= before + self.brief * 3 - 0.5, (
            f"{EXTEND}: extend by {self.brief * 3}s returned expires_at {longer.expires_at}, "
            f"not about {before + self.brief * 3:.3f}"
        )
        self.pass_deadline(lease.expires_at)
        held = t.claim("w2", self.hold)
        assert held is None, (
            f"{EXTEND}: past the first deadline the extended lease was lost: {held}"
        )
        self.pass_deadline(longer.expires_at)
        self.again(t, lease, "past the extended deadline")

    @checks(ATTEMPT)
    def test_attempt_counting_each_delivery(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        attempts = []
        lease = take(t, "w1", self.hold)
        attempts.append(lease.attempt)
        lease = t.extend(lease, self.brief)  # extend is not a delivery
        t.nack(lease)
        lease = take(t, "w1", self.brief)
        attempts.append(lease.attempt)
        self.pass_deadline(lease.expires_at)
        lease = take(t, "w2", self.hold)
        attempts.append(lease.attempt)
        t.nack(lease, self.brief)
        self.wait(self.brief)
        lease = take(t, "w1", self.hold)
        attempts.append(lease.attempt)
        assert attempts == [1, 2, 3, 4], (
            f"{ATTEMPT}: first delivery, then after nack(), a lapse and a park: {attempts}"
        )
        t.publish("b", ev(2))
        fresh = take(t, "w1", self.hold)
        assert fresh.attempt == 1, f"{ATTEMPT}: another message starts at 1, got {fresh.attempt}"
