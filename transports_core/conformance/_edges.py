"""Scenarios of the promises a backend can break while every other scenario passes: typed
events (a discriminated union too), an event of the wrong type refused at publish, an
event that no longer decodes, publish_many's priority rules, seqs never reused, reserved
worker ids, timing measured from the right moment, and a lapsed lease across a reopen."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from transports_core import Event, EventDecodeError, Lease, LeaseLost, Transport
from transports_core.backend import RESERVED_PREFIX

from ._base import CLOCK, DURABLE, MULTI_HANDLE, ManualClock, checks, must_raise, seen
from ._properties import (
    BATCH_PRIORITY,
    DECODE_ERROR,
    EVENT_REFUSED,
    EVENT_TYPE,
    LAPSED_ACROSS_REOPEN,
    RESERVED_WORKER,
    SEQ_NEVER_REUSED,
    TIMING_EDGES,
)
from ._steps import Steps, ev, must_not_lose, publish, take


class Placed(BaseModel):
    kind: Literal["placed"] = "placed"
    order: int


class Refunded(BaseModel):
    kind: Literal["refunded"] = "refunded"
    order: int
    cents: int


OrderEvent = Annotated[Placed | Refunded, Field(discriminator="kind")]


class EdgeScenarios(Steps):
    @checks(EVENT_TYPE)
    def test_event_type_round_trip_of_a_model(self) -> None:
        t = self.open(event_type=Placed)
        t.publish("o", Placed(order=7))
        lease = take(t, "w1", self.hold)
        got: tuple[object, object] = (type(lease.event), lease.event)
        assert got == (Placed, Placed(order=7)), (
            f"{EVENT_TYPE}: event_type=Placed gave a lease carrying {lease.event!r}"
        )

    @checks(EVENT_TYPE)
    def test_event_type_round_trip_of_a_discriminated_union(self) -> None:
        t = self.open(event_type=OrderEvent)
        t.publish("o", Placed(order=1))
        t.publish("o", Refunded(order=1, cents=250))
        first = take(t, "w1", self.hold)
        t.ack(first)
        second = take(t, "w1", self.hold)
        got: list[tuple[object, object]] = [
            (type(first.event), first.event),
            (type(second.event), second.event),
        ]
        assert got == [
            (Placed, Placed(order=1)),
            (Refunded, Refunded(order=1, cents=250)),
        ], f"{EVENT_TYPE}: a discriminated union came back as {got}"

    @checks(EVENT_REFUSED)
    def test_event_type_refused_at_publish(self) -> None:
        t = self.open(event_type=Placed)
        wrong: list[object] = [Refunded(order=1, cents=1), {"order": 1}, Event(order=1)]
        for event in wrong:
            must_raise(
                EVENT_REFUSED,
                TypeError,
                f"publish of {event!r} on a transport of Placed",
                partial(t.publish, "o", event),
            )
            must_raise(
                EVENT_REFUSED,
                TypeError,
                f"publish_many of {event!r} on a transport of Placed",
                partial(t.publish_many, [("p", Placed(order=2), 0), ("o", event, 0)]),
            )
        written = t.claim("w1", self.hold)
        assert written is None, f"{EVENT_REFUSED}: a refused publish wrote {written}"

    @checks(DECODE_ERROR)
    def test_decode_error_carries_a_lease_that_can_be_acked_or_parked(self) -> None:
        self.require(MULTI_HANDLE)
        loose = self.open()
        typed = self.open(event_type=Placed)
        notes = ("not an order", "nor this")
        seqs = [loose.publish("o", Event(note=note)) for note in notes]
        settles: list[tuple[str, Callable[[Lease[Any]], object]]] = [
            ("ack", typed.ack),
            ("park", lambda lease: typed.nack(lease, self.hold)),
        ]
        for seq, note, (settle, call) in zip(seqs, notes, settles, strict=True):
            error = must_raise(
                DECODE_ERROR,
                EventDecodeError,
                f"claim of seq {seq}, stored as a plain Event, on a transport of Placed",
                lambda: typed.claim("w1", self.hold),
            )
            lease: Lease[Any] = error.lease
            assert (lease.seq, lease.worker_id, lease.attempt) == (seq, "w1", 1), (
                f"{DECODE_ERROR}: EventDecodeError carried {lease}, not seq {seq}'s lease"
            )
            assert note in error.raw, f"{DECODE_ERROR}: the error's raw text is {error.raw!r}"
            must_not_lose(
                f"{settle} of the lease an EventDecodeError carried",
                partial(call, lease),
            )
        left = loose.claim("w2", self.hold)
        assert left is None, f"{DECODE_ERROR}: after an ack and a park, claim gave {left}"

    @checks(BATCH_PRIORITY)
    def test_publish_many_first_item_sets_a_new_groups_priority(self) -> None:
        t = self.open()
        t.publish("live", ev(0), 0)
        t.publish_many(
            [("new", ev(1), 3), ("new", ev(2), 0), ("live", ev(3), 4), ("low", ev(4), 0)]
        )
        t.publish_many([("low", ev(5), 4)])  # joins 'low': leaves its priority alone
        got = []
        while (lease := t.claim("w1", self.hold, min_priority=3)) is not None:
            got.append((lease.group_id, lease.event.n))
            t.ack(lease)
        assert got == [("new", 1), ("new", 2)], (
            f"{BATCH_PRIORITY}: claims at floor 3 gave {got}; only 'new' (created at 3 by its "
            "first item) may pass, 'live' and 'low' stay at priority 0"
        )

    @checks(SEQ_NEVER_REUSED)
    def test_seq_never_reused_after_acking_the_newest(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        t.ack(take(t, "w1", self.hold))
        newest = t.publish("a", ev(2))
        stale = take(t, "w1", self.hold)
        t.ack(stale)
        if self.has(DURABLE):
            self.close_all()
            t = self.open()
        seq = t.publish("a", ev(3))
        assert seq > newest, (
            f"{SEQ_NEVER_REUSED}: after acking the newest message (seq {newest})"
            f"{' and reopening' if self.has(DURABLE) else ''}, publish returned seq {seq}"
        )
        fresh = take(t, "w1", self.hold)
        must_raise(
            SEQ_NEVER_REUSED,
            LeaseLost,
            f"ack of the acked lease on seq {stale.seq} once seq {seq} was published",
            lambda: t.ack(stale),
        )
        t.ack(fresh)

    @checks(RESERVED_WORKER)
    def test_reserved_worker_ids_refused_by_claim(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        for worker in (RESERVED_PREFIX, f"{RESERVED_PREFIX}parked__", f"{RESERVED_PREFIX}x"):
            must_raise(
                RESERVED_WORKER, ValueError, f"claim by {worker!r}",
                partial(t.claim, worker, self.hold),
            )
        lease = take(t, "w1", self.hold)
        t.ack(lease)

    @checks(RESERVED_WORKER)
    def test_reserved_worker_ids_in_a_lease_are_refused_by_settling_calls(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", self.hold)
        ends = self.park(t, lease)
        # A lease forged for a backend's sentinel holder must not touch the parked message.
        for sentinel in (f"{RESERVED_PREFIX}parked__", RESERVED_PREFIX):
            forged = Lease(lease.seq, lease.group_id, lease.event, sentinel, 1, lease.expires_at)
            for name, call in (
                ("ack", lambda f=forged: t.ack(f)),
                ("nack", lambda f=forged: t.nack(f)),
                ("extend", lambda f=forged: t.extend(f, self.hold)),
                ("bury", lambda f=forged: t.bury(f, "forged")),
            ):
                must_raise(
                    RESERVED_WORKER, (ValueError, LeaseLost),
                    f"{name} of a lease naming worker {sentinel!r}", call,
                )
        self.pass_deadline(ends)
        self.again(t, lease, "after forged calls with reserved worker ids and the park's end")

    def _manual_clock(self) -> ManualClock:
        self.require(CLOCK)
        assert self._clock is not None
        return self._clock

    def _due_exactly_at(
        self, t: Transport[Event], lease: Lease[Event], due: float, what: str
    ) -> None:
        """Nothing is claimable 50 ms before ``due``; ``lease``'s message is 10 ms after."""
        clock = self._manual_clock()
        clock.advance_to(due - 0.05)
        early = t.claim("w2", self.hold)
        assert early is None, f"{TIMING_EDGES}: 50 ms before {what}, claim gave {early}"
        clock.advance_to(due + 0.01)
        self.again(t, lease, f"10 ms after {what} (no grace is allowed)")

    @checks(TIMING_EDGES)
    def test_timing_a_lease_is_claimable_as_soon_as_expires_at_passed(self) -> None:
        self._manual_clock()
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", 10)
        self._due_exactly_at(t, lease, lease.expires_at, "expires_at")

    @checks(TIMING_EDGES)
    def test_timing_a_park_lasts_delay_from_the_nack(self) -> None:
        clock = self._manual_clock()
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", 100)
        clock.advance(20)  # the nack comes well after the claim
        nacked_at = clock.now()
        t.nack(lease, 10)
        self._due_exactly_at(
            t, lease, nacked_at + 10, "the park's end, counted from the nack (20 s after the claim)"
        )

    @checks(LAPSED_ACROSS_REOPEN)
    def test_lapsed_lease_nobody_reclaimed_is_current_across_reopen(self) -> None:
        self.require(DURABLE)
        t = self.open()
        publish(t, "a", 1, 2)
        lease = self.lapsed(t)
        self.close_all()
        t = self.open()
        must_not_lose(
            "ack, after closing and reopening the store, of a lapsed lease nobody re-claimed",
            lambda: t.ack(lease),
        )
        nxt = t.claim("w2", self.hold)
        assert seen(nxt, "event") == (ev(2),), f"{LAPSED_ACROSS_REOPEN}: then claim gave {nxt}"
