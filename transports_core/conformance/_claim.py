"""Scenarios of choosing what to deliver: the lease itself, None when idle, FIFO, one in
flight per group, round-robin and its fairness bound, the priority floor and its reset."""

from __future__ import annotations

from transports_core import Event, Transport

from ._base import SuiteBase, checks, seen
from ._properties import (
    CLAIM,
    CLAIM_NONE,
    FAIRNESS,
    FIFO,
    ONE_IN_FLIGHT,
    PRIORITY_FLOOR,
    PRIORITY_RESET,
    ROUND_ROBIN,
)
from ._steps import ev, publish, take


def served(t: Transport[Event], count: int, visibility: float, min_priority: int = 0) -> list[str]:
    """The groups of ``count`` consecutive claims, each acked at once."""
    groups = []
    for _ in range(count):
        lease = t.claim("w1", visibility, min_priority)
        if lease is None:
            break
        groups.append(lease.group_id)
        t.ack(lease)
    return groups


class ClaimScenarios(SuiteBase):
    @checks(CLAIM)
    def test_claim_lease_carries_the_published_message(self) -> None:
        t = self.open()
        seq = t.publish("order-1", Event(kind="created", n=1), 2)
        before = self.now()
        lease = take(t, "worker-a", 30)
        after = self.now()
        assert (lease.seq, lease.group_id, lease.worker_id, lease.attempt) == (
            seq,
            "order-1",
            "worker-a",
            1,
        ), f"{CLAIM}: claim returned {lease}, not seq {seq} of 'order-1' for worker-a, attempt 1"
        assert lease.event == Event(kind="created", n=1), (
            f"{CLAIM}: event came back as {lease.event!r}"
        )
        assert before + 30 - 1 <= lease.expires_at <= after + 30 + 1, (
            f"{CLAIM}: expires_at {lease.expires_at} is not now + visibility ({before + 30:.3f})"
        )

    @checks(CLAIM_NONE)
    def test_claim_none_when_idle(self) -> None:
        t = self.open()
        assert t.claim("w1", self.hold) is None, f"{CLAIM_NONE}: claim on an empty store"
        t.publish("a", ev(1))
        t.publish("b", ev(2), 1)
        a = take(t, "w1", self.hold)
        b = take(t, "w1", self.hold)
        assert t.claim("w2", self.hold) is None, f"{CLAIM_NONE}: claim while every group is leased"
        t.nack(a, self.brief)
        t.ack(b)
        t.publish("c", ev(3), 0)
        assert t.claim("w2", self.hold, min_priority=1) is None, (
            f"{CLAIM_NONE}: claim with a parked group and one below the floor"
        )
        assert take(t, "w2", self.hold).group_id == "c"

    @checks(FIFO)
    def test_fifo_per_group_delivers_in_publish_order(self) -> None:
        t = self.open()
        expected: dict[str, list[int]] = {}
        for n in range(24):
            group = "abcab"[n % 5]
            t.publish(group, ev(n))
            expected.setdefault(group, []).append(n)
        t.publish_many([("c", ev(24), 0), ("a", ev(25), 0), ("c", ev(26), 0)])
        expected["c"] += [24, 26]
        expected["a"].append(25)
        got: dict[str, list[int]] = {}
        while (lease := t.claim("w1", self.hold)) is not None:
            got.setdefault(lease.group_id, []).append(lease.event.n)
            t.ack(lease)
        for group, order in expected.items():
            assert got.get(group) == order, (
                f"{FIFO}: group {group!r} was published as {order}, delivered as {got.get(group)}"
            )

    @checks(ONE_IN_FLIGHT)
    def test_one_in_flight_per_group_holds_the_rest_of_the_group(self) -> None:
        t = self.open()
        publish(t, "a", 0, 1, 2)
        t.publish("b", ev(10))
        first = take(t, "w1", self.hold)
        assert first.group_id == "a"
        other = t.claim("w2", self.hold)
        assert seen(other, "group_id") == ("b",), (
            f"{ONE_IN_FLIGHT}: with group 'a' leased, the next claim gave {other} instead of b's"
        )
        assert other is not None
        t.ack(other)
        extra = t.claim("w3", self.hold)
        assert extra is None, (
            f"{ONE_IN_FLIGHT}: group 'a' is leased to w1, yet w3 was given {extra}"
        )
        t.ack(first)
        nxt = take(t, "w2", self.hold)
        assert (nxt.group_id, nxt.event.n) == ("a", 1), (
            f"{ONE_IN_FLIGHT}: after the ack, claim gave {nxt} instead of a's second message"
        )

    @checks(ROUND_ROBIN)
    def test_round_robin_never_claimed_groups_first_in_order_of_oldest_message(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        t.publish("b", ev(3))
        t.publish("c", ev(4))
        assert served(t, 1, self.hold) == ["a"]
        t.publish("d", ev(5))  # never claimed, but its oldest message is the newest
        order = served(t, 4, self.hold)
        assert order == ["b", "c", "d", "a"], (
            f"{ROUND_ROBIN}: after claiming 'a', groups came as {order}; never-claimed b, c, d "
            "(oldest message first) must come before 'a' again"
        )

    @checks(ROUND_ROBIN)
    def test_round_robin_just_claimed_group_yields(self) -> None:
        t = self.open()
        publish(t, "a", 0, 1, 2)
        publish(t, "b", 0, 1, 2)
        order = served(t, 6, self.hold)
        assert order == ["a", "b", "a", "b", "a", "b"], (
            f"{ROUND_ROBIN}: two groups with three messages each were served as {order}"
        )
        t.publish("b", ev(9))
        t.publish("a", ev(9))
        # Both drained and came back: each is new again, served in order of oldest message.
        assert served(t, 2, self.hold) == ["b", "a"], f"{ROUND_ROBIN}: re-created groups"

    @checks(FAIRNESS)
    def test_fairness_bound_g_claims_serve_g_groups(self) -> None:
        t = self.open()
        groups = [f"g{i}" for i in range(5)]
        sizes = [7, 3, 5, 6, 4]
        for round_ in range(max(sizes)):
            for group, size in zip(groups, sizes, strict=True):
                if round_ < size:
                    t.publish(group, ev(round_))
        order = served(t, sum(sizes), self.hold)
        assert len(order) == sum(sizes), f"{FAIRNESS}: only {len(order)} of {sum(sizes)} came"
        ready = dict(zip(groups, sizes, strict=True))
        start = 0
        while start < len(order):
            live = [g for g in groups if ready[g] > 0]
            window = order[start : start + len(live)]
            assert sorted(window) == sorted(live), (
                f"{FAIRNESS}: with {len(live)} groups ready, claims {start}..."
                f"{start + len(live) - 1} served {window}, not each of {live} once "
                f"(whole order: {order})"
            )
            for g in window:
                ready[g] -= 1
            start += len(live)

    @checks(PRIORITY_FLOOR)
    def test_priority_floor_skips_groups_below_it(self) -> None:
        t = self.open()
        t.publish("low", ev(1), 0)
        t.publish("mid", ev(2), 3)
        t.publish("top", ev(3), 4)
        t.publish("mid", ev(4), 0)  # joins 'mid': the group keeps priority 3
        first = take(t, "w1", self.hold, min_priority=3)
        assert first.group_id == "mid", f"{PRIORITY_FLOOR}: claim(min_priority=3) gave {first}"
        second = take(t, "w1", self.hold, min_priority=4)
        assert second.group_id == "top", f"{PRIORITY_FLOOR}: claim(min_priority=4) gave {second}"
        t.ack(first)
        third = take(t, "w1", self.hold, min_priority=3)
        assert (third.group_id, third.event.n) == ("mid", 4), (
            f"{PRIORITY_FLOOR}: a message published at priority 0 into group 'mid' (priority 3) "
            f"must pass floor 3; claim gave {third}"
        )
        none = t.claim("w1", self.hold, min_priority=1)
        assert none is None, (
            f"{PRIORITY_FLOOR}: only 'low' (priority 0) is ready; floor 1 gave {none}"
        )
        assert take(t, "w1", self.hold, min_priority=0).group_id == "low"

    @checks(PRIORITY_RESET)
    def test_priority_reset_on_republish_after_drain(self) -> None:
        t = self.open()
        t.publish("a", ev(1), 4)
        t.ack(take(t, "w1", self.hold, min_priority=4))
        t.publish("a", ev(2), 0)
        got = t.claim("w1", self.hold, min_priority=4)
        assert got is None, (
            f"{PRIORITY_RESET}: 'a' drained and was re-published at priority 0; floor 4 gave {got}"
        )
        t.ack(take(t, "w1", self.hold))
        t.publish("a", ev(3), 2)
        t.publish("a", ev(4), 4)  # the group exists: this one does not raise it
        got = t.claim("w1", self.hold, min_priority=3)
        assert got is None, (
            f"{PRIORITY_RESET}: 'a' was re-created at priority 2; floor 3 gave {got}"
        )
        lease = take(t, "w1", self.hold, min_priority=2)
        assert lease.event.n == 3, f"{PRIORITY_RESET}: floor 2 gave {lease}"
