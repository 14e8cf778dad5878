"""Scenarios of `Transport.bury`: fenced like ack, the message out of delivery at once,
and, with the ``admin`` capability (which lets the suite choose ``on_dead`` and read
``dead_letters()``), the group released or held as the policy says and the reason stored
in the shared words of `buried_reason` and `exhausted_reason`."""

from __future__ import annotations

from typing import Any

from transports_core import DeadLetter, LeaseLost, Transport
from transports_core.backend import buried_reason, exhausted_reason

from ._admin import admin
from ._base import ADMIN, checks, must_raise, seen
from ._properties import BURY, BURY_FENCING, BURY_POLICY, DEAD_REASON
from ._steps import Steps, ev, must_not_lose, publish, take


def letters(t: Transport[Any]) -> list[DeadLetter]:
    return admin(t).dead_letters()


class BuryScenarios(Steps):
    @checks(BURY_FENCING)
    def test_bury_fencing_stale_lease_raises_lease_lost_and_changes_nothing(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        stale, current = self.reclaimed(t)
        must_raise(
            BURY_FENCING, LeaseLost, "bury of w1's lapsed lease, re-claimed by w2",
            lambda: t.bury(stale, "stale"),
        )
        must_not_lose("w2's ack after a stale bury", lambda: t.ack(current))
        nxt = t.claim("w3", self.hold)
        gave = f"{BURY_FENCING}: after the ack, claim gave {nxt}"
        assert nxt is not None, gave
        assert seen(nxt, "event") == (ev(2),), gave
        t.ack(nxt)
        must_raise(
            BURY_FENCING, LeaseLost, "bury of an acked lease", lambda: t.bury(current, "late")
        )

    @checks(BURY)
    def test_bury_takes_the_message_out_of_delivery_for_good(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", self.brief)
        t.bury(lease, "cannot be handled")
        self.pass_deadline(lease.expires_at)
        again = t.claim("w2", self.hold)
        assert again is None, f"{BURY}: a buried message was delivered again: {again}"
        must_raise(BURY, LeaseLost, "a second bury of the same lease", lambda: t.bury(lease, "x"))
        must_raise(BURY, LeaseLost, "ack of a buried lease", lambda: t.ack(lease))

    @checks(BURY_POLICY)
    def test_bury_on_dead_release_lets_the_group_go_on(self) -> None:
        self.require(ADMIN)
        t = self.open(on_dead="release")
        publish(t, "a", 1, 2)
        self.buried(t)
        nxt = t.claim("w1", self.hold)
        assert seen(nxt, "event") == (ev(2),), (
            f"{BURY_POLICY}: under on_dead='release', after bury the group's next message "
            f"must come; claim gave {nxt}"
        )
        dead = letters(t)
        assert [(d.group_id, d.held) for d in dead] == [("a", False)], (
            f"{BURY_POLICY}: dead letters under release: {dead}"
        )

    @checks(BURY_POLICY)
    def test_bury_on_dead_hold_blocks_the_group(self) -> None:
        self.require(ADMIN)
        t = self.open(on_dead="hold")
        publish(t, "a", 1, 2)
        t.publish("b", ev(3))
        buried = take(t, "w1", self.hold)
        t.bury(buried, "bad")
        other = t.claim("w1", self.hold)
        gave = f"{BURY_POLICY}: with 'a' held: {other}"
        assert other is not None, gave
        assert seen(other, "group_id") == ("b",), gave
        t.ack(other)
        blocked = t.claim("w1", self.hold)
        assert blocked is None, (
            f"{BURY_POLICY}: under on_dead='hold', group 'a' must wait behind its dead "
            f"letter; claim gave {blocked}"
        )
        dead = letters(t)
        assert [(d.seq, d.held) for d in dead] == [(buried.seq, True)], (
            f"{BURY_POLICY}: dead letters under hold: {dead}"
        )

    @checks(DEAD_REASON)
    def test_dead_letter_reason_of_a_buried_message(self) -> None:
        self.require(ADMIN)
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", self.hold)
        t.bury(lease, "no such customer")
        dead = letters(t)
        assert [(d.seq, d.reason) for d in dead] == [
            (lease.seq, buried_reason("no such customer"))
        ], f"{DEAD_REASON}: after bury(lease, 'no such customer'), dead letters: {dead}"

    @checks(DEAD_REASON)
    def test_dead_letter_reason_says_whether_the_last_delivery_lapsed_or_was_nacked(
        self,
    ) -> None:
        self.require(ADMIN)
        t = self.open(max_attempts=2)
        lapsed = t.publish("a", ev(1))
        nacked = t.publish("b", ev(2))
        for _ in range(2):
            one = take(t, "w1", self.brief)
            two = take(t, "w1", self.brief)
            by_group = {one.group_id: one, two.group_id: two}
            t.nack(by_group["b"])
            self.pass_deadline(by_group["a"].expires_at)
        extra = t.claim("w1", self.hold)
        assert extra is None, f"{DEAD_REASON}: a third delivery with max_attempts=2: {extra}"
        reasons = {d.seq: d.reason for d in letters(t)}
        assert reasons == {
            lapsed: exhausted_reason(2, 2, "lapsed"),
            nacked: exhausted_reason(2, 2, "nacked"),
        }, f"{DEAD_REASON}: reasons of the two exhausted letters: {reasons}"
