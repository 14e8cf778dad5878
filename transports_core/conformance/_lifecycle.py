"""Scenarios of handles: context managers and close, several handles on one store, and
durability across closing every handle and opening again."""

from __future__ import annotations

from ._base import DURABLE, MULTI_HANDLE, SuiteBase, checks, seen
from ._properties import DURABILITY, LIFECYCLE, SHARED_STORE
from ._steps import ev, publish, take


class LifecycleScenarios(SuiteBase):
    @checks(LIFECYCLE)
    def test_lifecycle_context_manager_returns_the_transport(self) -> None:
        t = self.open()
        with t as entered:
            assert entered is t, f"{LIFECYCLE}: __enter__ returned {entered!r}, not the transport"
            entered.publish("a", ev(1))
        t.close()  # a second close is harmless
        t.close()

    @checks(SHARED_STORE)
    def test_shared_store_handles_see_one_store(self) -> None:
        self.require(MULTI_HANDLE)
        one, two = self.open(), self.open()
        seq = one.publish("a", ev(1))
        one.publish("a", ev(2))
        lease = two.claim("w2", self.hold)
        assert seen(lease, "seq") == (seq,), (
            f"{SHARED_STORE}: a message published on one handle, claimed on another: {lease}"
        )
        assert one.claim("w1", self.hold) is None, (
            f"{SHARED_STORE}: the lease taken on one handle is not seen by another"
        )
        assert lease is not None
        one.ack(lease)  # a lease is data: any handle may settle it
        nxt = two.claim("w2", self.hold)
        assert seen(nxt, "seq") == (seq + 1,), f"{SHARED_STORE}: after the ack: {nxt}"

    @checks(DURABILITY)
    def test_durability_across_close_and_reopen(self) -> None:
        self.require(DURABLE)
        t = self.open()
        publish(t, "a", 0, 1, 2)
        t.publish("b", ev(10), 3)
        t.publish("c", ev(20))
        t.ack(take(t, "w1", self.hold))  # a's first: gone for good
        held = take(t, "w1", self.hold)  # b's: leased across the reopen
        assert held.group_id == "b"
        retried = take(t, "w1", self.hold)  # c's: nacked once, so attempt 2 next time
        t.nack(retried)
        self.close_all()

        t = self.open()
        assert t.claim("w2", self.hold, min_priority=3) is None, (
            f"{DURABILITY}: b's lease did not survive the reopen"
        )
        got = {}
        while (lease := t.claim("w2", self.hold)) is not None:
            got[lease.event.n] = lease.attempt
            t.ack(lease)
        assert got == {1: 1, 2: 1, 20: 2}, (
            f"{DURABILITY}: after reopening, claims gave {{n: attempt}} = {got}; expected "
            "a's 1 and 2 (attempt 1) and c's 20 (attempt 2)"
        )
        t.ack(held)  # the lease from before the reopen is still current
        assert t.claim("w2", self.hold) is None, f"{DURABILITY}: acked messages came back"
