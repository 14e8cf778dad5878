"""Scenarios of the batch calls, each held to the promises of its single form:
``claim_many`` leases what as many successive claims would, in their order, one per
group, above the floor; ``settle_many`` and ``ack_many`` fence each lease on its own,
report the stale ones and settle the rest; ``ack_and_claim`` is an ack then a claim, and
claims nothing when its ack finds the lease gone; bad input to any of them changes
nothing.

Where a batch is compared with single calls, the two run on twin sets of groups (the same
publishes under two prefixes), the second set published only once the first is drained,
so that each starts from the same round-robin state.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from transports_core import (
    Event,
    EventDecodeError,
    Lease,
    LeaseLost,
    Message,
    Settlement,
    Transport,
    TransportAdmin,
)

from ._base import ADMIN, MULTI_HANDLE, TENANTS, checks, must_raise
from ._edges import Placed
from ._properties import (
    BATCH_ACK_CLAIM,
    BATCH_BAD_INPUT,
    BATCH_CLAIM,
    BATCH_FENCING,
    DECODE_ERROR,
)
from ._steps import Steps, ev, must_not_lose, publish, take

# Six groups, of priorities 0 to 3, two messages each: (suffix, priority).
_LAYOUT = [("g0", 0), ("g1", 2), ("g2", 0), ("g3", 3), ("g4", 1), ("g5", 2)]


def _fill(t: Transport[Event], prefix: str) -> None:
    t.publish_many([Message(f"{prefix}{g}", ev(n), p) for n in (1, 2) for g, p in _LAYOUT])


def _shape(leases: list[Lease[Event]], prefix: str) -> list[tuple[str, int, int]]:
    """What a batch leased, its prefix taken off: (group suffix, event n, attempt)."""
    return [(lease.group_id.removeprefix(prefix), lease.event.n, lease.attempt) for lease in leases]


def _head(lease: Lease[Event] | None) -> tuple[str, int] | None:
    return None if lease is None else (lease.group_id, lease.event.n)


def _drain(t: Transport[Event], worker: str, hold: float) -> None:
    while (lease := t.claim(worker, hold)) is not None:
        t.ack(lease)


def settle_made(t: Transport[Any], make: Callable[[], list[Any]]) -> object:
    """``settle_many`` of the batch ``make`` makes (and may refuse to make)."""
    return t.settle_many(make())


class BatchScenarios(Steps):
    def _singles(
        self, t: Transport[Event], prefix: str, count: int, floor: int
    ) -> list[Lease[Event]]:
        got = []
        for _ in range(count):
            lease = t.claim("w-one", self.hold, floor)
            if lease is None:
                break
            got.append(lease)
        return got

    @checks(BATCH_CLAIM)
    def test_claim_many_leases_what_successive_claims_would(self) -> None:
        t = self.open()
        for limit, floor in ((4, 0), (3, 2), (10, 0)):
            one, many = f"s{limit}{floor}-", f"m{limit}{floor}-"
            _fill(t, one)
            singles = self._singles(t, one, limit, floor)
            for lease in singles:
                t.ack(lease)
            _drain(t, "w-drain", self.hold)
            _fill(t, many)
            batch = t.claim_many("w-many", self.hold, limit, floor)
            assert _shape(batch, many) == _shape(singles, one), (
                f"{BATCH_CLAIM}: claim_many(limit={limit}, min_priority={floor}) leased "
                f"{_shape(batch, many)}; {limit} claims leased {_shape(singles, one)}"
            )
            assert all(lease.worker_id == "w-many" for lease in batch), (
                f"{BATCH_CLAIM}: claim_many leased for {[x.worker_id for x in batch]}"
            )
            for lease in batch:
                t.ack(lease)
            _drain(t, "w-drain", self.hold)

    @checks(BATCH_CLAIM)
    def test_claim_many_takes_tenants_turns_as_successive_claims_would(self) -> None:
        """With tenants of weights 7 and 3, claims take their groups in the tenants'
        turns: a batch must take them in the same. Each side has tenants of its own,
        new to the store, so that both start from the same turns. (Weights whose turns
        tie only after the tenth claim: a tie broken by name depends on sums of
        fractions that may round either way, and the sides' sums start at different
        points of the queue's virtual time.)"""
        self.require(ADMIN)
        self.require(TENANTS)
        t = self.open()
        admin = cast(TransportAdmin, t)
        token = uuid.uuid4().hex[:8]

        def fill(side: str) -> None:
            admin.set_tenant_weight(f"{side}big{token}", 7)
            admin.set_tenant_weight(f"{side}small{token}", 3)
            t.publish_many(
                [
                    Message(f"{side}{name}{token}-g{g}", ev(n), tenant=f"{side}{name}{token}")
                    for n in (1, 2)
                    for name, groups in (("big", 8), ("small", 4))
                    for g in range(groups)
                ]
            )

        def shape(leases: list[Lease[Event]], side: str) -> list[str]:
            return [lease.group_id.removeprefix(side).replace(token, "") for lease in leases]

        for limit in (5, 10):
            one, many = f"s{limit}", f"m{limit}"
            fill(one)
            singles = self._singles(t, one, limit, 0)
            for lease in singles:
                t.ack(lease)
            _drain(t, "w-drain", self.hold)
            fill(many)
            batch = t.claim_many("w-many", self.hold, limit)
            assert shape(batch, many) == shape(singles, one), (
                f"{BATCH_CLAIM}: with tenants weighted 7 and 3, claim_many(limit={limit}) "
                f"leased {shape(batch, many)}; {limit} claims leased {shape(singles, one)}"
            )
            for lease in batch:
                t.ack(lease)
            _drain(t, "w-drain", self.hold)

    @checks(BATCH_CLAIM)
    def test_claim_many_never_gives_a_busy_group_or_two_of_one(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2, 3)
        publish(t, "b", 4, 5)
        publish(t, "c", 6)
        held = take(t, "w1", self.hold)
        assert held.group_id == "a"
        batch = t.claim_many("w2", self.hold, 5)
        groups = [lease.group_id for lease in batch]
        assert sorted(groups) == ["b", "c"], (
            f"{BATCH_CLAIM}: with a in flight, claim_many(5) over a, b, c leased {groups}"
        )
        assert [lease.event.n for lease in batch] == [4, 6] or [
            lease.event.n for lease in batch
        ] == [6, 4], f"{BATCH_CLAIM}: claim_many leased {[x.event.n for x in batch]}"
        assert t.claim_many("w3", self.hold, 3) == [], (
            f"{BATCH_CLAIM}: with every group in flight, claim_many leased something"
        )

    @checks(BATCH_CLAIM)
    def test_claim_many_with_a_lease_shorter_than_the_batch_gives_one_per_group(self) -> None:
        # A visibility of a microsecond lapses while the batch is still leasing: its
        # later claims must not take the groups of its first leases again.
        t = self.open()
        publish(t, "a", 1, 2, 3)
        publish(t, "b", 4)
        batch = t.claim_many("w1", 1e-6, 5)
        groups = [lease.group_id for lease in batch]
        assert batch, f"{BATCH_CLAIM}: claim_many(5) with a visibility of 1 us leased nothing"
        assert len(set(groups)) == len(groups), (
            f"{BATCH_CLAIM}: claim_many(5) with a visibility of 1 us leased {groups} "
            f"(seqs {[lease.seq for lease in batch]}, attempts "
            f"{[lease.attempt for lease in batch]}): one group twice"
        )

    @checks(DECODE_ERROR)
    def test_decode_error_of_claim_many_holds_the_whole_batch(self) -> None:
        self.require(MULTI_HANDLE)
        loose = self.open()
        typed = self.open(event_type=Placed)
        stored = [
            ("a", Event(kind="placed", order=1)),
            ("b", Event(note="not an order")),
            ("c", Event(kind="placed", order=3)),
            ("d", Event(note="nor this")),
        ]
        seqs = [loose.publish(group, event) for group, event in stored]
        error = must_raise(
            DECODE_ERROR,
            EventDecodeError,
            "claim_many of four, two stored as plain Events, on a transport of Placed",
            lambda: typed.claim_many("w1", self.hold, 4),
        )
        assert error.lease.seq == seqs[1], (
            f"{DECODE_ERROR}: claim_many's EventDecodeError carried seq {error.lease.seq}, "
            f"not the first that failed ({seqs[1]})"
        )
        held = sorted(lease.seq for lease in [error.lease, *error.others])
        assert held == seqs, (
            f"{DECODE_ERROR}: claim_many's EventDecodeError held {held} (lease and others), "
            f"not the whole batch {seqs}: the rest would be leased with no holder"
        )
        orders = [lease.event.order for lease in error.others if isinstance(lease.event, Placed)]
        assert orders == [1, 3], (
            f"{DECODE_ERROR}: the batch's decoded leases carried orders {orders}, not [1, 3]"
        )
        for lease in [error.lease, *error.others]:
            must_not_lose(
                f"an ack of seq {lease.seq} from claim_many's EventDecodeError",
                partial(typed.ack, lease),
            )
        left = loose.claim("w2", self.hold)
        assert left is None, f"{DECODE_ERROR}: after the batch's acks, claim gave {left}"

    @checks(BATCH_FENCING)
    def test_settle_many_fences_each_lease_and_settles_the_rest(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        publish(t, "b", 3)
        publish(t, "c", 4)
        publish(t, "d", 5)
        a, b, c, d = (take(t, "w1", self.hold) for _ in range(4))
        assert [x.group_id for x in (a, b, c, d)] == ["a", "b", "c", "d"]
        t.ack(b)  # b's lease is stale from here on
        items = [
            Settlement(a),
            Settlement(b),
            Settlement(c, "nack", delay=self.hold),
            Settlement(b, "bury", reason="never"),
            Settlement(d, "bury", reason="poison"),
        ]
        try:
            stale = t.settle_many(items)
        except LeaseLost as error:
            raise AssertionError(
                f"{BATCH_FENCING}: settle_many raised for a stale lease ({error}) instead "
                "of reporting it and settling the others"
            ) from error
        lost = [(type(x), x.lease.seq) for x in stale]
        assert lost == [(LeaseLost, b.seq), (LeaseLost, b.seq)], (
            f"{BATCH_FENCING}: settle_many reported {lost} stale, not b's lease twice"
        )
        nxt = t.claim("w2", self.hold)
        assert nxt is not None, f"{BATCH_FENCING}: after settle_many, a's next was not claimable"
        assert _head(nxt) == ("a", 2), (
            f"{BATCH_FENCING}: after settle_many acked a, the next claim gave {nxt}"
        )
        assert t.claim("w2", self.hold) is None, (
            f"{BATCH_FENCING}: after settle_many parked c and buried d, a claim found more"
        )
        t.ack(nxt)
        for lease in (a, c, d):
            must_raise(
                BATCH_FENCING,
                LeaseLost,
                f"an ack of the lease on {lease.group_id} that settle_many settled",
                partial(t.ack, lease),
            )

    @checks(BATCH_FENCING)
    def test_ack_many_reports_only_the_stale_leases(self) -> None:
        t = self.open()
        for g in "abc":
            publish(t, g, 1)
        leases = [take(t, "w1", self.hold) for _ in range(3)]
        t.nack(leases[1])  # given back: its lease is stale
        again = take(t, "w2", self.hold)
        assert again.group_id == leases[1].group_id
        stale = t.ack_many(leases)
        assert [x.lease for x in stale] == [leases[1]], (
            f"{BATCH_FENCING}: ack_many reported {[x.lease.seq for x in stale]} stale, "
            f"not [{leases[1].seq}]"
        )
        assert t.ack_many([]) == [], f"{BATCH_FENCING}: ack_many([]) reported something"
        t.ack(again)  # the re-claim's lease was left alone
        assert t.claim("w3", self.hold) is None, (
            f"{BATCH_FENCING}: after ack_many, a claim found a message"
        )

    @checks(BATCH_ACK_CLAIM)
    def test_ack_and_claim_is_an_ack_then_a_claim(self) -> None:
        t = self.open()
        publish(t, "a", 1, 2)
        publish(t, "b", 3)
        first = take(t, "w1", self.hold)
        nxt = t.ack_and_claim(first, "w1", self.hold)
        assert nxt is not None, f"{BATCH_ACK_CLAIM}: ack_and_claim after a's first gave None"
        assert _head(nxt) == ("b", 3), (
            f"{BATCH_ACK_CLAIM}: ack_and_claim after a's first gave {nxt}, not b's 3 (round-robin)"
        )
        after = t.ack_and_claim(nxt, "w1", self.hold)
        assert after is not None, f"{BATCH_ACK_CLAIM}: the second ack_and_claim gave None"
        assert _head(after) == ("a", 2), f"{BATCH_ACK_CLAIM}: ack_and_claim gave {after}, not a's 2"
        assert t.ack_and_claim(after, "w1", self.hold) is None, (
            f"{BATCH_ACK_CLAIM}: ack_and_claim of the last message claimed something"
        )
        must_raise(
            BATCH_ACK_CLAIM,
            LeaseLost,
            "ack_and_claim of an acked lease",
            lambda: t.ack_and_claim(first, "w1", self.hold),
        )

    @checks(BATCH_ACK_CLAIM)
    def test_ack_and_claim_with_a_stale_lease_claims_nothing(self) -> None:
        t = self.open()
        publish(t, "a", 1)
        publish(t, "b", 2)
        lease = take(t, "w1", self.hold)
        t.nack(lease)
        must_raise(
            BATCH_ACK_CLAIM,
            LeaseLost,
            "ack_and_claim of a nacked lease",
            lambda: t.ack_and_claim(lease, "w1", self.hold),
        )
        got = sorted(take(t, "w2", self.hold).event.n for _ in range(2))
        assert got == [1, 2], (
            f"{BATCH_ACK_CLAIM}: after a refused ack_and_claim, claims gave {got}: "
            "it leased (or acked) something"
        )

    @checks(BATCH_BAD_INPUT)
    def test_bad_batches_change_nothing(self) -> None:
        t = self.open()
        publish(t, "a", 1)
        publish(t, "b", 2)
        bad_limits: list[Any] = [0, -1, True, 2.5, "3", None]
        for limit in bad_limits:
            must_raise(
                BATCH_BAD_INPUT,
                (ValueError, TypeError),
                f"claim_many(limit={limit!r})",
                partial(t.claim_many, "w1", self.hold, limit),
            )
        must_raise(
            BATCH_BAD_INPUT,
            ValueError,
            "claim_many(wait=-1)",
            lambda: t.claim_many("w1", self.hold, 2, wait=-1),
        )
        a = take(t, "w1", self.hold)
        # Each batch is made inside the call: a bad `Settlement` is refused when made.
        bad_batches: list[tuple[str, Callable[[], list[Any]]]] = [
            ("a bare tuple", lambda: [Settlement(a), (a, "ack")]),
            ("a nack with delay=-1", lambda: [Settlement(a), Settlement(a, "nack", delay=-1)]),
            ("an ack with delay=-1", lambda: [Settlement(a), Settlement(a, "ack", delay=-1)]),
            ("a bury with reason=''", lambda: [Settlement(a), Settlement(a, "bury", reason="")]),
        ]
        for what, items in bad_batches:
            must_raise(
                BATCH_BAD_INPUT,
                (ValueError, TypeError),
                f"settle_many of {what}",
                partial(settle_made, t, items),
            )
        must_raise(
            BATCH_BAD_INPUT,
            ValueError,
            "Settlement(lease, 'drop')",
            lambda: Settlement(a, "drop"),  # type: ignore[arg-type]  # the bad value on purpose
        )
        must_raise(
            BATCH_BAD_INPUT,
            (ValueError, TypeError),
            "ack_many of a non-lease",
            lambda: t.ack_many([a, "not a lease"]),  # type: ignore[list-item]  # on purpose
        )
        t.ack(a)  # every refused batch left a's lease as it was
        b = take(t, "w1", self.hold)
        assert b.event.n == 2, f"{BATCH_BAD_INPUT}: after the refused batches, b gave {b}"
