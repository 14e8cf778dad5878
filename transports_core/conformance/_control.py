"""Scenarios of group control, `TransportAdmin`'s ``cancel``, ``pause_group``,
``resume_group``, ``paused_groups`` and ``peek``: cancel removes what is not in flight
and leaves a lease alone; a paused group delivers nothing, lets its lease in flight
settle, and stays paused across reopening and its own draining until resumed; peek lists
a group's next messages in the order it will deliver them and changes nothing. A backend
without the ``group-control`` capability must refuse these calls with `Unsupported`.
"""

from __future__ import annotations

from typing import Any, cast

from transports_core import Event, LeaseLost, Transport, TransportAdmin, Unsupported

from ._admin import ageless
from ._base import ADMIN, CONTROL, DURABLE, TIMERS, checks, must_raise
from ._properties import CANCEL, CONTROL_REFUSED, PAUSE, PAUSE_IN_FLIGHT, PAUSE_KEPT, PEEK
from ._steps import Steps, ev, publish, take
from ._timers import events


def admin(t: Transport[Event]) -> TransportAdmin:
    return cast(TransportAdmin, t)


class ControlScenarios(Steps):
    def _control(self) -> TransportAdmin:
        """The test's first handle, as an admin; skips without group control."""
        self.require(ADMIN)
        self.require(CONTROL)
        return admin(self.open())

    @checks(CANCEL)
    def test_cancel_removes_queued_and_parked_messages_never_one_in_flight(self) -> None:
        a = self._control()
        t = cast(Transport[Event], a)
        one, two, three = publish(t, "a", 1, 2, 3)
        (four,) = publish(t, "b", 4)
        lease = take(t, "w1", self.hold)
        assert lease.seq == one
        assert a.cancel(one) is False, f"{CANCEL}: cancel of a message in flight said True"
        assert a.cancel(two) is True, f"{CANCEL}: cancel of a queued message said False"
        assert a.cancel(two) is False, f"{CANCEL}: cancelling {two} twice said True twice"
        assert a.cancel(10**9) is False, f"{CANCEL}: cancel of an unknown seq said True"
        t.ack(lease)  # the lease it left alone is still current
        nxt = take(t, "w1", self.hold)
        t.nack(nxt, delay=self.hold)  # parked: not in flight, so it can be cancelled
        parked = nxt.seq
        assert a.cancel(parked) is True, f"{CANCEL}: cancel of a parked message said False"
        rest = events(t, "w1", self.hold)
        expected = [n for s, n in ((three, 3), (four, 4)) if s != parked]
        assert sorted(rest) == sorted(expected), (
            f"{CANCEL}: after cancelling {two} and {parked}, claims gave {rest}, not {expected}"
        )

    @checks(CANCEL)
    def test_cancel_removes_a_delayed_message(self) -> None:
        a = self._control()
        self.require(TIMERS)
        t = cast(Transport[Event], a)
        published = self.now()
        seq = t.publish("a", ev(1), delay=self.brief)
        t.publish("a", ev(2))
        assert a.cancel(seq) is True, f"{CANCEL}: cancel of a delayed message said False"
        self.pass_deadline(published + self.brief)
        got = events(t, "w1", self.hold)
        assert got == [2], f"{CANCEL}: a cancelled delayed message still came: {got}"

    @checks(CANCEL)
    def test_cancel_finds_a_delayed_message_behind_later_ones(self) -> None:
        a = self._control()
        self.require(TIMERS)
        t = cast(Transport[Event], a)
        published = self.now()
        late = t.publish("a", ev(1), delay=self.brief)
        publish(t, "a", 2, 3)
        self.pass_deadline(published + self.brief)
        # Due, it joined its group's end: behind messages of higher seqs.
        order = [m.seq for m in a.peek("a")]
        assert order[-1] == late, f"{CANCEL}: peek listed {order}, {late} not last"
        assert a.cancel(late) is True, (
            f"{CANCEL}: cancel of {late}, queued behind later seqs {order[:-1]}, said False"
        )
        got = events(t, "w1", self.hold)
        assert got == [2, 3], f"{CANCEL}: after cancelling {late}, claims gave {got}"

    @checks(PAUSE)
    def test_pause_holds_a_group_until_resumed(self) -> None:
        a = self._control()
        t = cast(Transport[Event], a)
        publish(t, "a", 1, 2)
        publish(t, "b", 3)
        assert a.pause_group("a") is True, f"{PAUSE}: pause_group of a group said False"
        assert a.pause_group("a") is False, f"{PAUSE}: pausing a paused group said True"
        assert a.paused_groups() == ["a"], f"{PAUSE}: paused_groups gave {a.paused_groups()}"
        assert a.stats().paused == 1, f"{PAUSE}: stats().paused was {a.stats().paused}"
        got = events(t, "w1", self.hold)
        assert got == [3], f"{PAUSE}: with a paused, claims gave {got}, not b's [3]"
        assert a.resume_group("a") is True, f"{PAUSE}: resume_group said False"
        assert a.resume_group("a") is False, f"{PAUSE}: resuming twice said True twice"
        assert a.paused_groups() == [], f"{PAUSE}: resumed, paused_groups gave {a.paused_groups()}"
        got = events(t, "w1", self.hold)
        assert got == [1, 2], f"{PAUSE}: once resumed, claims gave {got}"

    @checks(PAUSE_IN_FLIGHT)
    def test_pause_lets_a_lease_in_flight_settle(self) -> None:
        a = self._control()
        t = cast(Transport[Event], a)
        publish(t, "a", 1, 2)
        lease = take(t, "w1", self.hold)
        a.pause_group("a")
        renewed = t.extend(lease, self.hold)
        t.ack(renewed)  # raises LeaseLost if the pause broke the lease
        got = t.claim("w1", self.hold)
        assert got is None, f"{PAUSE_IN_FLIGHT}: the paused group gave {got} after its ack"
        a.resume_group("a")
        after = events(t, "w1", self.hold)
        assert after == [2], f"{PAUSE_IN_FLIGHT}: resumed, the group gave {after}"

    @checks(PAUSE_KEPT)
    def test_pause_outlasts_reopening_and_draining(self) -> None:
        a = self._control()
        t = cast(Transport[Event], a)
        a.pause_group("idle")  # a group with no messages yet can be paused
        publish(t, "idle", 1)
        publish(t, "a", 2)
        lease = take(t, "w1", self.hold)
        assert lease.event.n == 2, f"{PAUSE_KEPT}: a paused new group delivered {lease}"
        a.pause_group("a")
        t.ack(lease)  # group a drains while paused
        publish(t, "a", 3)
        if self.has(DURABLE):
            self.close_all()
            t = self.open()
            a = admin(t)
        assert a.paused_groups() == ["a", "idle"], (
            f"{PAUSE_KEPT}: after draining and reopening, paused_groups gave {a.paused_groups()}"
        )
        got = t.claim("w1", self.hold)
        assert got is None, f"{PAUSE_KEPT}: a paused group delivered {got}"
        a.resume_group("idle")
        a.resume_group("a")
        after = sorted(events(t, "w1", self.hold))
        assert after == [1, 3], f"{PAUSE_KEPT}: once resumed, claims gave {after}"

    @checks(PEEK)
    def test_peek_of_a_group_held_by_its_dead_letter_shows_what_waits_behind_it(
        self,
    ) -> None:
        # The dead letter is not one of the group's messages any more (dead_letters lists
        # it), and what follows it waits: queued, not ready. A lease on the buried
        # message is lost because it is gone, not parked.
        self.require(ADMIN)
        self.require(CONTROL)
        t = self.open(on_dead="hold")
        a = admin(t)
        _, s2 = publish(t, "a", 1, 2)
        lease = take(t, "w1", self.hold)
        t.bury(lease, "bad input")
        seen = [(m.seq, m.state) for m in a.peek("a")]
        assert seen == [(s2, "queued")], (
            f"{PEEK}: with 'a' held by its dead letter {lease.seq}, peek gave {seen}, "
            f"not {[(s2, 'queued')]}"
        )
        lost = must_raise(PEEK, LeaseLost, "ack of a buried message's lease", lambda: t.ack(lease))
        assert lost.reason == "gone", (
            f"{PEEK}: acking the buried message's lease said {lost.reason!r}, not 'gone'"
        )

    @checks(PEEK)
    def test_peek_lists_the_next_messages_and_changes_nothing(self) -> None:
        a = self._control()
        t = cast(Transport[Event], a)
        timers = self.has(TIMERS)
        s1, s2 = publish(t, "a", 1, 2)
        delayed = held = None
        if timers:
            delayed = t.publish("a", ev(3), delay=self.hold)
            held = t.publish("a", ev(4), 0, delay=self.hold, hold=True)
        (s5,) = publish(t, "a", 5)
        lease = take(t, "w1", self.hold)
        before = a.stats()
        peeked = a.peek("a", limit=10)
        seen = [(m.seq, m.state) for m in peeked]
        expected: list[tuple[int | None, str]] = [(s1, "in_flight"), (s2, "queued")]
        if timers:
            expected += [(held, "delayed"), (s5, "queued"), (delayed, "delayed")]
        else:
            expected += [(s5, "queued")]
        assert seen == expected, f"{PEEK}: peek gave {seen}, not {expected}"
        head = peeked[0]
        assert (head.attempts, head.group_id, head.priority) == (1, "a", 0), (
            f"{PEEK}: the in-flight head showed {head}"
        )
        assert head.due_at == lease.expires_at, (
            f"{PEEK}: the in-flight head's due_at was {head.due_at}, not its lease's expiry"
        )
        assert (peeked[1].attempts, peeked[1].due_at) == (0, None), (
            f"{PEEK}: a queued message showed {peeked[1]}"
        )
        assert '"n":2' in peeked[1].event.replace(" ", ""), (
            f"{PEEK}: the queued message's event was {peeked[1].event!r}"
        )
        for m in peeked:
            if m.state == "delayed":
                due = m.due_at if m.due_at is not None else 0.0
                assert due > self.now() + self.hold / 2, (
                    f"{PEEK}: delayed message {m.seq} showed due_at {m.due_at}"
                )
        short = [m.seq for m in a.peek("a", limit=2)]
        assert short == [s1, s2], f"{PEEK}: peek(limit=2) gave {short}"
        assert a.peek("nobody") == [], f"{PEEK}: peek of an unknown group gave something"
        after = a.stats()
        assert ageless(after) == ageless(before), (
            f"{PEEK}: peek changed stats from {before} to {after}"
        )
        t.ack(lease)
        nxt = take(t, "w1", self.hold)
        assert (nxt.seq, nxt.attempt) == (s2, 1), (
            f"{PEEK}: after peeking, the next claim gave seq {nxt.seq} attempt {nxt.attempt}"
        )
        loose: Any = a
        must_raise(PEEK, ValueError, "peek(limit=0)", lambda: loose.peek("a", 0))
        must_raise(PEEK, TypeError, "peek(limit='3')", lambda: loose.peek("a", "3"))

    @checks(CONTROL_REFUSED)
    def test_control_refused_without_group_control(self) -> None:
        if not self.has(ADMIN) or self.has(CONTROL):
            return
        a: Any = self.open()
        for what, call in (
            ("cancel(1)", lambda: a.cancel(1)),
            ("pause_group('a')", lambda: a.pause_group("a")),
            ("peek('a')", lambda: a.peek("a")),
        ):
            must_raise(CONTROL_REFUSED, Unsupported, what, call)
