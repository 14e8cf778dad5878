"""Scenarios of publishing: seq order, publish_many, nothing lost, and the bad-input errors
of the core contract (raised before anything is written)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from transports_core import Event, Lease, Message, Transport

from ._base import SuiteBase, checks, must_raise, seen
from ._properties import BAD_INPUT, NO_LOSS, PUBLISH
from ._steps import ev


def loose(t: Transport[Event]) -> Any:
    """``t``, untyped: the suite calls it with wrong types on purpose, to see them refused."""
    return t


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
