"""Scenarios of publishing: seq order, publish_many, nothing lost, and the bad-input errors
of the core contract (raised before anything is written), with the bounds every backend
shares: counts, seqs and attempts up to 2**63 - 1, group ids published up to 512
characters, and text (ids, keys, tenants, reasons) without a NUL or a lone surrogate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, cast

import pytest

from transports_core import Event, Lease, LeaseLost, Message, Settlement, Transport, TransportAdmin
from transports_core.backend import MAX_COUNT, MAX_GROUP_ID

from ._base import ADMIN, CONTROL, TENANTS, TIMERS, SuiteBase, checks, must_raise, seen
from ._properties import BAD_INPUT, NO_LOSS, PUBLISH
from ._steps import ev

TOO_BIG = MAX_COUNT + 1  # 2**63: no store's integer holds it


def loose(t: Transport[Event]) -> Any:
    """``t``, untyped: the suite calls it with wrong types on purpose, to see them refused."""
    return t


def forged(lease: Lease[Event], **fields: Any) -> Lease[Event]:
    """``lease`` with ``fields`` replaced, whatever their types: a lease made by hand."""
    return replace(lease, **fields)


# (id, argument the error must name, expected error, the bad call given a held lease)
BadCall = Callable[[Transport[Event], Lease[Event]], object]
BAD_CALLS: list[tuple[str, str, type[Exception], BadCall]] = [
    ("publish-group_id-empty", "group_id", ValueError, lambda t, _: t.publish("", ev(9))),
    ("publish-group_id-int", "group_id", TypeError, lambda t, _: loose(t).publish(7, ev(9))),
    ("publish-priority-5", "priority", ValueError, lambda t, _: t.publish("c", ev(9), 5)),
    ("publish-priority-negative", "priority", ValueError, lambda t, _: t.publish("c", ev(9), -1)),
    ("publish-priority-bool", "priority", TypeError, lambda t, _: t.publish("c", ev(9), True)),
    (
        "publish-priority-float",
        "priority",
        TypeError,
        lambda t, _: loose(t).publish("c", ev(9), 1.0),
    ),
    ("publish-event-dict", "event", TypeError, lambda t, _: loose(t).publish("c", {"n": 9})),
    (
        "publish_many-bad-priority-midway",
        "priority",
        ValueError,
        lambda t, _: t.publish_many([("c", ev(9), 0), ("d", ev(9), 7), ("e", ev(9), 0)]),
    ),
    (
        "publish_many-bad-group-midway",
        "group_id",
        ValueError,
        lambda t, _: t.publish_many([("c", ev(9), 0), ("", ev(9), 0)]),
    ),
    ("publish-key-empty", "key", ValueError, lambda t, _: t.publish("c", ev(9), key="")),
    ("publish-key-256", "key", ValueError, lambda t, _: t.publish("c", ev(9), key="k" * 256)),
    (
        "publish-key-int",
        "key",
        TypeError,
        lambda t, _: t.publish("c", ev(9), key=7),  # type: ignore[arg-type]  # on purpose
    ),
    (
        "publish_many-bad-key-midway",
        "key",
        ValueError,
        lambda t, _: t.publish_many([Message("c", ev(9), key="k"), Message("d", ev(9), key="")]),
    ),
    ("claim-worker_id-empty", "worker_id", ValueError, lambda t, _: t.claim("", 30)),
    ("claim-worker_id-int", "worker_id", TypeError, lambda t, _: loose(t).claim(3, 30)),
    ("claim-visibility-zero", "visibility", ValueError, lambda t, _: t.claim("w2", 0)),
    ("claim-visibility-negative", "visibility", ValueError, lambda t, _: t.claim("w2", -1)),
    ("claim-visibility-nan", "visibility", ValueError, lambda t, _: t.claim("w2", math.nan)),
    ("claim-visibility-inf", "visibility", ValueError, lambda t, _: t.claim("w2", math.inf)),
    ("claim-visibility-str", "visibility", TypeError, lambda t, _: loose(t).claim("w2", "30")),
    ("claim-min_priority-5", "min_priority", ValueError, lambda t, _: t.claim("w2", 30, 5)),
    ("claim-min_priority-negative", "min_priority", ValueError, lambda t, _: t.claim("w2", 30, -1)),
    ("ack-not-a-lease", "lease", TypeError, lambda t, _: loose(t).ack("lease-1")),
    ("nack-not-a-lease", "lease", TypeError, lambda t, _: loose(t).nack(("a", 1))),
    ("nack-delay-negative", "delay", ValueError, lambda t, lease: t.nack(lease, -1)),
    ("nack-delay-nan", "delay", ValueError, lambda t, lease: t.nack(lease, math.nan)),
    ("nack-delay-str", "delay", TypeError, lambda t, lease: loose(t).nack(lease, "1")),
    ("extend-visibility-zero", "visibility", ValueError, lambda t, lease: t.extend(lease, 0)),
    ("extend-visibility-inf", "visibility", ValueError, lambda t, lease: t.extend(lease, math.inf)),
    # A lease's own fields, for a lease made by hand: each checked before the store sees it.
    ("ack-lease-worker_id-int", "worker_id", TypeError, lambda t, x: t.ack(forged(x, worker_id=5))),
    ("nack-lease-group_id-int", "group_id", TypeError, lambda t, x: t.nack(forged(x, group_id=5))),
    ("extend-lease-seq-bool", "seq", TypeError, lambda t, x: t.extend(forged(x, seq=True), 30)),
    (
        "bury-lease-worker_id-int",
        "worker_id",
        TypeError,
        lambda t, x: t.bury(forged(x, worker_id=5), "forged"),
    ),
    (
        "ack-lease-worker_id-empty",
        "worker_id",
        ValueError,
        lambda t, x: t.ack(forged(x, worker_id="")),
    ),
    ("ack-lease-seq-2**63", "seq", ValueError, lambda t, x: t.ack(forged(x, seq=TOO_BIG))),
    (
        "ack-lease-attempt-2**63",
        "attempt",
        ValueError,
        lambda t, x: t.ack(forged(x, attempt=TOO_BIG)),
    ),
    ("ack-lease-attempt-0", "attempt", ValueError, lambda t, x: t.ack(forged(x, attempt=0))),
    (
        "ack_many-lease-seq-2**63",
        "seq",
        ValueError,
        lambda t, x: t.ack_many([x, forged(x, seq=TOO_BIG)]),
    ),
    (
        "ack_and_claim-lease-seq-2**63",
        "seq",
        ValueError,
        lambda t, x: t.ack_and_claim(forged(x, seq=TOO_BIG), "w2", 30),
    ),
    # Counts fit the stores' signed 64-bit integers.
    ("claim_many-limit-2**63", "limit", ValueError, lambda t, _: t.claim_many("w2", 30, TOO_BIG)),
    # A settlement is checked as its call is, whatever its action.
    (
        "settle_many-ack-delay-negative",
        "delay",
        ValueError,
        lambda t, x: t.settle_many([Settlement(x, "ack", delay=-1)]),
    ),
    (
        "settle_many-nack-reason-none",
        "reason",
        TypeError,
        lambda t, x: t.settle_many([Settlement(x, "nack", reason=cast(Any, None))]),
    ),
    # Text no store can write: a NUL (PostgreSQL's text has none), a lone surrogate (no
    # UTF-8 for it); and group ids published beyond 512 characters.
    ("publish-group_id-513", "group_id", ValueError, lambda t, _: t.publish("g" * 513, ev(9))),
    ("publish-group_id-nul", "group_id", ValueError, lambda t, _: t.publish("c\x00", ev(9))),
    (
        "publish-group_id-surrogate",
        "group_id",
        ValueError,
        lambda t, _: t.publish("c\ud800", ev(9)),
    ),
    (
        "publish_many-group_id-513-midway",
        "group_id",
        ValueError,
        lambda t, _: t.publish_many([("c", ev(9), 0), ("é" * 513, ev(9), 0)]),
    ),
    (
        "publish_many-group_id-nul-midway",
        "group_id",
        ValueError,
        lambda t, _: t.publish_many([("c", ev(9), 0), Message("d\x00", ev(9), key="k")]),
    ),
    ("publish-key-nul", "key", ValueError, lambda t, _: t.publish("c", ev(9), key="k\x00")),
    ("publish-key-surrogate", "key", ValueError, lambda t, _: t.publish("c", ev(9), key="\udc80")),
    ("claim-worker_id-nul", "worker_id", ValueError, lambda t, _: t.claim("w\x00", 30)),
    ("claim-worker_id-surrogate", "worker_id", ValueError, lambda t, _: t.claim("w\ud800", 30)),
    ("bury-reason-nul", "reason", ValueError, lambda t, x: t.bury(x, "bad\x00input")),
    ("bury-reason-surrogate", "reason", ValueError, lambda t, x: t.bury(x, "bad \udcff")),
    (
        "settle_many-bury-reason-nul",
        "reason",
        ValueError,
        lambda t, x: t.settle_many([Settlement(x, "bury", reason="\x00")]),
    ),
]


class PublishScenarios(SuiteBase):
    @checks(PUBLISH)
    def test_publish_order_seqs_increase(self) -> None:
        t = self.open()
        seqs = [t.publish(group, ev(n)) for n, group in enumerate("abacba")]
        assert all(isinstance(seq, int) for seq in seqs), f"{PUBLISH}: seqs {seqs} are not ints"
        assert seqs == sorted(set(seqs)), f"{PUBLISH}: publish returned {seqs}, not increasing"
        more = t.publish_many([("c", ev(10), 0), ("a", ev(11), 0), ("d", ev(12), 3)])
        assert more == sorted(set(more)), f"{PUBLISH}: publish_many returned {more}"
        assert more[0] > seqs[-1], (
            f"{PUBLISH}: publish_many after seqs {seqs} returned {more}, not increasing"
        )
        assert t.publish_many([]) == [], f"{PUBLISH}: publish_many([]) must return []"

    @checks(PUBLISH)
    def test_publish_order_publish_many_leases_match_seqs(self) -> None:
        t = self.open()
        seqs = t.publish_many([("a", ev(0), 0), ("a", ev(1), 0), ("b", ev(2), 0)])
        got = {}
        while (lease := t.claim("w1", self.hold)) is not None:
            got[lease.seq] = lease.event.n
            t.ack(lease)
        assert got == dict(zip(seqs, [0, 1, 2], strict=True)), (
            f"{PUBLISH}: publish_many returned seqs {seqs}, but claims delivered {got}"
        )

    @checks(NO_LOSS)
    def test_no_loss_every_published_message_is_delivered_once(self) -> None:
        t = self.open()
        published = {t.publish(f"g{n % 7}", ev(n)): n for n in range(60)}
        published |= dict(
            zip(
                t.publish_many([(f"g{n % 5}", ev(n), 0) for n in range(60, 90)]),
                range(60, 90),
                strict=True,
            )
        )
        delivered: dict[int, int] = {}
        duplicates = []
        while (lease := t.claim("w1", self.hold)) is not None:
            if lease.seq in delivered:
                duplicates.append(lease.seq)
            delivered[lease.seq] = lease.event.n
            t.ack(lease)
        lost = sorted(set(published.values()) - set(delivered.values()))
        assert not lost, f"{NO_LOSS}: {len(lost)} of 90 published messages never came: n={lost}"
        assert not duplicates, f"{NO_LOSS}: seqs delivered twice: {duplicates}"
        assert delivered == published, f"{NO_LOSS}: seqs and events do not match what was published"

    @checks(BAD_INPUT)
    @pytest.mark.parametrize(
        ("argument", "error", "call"),
        [pytest.param(arg, err, call, id=name) for name, arg, err, call in BAD_CALLS],
    )
    def test_bad_input_is_rejected_before_anything_is_written(
        self, argument: str, error: type[Exception], call: Callable[..., Any]
    ) -> None:
        t = self.open()
        t.publish("a", ev(1))
        held = t.claim("w1", self.hold)
        assert held is not None
        waiting = t.publish("b", ev(2))
        raised = must_raise(BAD_INPUT, error, f"the bad call ({argument})", lambda: call(t, held))
        assert argument.lower() in str(raised).lower(), (
            f"{BAD_INPUT}: the {error.__name__} does not name {argument!r}: {raised}"
        )
        # Nothing was written: b's message is the only deliverable one, a's lease still holds.
        nxt = t.claim("w2", self.hold)
        assert seen(nxt, "seq", "attempt") == (waiting, 1), (
            f"{BAD_INPUT}: after the rejected call, claim gave {nxt} instead of b's message"
        )
        assert nxt is not None
        t.ack(nxt)
        extra = t.claim("w2", self.hold)
        assert extra is None, f"{BAD_INPUT}: the rejected call left something behind: {extra}"
        t.ack(held)

    @checks(BAD_INPUT)
    def test_bad_input_bounds_themselves_are_taken(self) -> None:
        """The largest good values work: a limit of 2**63 - 1, a lease whose seq or attempt
        is 2**63 - 1 (no longer current: LeaseLost, not an error), a group id of 512
        characters of any text, non-ASCII worker ids and reasons."""
        t = self.open()
        longest = "\U0001f600" * MAX_GROUP_ID  # four bytes each in UTF-8
        first = t.publish(longest, ev(1), key="k" * 255)
        second = t.publish("ü" * MAX_GROUP_ID, ev(2))
        leases = t.claim_many("wörker-1", self.hold, MAX_COUNT)
        got = [(x.seq, x.group_id) for x in leases]
        assert got == [(first, longest), (second, "ü" * MAX_GROUP_ID)], (
            f"{BAD_INPUT}: claim_many(limit=2**63 - 1) after publishing to groups of 512 "
            f"characters gave {[(seq, len(group)) for seq, group in got]}"
        )
        one, other = leases
        for name, lease in (
            ("seq", forged(one, seq=MAX_COUNT)),
            ("attempt", forged(one, attempt=MAX_COUNT)),
        ):
            must_raise(
                BAD_INPUT,
                LeaseLost,
                f"ack of a lease whose {name} is 2**63 - 1",
                partial(t.ack, lease),
            )
        t.ack(one)
        t.bury(other, "refusé: \U0001f600")

    @checks(BAD_INPUT)
    def test_bad_input_bounds_of_admin_calls(self) -> None:
        """With ``admin`` (and ``group-control``, ``timers``, ``tenants`` where declared):
        seqs and limits of 2**63 are refused, 2**63 - 1 is taken; a NUL is refused where
        it would be written (a delayed message's group, a tenant), while a group looked up
        (peeked, paused, purged) may be of any length."""
        self.require(ADMIN)
        t = self.open()
        a = cast(TransportAdmin, t)
        loose_a: Any = a
        t.publish("a", ev(1))
        calls: list[tuple[str, Callable[[Any], object]]] = [
            ("requeue", lambda n: a.requeue(n)),
            ("discard", lambda n: a.discard(n)),
            ("groups", lambda n: a.groups(n)),
            ("dead_letters", lambda n: a.dead_letters(n)),
        ]
        if self.has(CONTROL):
            calls += [("cancel", lambda n: a.cancel(n)), ("peek", lambda n: a.peek("a", n))]
        for name, call in calls:
            raised = must_raise(BAD_INPUT, ValueError, f"{name}(2**63)", partial(call, TOO_BIG))
            assert str(TOO_BIG) in str(raised), (
                f"{BAD_INPUT}: {name}(2**63) raised {raised!r}, which does not name the value"
            )
            call(MAX_COUNT)  # the largest is taken (and finds nothing, or everything)
        if self.has(CONTROL):
            long = "g" * (MAX_GROUP_ID + 1)  # a group stored before the limit: reachable
            assert a.peek(long) == [], f"{BAD_INPUT}: peek of a long unknown group found some"
            a.pause_group(long)
            a.resume_group(long)
        assert a.purge_group("g" * (MAX_GROUP_ID + 1)) == 0, (
            f"{BAD_INPUT}: purge of a long unknown group removed something"
        )
        if self.has(TIMERS):
            must_raise(
                BAD_INPUT,
                ValueError,
                "publish(delay=5) to a group id with a NUL",
                lambda: t.publish("a\x00", ev(2), delay=5),
            )
        if self.has(TENANTS):
            must_raise(
                BAD_INPUT,
                ValueError,
                "publish(tenant=) with a NUL",
                lambda: t.publish("b", ev(2), tenant="t\x00"),
            )
            must_raise(
                BAD_INPUT,
                ValueError,
                "set_tenant_weight of a tenant with a NUL",
                lambda: loose_a.set_tenant_weight("t\x00", 2),
            )
        lease = t.claim("w1", self.hold)
        assert seen(lease, "event") == (ev(1),), (
            f"{BAD_INPUT}: after the refused calls, claim gave {lease} instead of a's message"
        )
        assert lease is not None
        t.ack(lease)
        assert t.claim("w1", self.hold) is None, (
            f"{BAD_INPUT}: a refused call left something behind"
        )

    @checks(BAD_INPUT)
    def test_bad_input_max_attempts_bounds(self) -> None:
        """With ``admin``: ``max_attempts`` above 2**63 - 1 is refused when opening, and
        2**63 - 1 itself opens a queue that delivers."""
        self.require(ADMIN)
        must_raise(
            BAD_INPUT,
            ValueError,
            "opening with max_attempts=2**63",
            lambda: self.open(max_attempts=TOO_BIG),
        )
        t = self.open(max_attempts=MAX_COUNT)
        t.publish("a", ev(1))
        lease = t.claim("w1", self.hold)
        assert seen(lease, "event", "attempt") == (ev(1), 1), (
            f"{BAD_INPUT}: with max_attempts=2**63 - 1, claim gave {lease}"
        )
        assert lease is not None
        t.nack(lease)
        again = t.claim("w1", self.hold)
        assert seen(again, "attempt") == (2,), (
            f"{BAD_INPUT}: with max_attempts=2**63 - 1, the nacked message came back as {again}"
        )
        assert again is not None
        t.ack(again)
