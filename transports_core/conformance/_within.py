"""Scenarios of ``transport.within(conn)``: the writing calls run in a transaction of the
caller's, on a connection the backend's ``join_session`` fixture opens (see `JoinSession`).

A rolled-back transaction leaves nothing (a lease acked in it is still current, a key
used in it is not remembered); a committed one takes effect as if the calls were made on
the transport; an ack of a lease that is no longer current raises `LeaseLost` at once,
before the caller commits, and a commit after it changes nothing. Every backend runs the
refusal: ``within`` of something it cannot join raises, a `TransportError` when the
backend cannot join any transaction (it does not declare ``within``).

While a session's transaction is open the scenarios touch the store through nothing but
that session (a SQLite file is locked for writing until it ends).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from transports_core import Duplicate, Event, LeaseLost, Transport, TransportError

from ._base import WITHIN, JoinFactory, JoinSession, checks, must_raise
from ._keys import delivered, is_duplicate_of, is_new
from ._properties import (
    WITHIN_COMMIT,
    WITHIN_FENCING,
    WITHIN_KEYS,
    WITHIN_REFUSED,
    WITHIN_ROLLBACK,
)
from ._steps import Steps, ev, must_not_lose, take


def within(prop: str, t: Transport[Event], session: JoinSession) -> Any:
    """``t.within(session.conn)``; fail, naming ``prop``, if the transport has none."""
    view = getattr(t, "within", None)
    assert view is not None, (
        f"{prop}: {t!r} has no within(conn): a transport that cannot join a caller's "
        "transaction must still refuse with a TransportError (core's cannot_join)"
    )
    return view(session.conn)


class WithinScenarios(Steps):
    def session(self) -> JoinSession:
        """A new transaction of the caller's on the test's store, closed at the test's
        end (the backend's ``join_session`` fixture; skips without ``within``)."""
        self.require(WITHIN)
        opener: JoinFactory = self._request.getfixturevalue("join_session")
        opened = opener()
        self._request.addfinalizer(opened.close)
        return opened

    @checks(WITHIN_REFUSED)
    def test_within_refuses_what_it_cannot_join(self) -> None:
        t = self.open()
        view = getattr(t, "within", None)
        assert view is not None, (
            f"{WITHIN_REFUSED}: {t!r} has no within(conn): a transport that cannot join a "
            "caller's transaction must still refuse with a TransportError (core's "
            "cannot_join)"
        )
        if self.has(WITHIN) or not self.within_known:
            refusal: tuple[type[Exception], ...] = (TypeError, ValueError, TransportError)
            what = "within(object()), which is no connection to the store,"
        else:
            refusal = (TransportError,)
            what = "within(object()) on a backend without the 'within' capability"
        names = " or ".join(kind.__name__ for kind in refusal)
        try:
            view(object())
        except refusal:
            pass
        except Exception as exc:
            pytest.fail(
                f"{WITHIN_REFUSED}: {what} raised {type(exc).__name__} ({exc}), not {names}"
            )
        else:
            pytest.fail(f"{WITHIN_REFUSED}: {what} did not raise {names}")
        assert t.claim("w1", self.hold) is None, (
            f"{WITHIN_REFUSED}: after within was refused, the store is not empty"
        )

    @checks(WITHIN_ROLLBACK)
    def test_within_rollback_leaves_nothing_and_the_acked_lease_current(self) -> None:
        t = self.open()
        t.publish("a", ev(1))
        lease = take(t, "w1", self.hold)
        session = self.session()
        inside = within(WITHIN_ROLLBACK, t, session)
        inside.publish("b", ev(2))
        inside.publish_many([("c", ev(3), 0), ("b", ev(4), 0)])
        inside.ack(lease)
        session.rollback()
        other = t.claim("w2", self.hold)
        assert other is None, (
            f"{WITHIN_ROLLBACK}: after the rollback, claim gave {other}: a publish of the "
            "rolled-back transaction was stored, or its ack freed group 'a'"
        )
        must_not_lose(
            "extend of the lease acked in the rolled-back transaction",
            lambda: t.extend(lease, self.hold),
        )
        must_not_lose("ack of the lease acked in the rolled-back transaction", lambda: t.ack(lease))
        got = delivered(t)
        assert got == [], f"{WITHIN_ROLLBACK}: after the rollback, the store still gave {got}"

    @checks(WITHIN_COMMIT)
    def test_within_commit_publishes_and_settles_as_the_transport_would(self) -> None:
        t = self.open()
        a1, a2 = t.publish("a", ev(1)), t.publish("a", ev(2))
        lease = take(t, "w1", self.hold)
        assert lease.seq == a1, f"{WITHIN_COMMIT}: claim gave {lease}, expected seq {a1}"
        session = self.session()
        inside = within(WITHIN_COMMIT, t, session)
        b = inside.publish("b", ev(3))
        c, d = inside.publish_many([("c", ev(4), 0), ("c", ev(5), 0)])
        inside.ack(lease)
        session.commit()
        must_raise(
            WITHIN_COMMIT,
            LeaseLost,
            "ack on the transport of a lease acked in a committed transaction",
            lambda: t.ack(lease),
        )
        got = sorted(delivered(t))
        want = sorted([(a2, "a", 2), (b, "b", 3), (c, "c", 4), (d, "c", 5)])
        assert got == want, (
            f"{WITHIN_COMMIT}: after the commit, the store gave {got}; expected the "
            f"committed publishes and seq {a2}, {want}, with seq {a1} acked"
        )
        # A nack and a bury inside a transaction, committed, settle as well.
        t.publish("e", ev(6))
        lease = take(t, "w1", self.hold)
        session = self.session()
        within(WITHIN_COMMIT, t, session).nack(lease)
        session.commit()
        back = self.again(t, lease, "after a nack committed inside a transaction")
        session = self.session()
        within(WITHIN_COMMIT, t, session).bury(back, "bad")
        session.commit()
        must_raise(
            WITHIN_COMMIT,
            LeaseLost,
            "ack on the transport of a lease buried in a committed transaction",
            lambda: t.ack(back),
        )
        got = delivered(t)
        assert got == [], f"{WITHIN_COMMIT}: the buried message was delivered again: {got}"

    @checks(WITHIN_FENCING)
    def test_within_fencing_a_stale_ack_raises_at_once_and_a_commit_changes_nothing(
        self,
    ) -> None:
        t = self.open()
        t.publish("a", ev(1))
        stale, current = self.reclaimed(t)
        session = self.session()
        inside = within(WITHIN_FENCING, t, session)
        must_raise(
            WITHIN_FENCING,
            LeaseLost,
            "ack inside a transaction of a lease another worker has taken over",
            lambda: inside.ack(stale),
        )
        session.commit()
        must_not_lose(
            "ack of the current lease after a stale ack's transaction committed",
            lambda: t.ack(current),
        )
        got = delivered(t)
        assert got == [], f"{WITHIN_FENCING}: the acked message came back: {got}"

    @checks(WITHIN_KEYS)
    def test_within_keys_follow_the_transaction(self) -> None:
        t = self.open()
        token = uuid.uuid4().hex[:12]  # a store shared by the tests remembers keys a day
        kept, dropped = f"{token}-kept", f"{token}-dropped"
        session = self.session()
        inside = within(WITHIN_KEYS, t, session)
        first = inside.publish("a", ev(1), key=dropped)
        is_new(WITHIN_KEYS, "the first publish with a key inside a transaction", first)
        is_duplicate_of(
            WITHIN_KEYS,
            "a second publish with the key inside the same transaction",
            inside.publish("a", ev(2), key=dropped),
            first,
        )
        session.rollback()
        after = t.publish("a", ev(3), key=dropped)
        assert not isinstance(after, Duplicate), (
            f"{WITHIN_KEYS}: a publish with the key of a rolled-back transaction's publish "
            f"returned {after!r}: the key outlived the rollback"
        )
        session = self.session()
        inside = within(WITHIN_KEYS, t, session)
        is_duplicate_of(
            WITHIN_KEYS,
            "a publish inside a transaction with a key used outside it",
            inside.publish("a", ev(4), key=dropped),
            after,
        )
        new = inside.publish("a", ev(5), key=kept)
        is_new(WITHIN_KEYS, "a publish with a new key inside a transaction", new, after)
        session.commit()
        is_duplicate_of(
            WITHIN_KEYS,
            "a publish with the key of a committed transaction's publish",
            t.publish("a", ev(6), key=kept),
            new,
        )
        got = delivered(t)
        assert got == [(after, "a", 3), (new, "a", 5)], (
            f"{WITHIN_KEYS}: the store gave {got}; expected seq {after} (n=3) and seq "
            f"{new} (n=5) only"
        )
