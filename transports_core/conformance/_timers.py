"""Scenarios of delayed publishes: a delayed message is not delivered before it is due;
once due it joins its group's FIFO as if published at that moment, and until then it
holds nothing; with ``hold`` it keeps its place and holds its group until due; a waiting
claim wakes when one comes due; stats count it as delayed. A backend without the
``timers`` capability must refuse a delayed publish with `Unsupported`.

Every scenario reads time from the suite (the manual clock with the ``clock``
capability), so "due" is moved to, never slept for, where the backend allows it.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Final

from transports_core import Event, Message, Transport, TransportAdmin, Unsupported

from ._base import ADMIN, MULTI_HANDLE, TIMERS, checks, must_raise, seen
from ._properties import (
    DELAY_HOLD,
    DELAY_NOT_BEFORE_DUE,
    DELAY_PLACE,
    DELAY_REFUSED,
    DELAY_STATS,
    DELAY_WAKE,
)
from ._steps import Steps, ev, take
from ._wait import LONG, Waiter

# A delay meant to run out during the test, in the suite's seconds, as a multiple of
# `brief` (so a real-time backend waits about a second, a clock one moves its clock).
DELAY_BRIEFS: Final = 1.5


def events(t: Transport[Event], worker: str, visibility: float) -> list[int]:
    """Claim and ack until nothing comes; the ``n`` of each event, in order."""
    got = []
    while (lease := t.claim(worker, visibility)) is not None:
        got.append(lease.event.n)
        t.ack(lease)
    return got


class TimerScenarios(Steps):
    @property
    def delay(self) -> float:
        return self.brief * DELAY_BRIEFS

    def _timers(self) -> None:
        self.require(TIMERS)

    @checks(DELAY_NOT_BEFORE_DUE)
    def test_delay_not_delivered_before_it_is_due(self) -> None:
        self._timers()
        t = self.open()
        published = self.now()
        t.publish("a", ev(1), delay=self.delay)
        t.publish("b", ev(2))
        lease = take(t, "w1", self.hold)
        assert lease.event.n == 2, f"{DELAY_NOT_BEFORE_DUE}: the first claim gave {lease}"
        t.ack(lease)
        early = t.claim("w1", self.hold)
        assert early is None, (
            f"{DELAY_NOT_BEFORE_DUE}: a message delayed {self.delay} s was delivered "
            f"{self.now() - published:.2f} s after its publish"
        )
        self.pass_deadline(published + self.delay)
        due = take(t, "w1", self.hold)
        assert (due.group_id, due.event.n, due.attempt) == ("a", 1, 1), (
            f"{DELAY_NOT_BEFORE_DUE}: once due, the claim gave {due}"
        )

    @checks(DELAY_PLACE)
    def test_delay_joins_its_group_when_due_and_holds_nothing_before(self) -> None:
        self._timers()
        t = self.open()
        t.publish("a", ev(1))
        head = take(t, "w1", self.hold)
        published = self.now()
        t.publish("a", ev(2), delay=self.delay)
        t.publish("a", ev(3))
        self.pass_deadline(published + self.delay)
        # 2 came due while 1 was in flight and after 3 was published: it joins behind 3.
        t.publish("a", ev(4))
        t.ack(head)
        order = events(t, "w1", self.hold)
        assert order == [3, 2, 4], (
            f"{DELAY_PLACE}: a group published 1, 2 (delayed), 3, and 4 after 2 was due; "
            f"with 1 in flight until then, it delivered {order}, not [3, 2, 4]"
        )

    @checks(DELAY_PLACE)
    def test_delay_lets_its_group_flow_and_keeps_seq_order_among_equals(self) -> None:
        self._timers()
        t = self.open()
        published = self.now()
        t.publish_many(
            [
                Message("a", ev(1), delay=self.delay),
                Message("a", ev(2), delay=self.delay),
                ("a", ev(3), 0),
            ]
        )
        flowing = events(t, "w1", self.hold)
        assert flowing == [3], (
            f"{DELAY_PLACE}: before 1 and 2 were due, the group delivered {flowing}, not [3]"
        )
        self.pass_deadline(published + self.delay)
        due = events(t, "w1", self.hold)
        assert due == [1, 2], (
            f"{DELAY_PLACE}: two messages due at the same moment came as {due}, not in seq "
            "order [1, 2]"
        )

    @checks(DELAY_HOLD)
    def test_delay_hold_keeps_its_place_and_holds_its_group(self) -> None:
        self._timers()
        t = self.open()
        t.publish("a", ev(1))
        published = self.now()
        t.publish("a", ev(2), delay=self.delay, hold=True)
        t.publish("a", ev(3))
        t.publish("b", ev(4))
        before = events(t, "w1", self.hold)
        assert sorted(before) == [1, 4], (
            f"{DELAY_HOLD}: before 2 (delayed, hold=True) was due, claims gave {before}: "
            "only 1 and the other group's 4 may come, 2 holds its group"
        )
        self.pass_deadline(published + self.delay)
        after = events(t, "w1", self.hold)
        assert after == [2, 3], f"{DELAY_HOLD}: once 2 was due, the group gave {after}"

    @checks(DELAY_HOLD)
    def test_delay_hold_on_a_new_group_holds_it_from_the_start(self) -> None:
        self._timers()
        t = self.open()
        published = self.now()
        t.publish("a", ev(1), delay=self.delay, hold=True)
        t.publish("a", ev(2))
        early = t.claim("w1", self.hold)
        assert early is None, f"{DELAY_HOLD}: a group held by a delayed head gave {early}"
        self.pass_deadline(published + self.delay)
        order = events(t, "w1", self.hold)
        assert order == [1, 2], f"{DELAY_HOLD}: once due, the group gave {order}"

    @checks(DELAY_WAKE)
    def test_delay_due_wakes_a_waiting_claim(self) -> None:
        self._timers()
        t = self.open()
        published = self.now()
        t.publish("a", ev(1), delay=self.delay)
        waiter = Waiter(self.open() if self.has(MULTI_HANDLE) else t, "w2", self.hold, LONG)
        time.sleep(0.1)  # let it settle into its wait (the property holds either way)
        allowed = self._lapse(published + self.delay)
        lease, took = waiter.result(DELAY_WAKE, allowed)
        assert seen(lease, "group_id") == ("a",), (
            f"{DELAY_WAKE}: the waiting claim gave {lease} when the delayed message came due"
        )
        assert took < LONG / 2, f"{DELAY_WAKE}: the waiting claim returned only after {took:.2f} s"

    def _lapse(self, deadline: float) -> float:
        if self._clock is not None:
            self._clock.advance_to(deadline + 0.5)
            return 3.5
        return max(deadline - time.time(), 0) + 2.0

    @checks(DELAY_STATS)
    def test_delay_counted_in_stats_until_due(self) -> None:
        self._timers()
        self.require(ADMIN)
        t = self.open()
        admin: Any = t
        assert isinstance(admin, TransportAdmin)
        published = self.now()
        t.publish("a", ev(1), delay=self.delay)
        t.publish("b", ev(2), 3, delay=self.delay, hold=True)
        t.publish("c", ev(3))
        stats = admin.stats()
        counts = (stats.delayed, stats.ready, stats.parked, stats.in_flight)
        assert counts == (2, 1, 0, 0), (
            f"{DELAY_STATS}: with two delayed messages and one ready, stats gave "
            f"delayed, ready, parked, in_flight = {counts}"
        )
        by = {p.priority: p.delayed for p in stats.by_priority}
        assert (by.get(0), by.get(3)) == (1, 1), (
            f"{DELAY_STATS}: delayed by priority gave {by}, not one at 0 and one at 3"
        )
        self.pass_deadline(published + self.delay)
        later = admin.stats()
        assert (later.delayed, later.ready) == (0, 3), (
            f"{DELAY_STATS}: once due, stats gave delayed={later.delayed}, "
            f"ready={later.ready}, not 0 and 3"
        )

    @checks(DELAY_NOT_BEFORE_DUE)
    def test_delay_bad_values_are_refused_before_anything_is_stored(self) -> None:
        self._timers()
        t = self.open()
        loose: Any = t
        year = 366 * 86_400
        for bad, error in (
            (-1, ValueError),
            (float("nan"), ValueError),
            (year + 1, ValueError),
            ("5", TypeError),
            (True, TypeError),
            (None, TypeError),
        ):
            must_raise(
                DELAY_NOT_BEFORE_DUE,
                error,
                f"publish(delay={bad!r})",
                partial(loose.publish, "a", ev(1), delay=bad),
            )
        must_raise(
            DELAY_NOT_BEFORE_DUE,
            TypeError,
            "publish(delay=1, hold='yes')",
            lambda: loose.publish("a", ev(1), delay=1, hold="yes"),
        )
        must_raise(
            DELAY_NOT_BEFORE_DUE,
            ValueError,
            "publish_many with one bad delay",
            lambda: t.publish_many([("a", ev(1), 0), Message("a", ev(2), delay=-1)]),
        )
        t.publish("a", ev(9), delay=year)  # a year is allowed
        t.publish("a", ev(10))
        got = events(t, "w1", self.hold)
        assert got == [10], f"{DELAY_NOT_BEFORE_DUE}: after refused publishes, claims gave {got}"

    @checks(DELAY_REFUSED)
    def test_delay_refused_without_timers(self) -> None:
        if self.has(TIMERS):
            return
        t = self.open()
        must_raise(
            DELAY_REFUSED, Unsupported, "publish(delay=5)", lambda: t.publish("a", ev(1), delay=5)
        )
        must_raise(
            DELAY_REFUSED,
            Unsupported,
            "publish_many with a delayed item",
            lambda: t.publish_many([Message("a", ev(1), delay=5)]),
        )
        assert t.claim("w1", self.hold) is None, (
            f"{DELAY_REFUSED}: a refused delayed publish stored a message"
        )
