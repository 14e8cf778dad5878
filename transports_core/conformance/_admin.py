"""Scenarios of `TransportAdmin` and the dead-letter options, behind the ``admin``
capability: stats and group listings, dead letters under both ``on_dead`` policies, held
groups, requeue to the head in original order, requeue refused while a worker holds the
group, discard, and purge of a group.

Also the bounded fairness of claims in flight at once, which every backend with several
handles owes: where claims serialize, round-robin gives it; where they run in parallel
(``parallel-claims``), the backend must bound how far they overtake.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, cast

from transports_core import (
    GroupInfo,
    HeldGroup,
    LeaseLost,
    PriorityStats,
    QueueStats,
    RequeueRefused,
    Transport,
    TransportAdmin,
)

from ._base import ADMIN, MULTI_HANDLE, checks, must_raise, seen
from ._properties import (
    ADMIN_BACKLOG,
    ADMIN_DEAD,
    ADMIN_DISCARD,
    ADMIN_PURGE,
    ADMIN_REFUSED,
    ADMIN_REQUEUE,
    ADMIN_STATS,
    PARALLEL_FAIRNESS,
)
from ._steps import Steps, ev, publish, take

IN_FLIGHT = 4  # claims at once in the parallel fairness scenario
ROUNDS = 6


def admin(t: Transport[Any]) -> TransportAdmin:
    """The admin face of a handle of a backend that declares ``admin``."""
    return cast(TransportAdmin, t)


def drain(t: Transport[Any], worker: str = "w9") -> list[int]:
    """Claim and ack until nothing comes; the events' n, in order."""
    got = []
    while (lease := t.claim(worker, 3600)) is not None:
        got.append(lease.event.n)
        t.ack(lease)
    return got


def ageless(stats: QueueStats, **blank: Any) -> QueueStats:
    """``stats`` without the age of its oldest ready messages (which grows as time
    passes), and with whatever else ``blank`` names set so, totals and per priority."""
    blank["oldest_ready_age"] = None
    rows = tuple(replace(p, **blank) for p in stats.by_priority)
    return replace(stats, by_priority=rows, **blank)


def _counts_only(stats: QueueStats) -> QueueStats:
    """``stats`` with its keys, age and group counts blanked."""
    return replace(ageless(stats, ready_groups=0, busy_groups=0), keys=0)


def _backlog(stats: QueueStats) -> dict[int | str, tuple[int, int]]:
    """Ready and busy groups, per priority and under ``"all"``."""
    found: dict[int | str, tuple[int, int]] = {
        p.priority: (p.ready_groups, p.busy_groups) for p in stats.by_priority
    }
    found["all"] = (stats.ready_groups, stats.busy_groups)
    return found


class AdminScenarios(Steps):
    def open_admin(self, **options: Any) -> tuple[Transport[Any], TransportAdmin]:
        self.require(ADMIN)
        t = self.open(**options)
        return t, admin(t)

    @checks(ADMIN_STATS)
    def test_admin_stats_and_groups_count_each_state(self) -> None:
        t, a = self.open_admin()
        publish(t, "a", 0, 1, 2)
        publish(t, "c", 20, 21)
        t.publish("b", ev(10), 2)
        leased = take(t, "w1", self.hold)
        parked = take(t, "w1", self.hold)
        assert (leased.group_id, parked.group_id) == ("a", "c"), (
            f"{ADMIN_STATS}: the first claims gave {leased} and {parked}"
        )
        t.nack(parked, self.hold)
        # Keys are counted by key-count-in-stats: a store shared by the tests has some; the
        # backlog's age and groups by admin-backlog-age-and-groups.
        stats = _counts_only(a.stats())
        want = QueueStats(4, 1, 1, 0, (PriorityStats(0, 3, 1, 1, 0), PriorityStats(2, 1, 0, 0, 0)))
        assert stats == want, f"{ADMIN_STATS}: stats() gave {stats}, expected {want}"
        groups = a.groups()
        shape = [(g.group_id, g.depth, g.state, g.priority) for g in groups]
        assert shape == [("a", 3, "in_flight", 0), ("c", 2, "parked", 0), ("b", 1, "ready", 2)], (
            f"{ADMIN_STATS}: groups() gave {shape}, expected a, c, b deepest first"
        )
        by_name: dict[str, GroupInfo] = {g.group_id: g for g in groups}
        assert (by_name["b"].busy_until, by_name["b"].last_claimed_at) == (None, None), (
            f"{ADMIN_STATS}: never-claimed ready group b: {by_name['b']}"
        )
        busy = by_name["a"].busy_until
        assert abs((busy or 0.0) - leased.expires_at) < 1e-3, (
            f"{ADMIN_STATS}: a's busy_until {by_name['a'].busy_until} is not its lease's "
            f"expires_at {leased.expires_at}"
        )
        assert by_name["a"].head_seq == leased.seq, f"{ADMIN_STATS}: {by_name['a']}"
        assert [g.group_id for g in a.groups(limit=2)] == ["a", "c"], (
            f"{ADMIN_STATS}: groups(limit=2)"
        )

    # -- the backlog: the oldest ready message's age, ready and busy groups ----------

    @property
    def _gap(self) -> float:
        """Time let pass between publishes whose ages the backlog scenarios tell apart."""
        return 4 * self.real_margin if self._clock is None else 10.0

    def _stats_aged(
        self, a: TransportAdmin, since: dict[int | str, tuple[float, float]], when: str
    ) -> QueueStats:
        """``a.stats()``, checked to age each priority (and ``"all"``) in ``since`` from
        when its oldest ready message became ready, a moment between the two times given
        (suite's clock): its age must lie between the least and the most the call could
        have seen, within the margin. An absent priority must report no age."""
        margin = self.real_margin if self._clock is None else 0.01
        start = self.now()
        stats = a.stats()
        end = self.now()
        ages: dict[int | str, float | None] = {
            p.priority: p.oldest_ready_age for p in stats.by_priority
        }
        ages["all"] = stats.oldest_ready_age
        for key, age in ages.items():
            if key not in since:
                assert age is None, (
                    f"{ADMIN_BACKLOG}: {when}: priority {key} has no ready message, yet "
                    f"stats() gives it oldest_ready_age {age}"
                )
                continue
            lo, hi = since[key]
            least, most = start - hi - margin, end - lo + margin
            assert age is not None, f"{ADMIN_BACKLOG}: {when}: priority {key} has no age"
            assert least <= age <= most, (
                f"{ADMIN_BACKLOG}: {when}: oldest_ready_age of priority {key} is {age}; "
                f"its oldest ready message became ready {start - hi:.3f}-{end - lo:.3f} s "
                f"before the call"
            )
        missing = set(since) - set(ages)
        assert not missing, f"{ADMIN_BACKLOG}: {when}: stats() has no row for {missing}"
        return stats

    def _published(self, t: Transport[Any], *items: tuple[str, int, int]) -> tuple[float, float]:
        """Publish ``(group, n, priority)`` items; the suite's time before and after."""
        before = self.now()
        for group, n, priority in items:
            t.publish(group, ev(n), priority)
        return before, self.now()

    @checks(ADMIN_BACKLOG)
    def test_admin_backlog_ages_ready_messages_only(self) -> None:
        t, a = self.open_admin()
        empty = self._stats_aged(a, {}, "on an empty queue")
        assert _backlog(empty) == {"all": (0, 0)}, (
            f"{ADMIN_BACKLOG}: an empty queue has groups {_backlog(empty)}"
        )
        first = self._published(t, ("a", 1, 0))
        self.wait(self._gap)
        later = self._published(t, ("a", 2, 0), ("b", 3, 0), ("c", 4, 2))
        stats = self._stats_aged(
            a, {0: first, 2: later, "all": first}, "a waited, then a, b and c got more"
        )
        groups = _backlog(stats)
        assert groups == {0: (2, 0), 2: (1, 0), "all": (3, 0)}, (
            f"{ADMIN_BACKLOG}: (ready, busy) groups by priority {groups}: a and b at 0, c at 2, "
            "all ready"
        )
        leased = take(t, "w1", self.hold)
        assert leased.group_id == "a", (
            f"{ADMIN_BACKLOG}: the first claim gave {leased}, not a's head"
        )
        stats = self._stats_aged(
            a,
            {0: later, 2: later, "all": later},
            "a's head in flight (its next message, published later, is ready behind it)",
        )
        groups = _backlog(stats)
        assert groups == {0: (1, 1), 2: (1, 0), "all": (2, 1)}, (
            f"{ADMIN_BACKLOG}: with a's head in flight, (ready, busy) groups {groups}: a busy"
        )
        t.nack(leased)
        self._stats_aged(
            a,
            {0: first, 2: later, "all": first},
            "a's head nacked: ready again, aged from its publish, not from the nack",
        )
        parked = take(t, "w1", self.hold)
        assert parked.group_id == "b", f"{ADMIN_BACKLOG}: the next claim gave {parked}, not b"
        t.nack(parked, self.hold)
        a.pause_group("c")
        try:
            stats = a.stats()
        finally:
            a.resume_group("c")
        groups = _backlog(stats)
        assert groups == {0: (1, 1), 2: (0, 1), "all": (1, 2)}, (
            f"{ADMIN_BACKLOG}: b parked and c paused, (ready, busy) groups {groups}: only a "
            "ready"
        )

    @checks(ADMIN_BACKLOG)
    def test_admin_backlog_ages_delays_and_requeues_from_when_they_are_ready(self) -> None:
        t, a = self.open_admin(on_dead="hold")
        before = self.now()
        t.publish("d", ev(1), delay=self._gap)
        t.publish("e", ev(2), delay=self._gap, hold=True)
        after = self.now()
        stats = self._stats_aged(a, {}, "two messages delayed, none due")
        assert _backlog(stats)["all"] == (0, 1), (
            f"{ADMIN_BACKLOG}: a delayed message holding group e makes it busy, and d has "
            f"no queued message yet: (ready, busy) groups {_backlog(stats)}"
        )
        self.pass_deadline(after + self._gap)
        self.wait(self._gap)
        due = (before + self._gap, after + self._gap)
        t.publish("z", ev(3))  # promotes the due timers, on backends that do so lazily
        stats = self._stats_aged(
            a, {0: due, "all": due}, "two delayed messages due a while ago: aged from due"
        )
        assert _backlog(stats)["all"] == (3, 0), (
            f"{ADMIN_BACKLOG}: d, e and z ready: (ready, busy) groups {_backlog(stats)}"
        )
        for _ in range(3):
            t.ack(take(t, "w1", self.hold))
        t.publish("h", ev(4))
        t.publish("h", ev(5))
        t.publish("k", ev(6))
        dead = take(t, "w1", self.hold)
        kept = take(t, "w1", self.hold)
        assert (dead.group_id, kept.group_id) == ("h", "k"), (
            f"{ADMIN_BACKLOG}: claims gave {dead} and {kept}, expected h's head then k's"
        )
        t.bury(dead, "poison")
        t.bury(kept, "poison")
        stats = a.stats()
        assert _backlog(stats)["all"] == (0, 1), (
            f"{ADMIN_BACKLOG}: h held by a dead letter with a message behind it is busy, k "
            f"held with nothing behind is neither: (ready, busy) groups {_backlog(stats)}"
        )
        a.discard(dead.seq)
        t.ack(take(t, "w1", self.hold))
        self.wait(self._gap)
        before = self.now()
        a.requeue(kept.seq)
        requeued = (before, self.now())
        stats = self._stats_aged(
            a, {0: requeued, "all": requeued}, "a dead letter requeued: aged from the requeue"
        )
        assert _backlog(stats)["all"] == (1, 0), (
            f"{ADMIN_BACKLOG}: k requeued is ready: (ready, busy) groups {_backlog(stats)}"
        )

    @checks(ADMIN_DEAD)
    def test_admin_dead_letters_under_release(self) -> None:
        t, a = self.open_admin(max_attempts=1, on_dead="release")
        first = publish(t, "a", 1, 2)[0]
        self.lapsed(t)
        nxt = t.claim("w2", self.hold)
        assert seen(nxt, "event") == (ev(2),), (
            f"{ADMIN_DEAD}: max_attempts=1, on_dead='release': after the lapse the group's "
            f"next message must come; claim gave {nxt}"
        )
        dead = a.dead_letters()
        assert [(d.seq, d.group_id, d.attempts, d.held) for d in dead] == [
            (first, "a", 1, False)
        ], f"{ADMIN_DEAD}: dead_letters() gave {dead}"
        assert a.held_groups() == [], f"{ADMIN_DEAD}: release holds nothing"
        assert a.stats().dead == 1, f"{ADMIN_DEAD}: stats() counts {a.stats().dead} dead"

    @checks(ADMIN_DEAD)
    def test_admin_dead_letters_under_hold_block_the_group(self) -> None:
        t, a = self.open_admin(max_attempts=1, on_dead="hold")
        first = publish(t, "a", 1, 2, 3)[0]
        self.lapsed(t)
        blocked = t.claim("w2", self.hold)
        assert blocked is None, (
            f"{ADMIN_DEAD}: max_attempts=1, on_dead='hold': the group waits behind its dead "
            f"letter; claim gave {blocked}"
        )
        held = a.held_groups()
        assert [(h.group_id, h.seq, h.waiting) for h in held] == [("a", first, 2)], (
            f"{ADMIN_DEAD}: held_groups() gave {held}"
        )
        assert isinstance(held[0], HeldGroup)
        dead = a.dead_letters()
        assert [(d.seq, d.held) for d in dead] == [(first, True)], (
            f"{ADMIN_DEAD}: dead_letters() gave {dead}"
        )
        states = [(g.group_id, g.state) for g in a.groups()]
        assert states == [("a", "held")], f"{ADMIN_DEAD}: groups() gave {states}"

    @checks(ADMIN_REQUEUE)
    def test_admin_requeue_puts_dead_letters_back_at_the_head_in_order(self) -> None:
        t, a = self.open_admin(on_dead="release")
        seqs = publish(t, "a", 0, 1, 2, 3)
        first, second = self.buried(t), self.buried(t)
        assert (first.seq, second.seq) == tuple(seqs[:2])
        # Requeued newest first: they must still come back in their original order.
        assert a.requeue(second.seq) is True, f"{ADMIN_REQUEUE}: requeue of a dead letter"
        assert a.requeue(first.seq) is True, f"{ADMIN_REQUEUE}: requeue of a dead letter"
        assert a.requeue(first.seq) is False, f"{ADMIN_REQUEUE}: requeue of a requeued one"
        assert a.dead_letters() == [], f"{ADMIN_REQUEUE}: dead letters left after requeue"
        again = take(t, "w2", self.hold)
        assert (again.seq, again.attempt) == (first.seq, 2), (
            f"{ADMIN_REQUEUE}: after requeue, claim gave {again}; expected seq {first.seq} "
            "at the head of its group, attempt 2 (attempts keep counting)"
        )
        t.ack(again)
        rest = drain(t)
        assert rest == [1, 2, 3], (
            f"{ADMIN_REQUEUE}: after the head, the group came as n={rest}, expected [1, 2, 3]"
        )

    @checks(ADMIN_REFUSED)
    def test_admin_requeue_refused_while_a_worker_holds_the_group(self) -> None:
        t, a = self.open_admin(on_dead="release")
        publish(t, "a", 1, 2)
        dead = self.buried(t)
        holding = take(t, "w7", self.brief)
        for when in ("leased", "lapsed but not re-claimed"):
            refused = must_raise(
                ADMIN_REFUSED,
                RequeueRefused,
                f"requeue while w7's lease is {when}",
                lambda: a.requeue(dead.seq),
            )
            assert (refused.seq, refused.group_id, refused.holder) == (dead.seq, "a", "w7"), (
                f"{ADMIN_REFUSED}: RequeueRefused carried seq {refused.seq}, group "
                f"{refused.group_id!r}, holder {refused.holder!r}"
            )
            assert [d.seq for d in a.dead_letters()] == [dead.seq], (
                f"{ADMIN_REFUSED}: a refused requeue changed the dead letters"
            )
            self.pass_deadline(holding.expires_at)
        t.ack(holding)
        assert a.requeue(dead.seq) is True, f"{ADMIN_REFUSED}: requeue once the group settled"
        assert drain(t) == [1], f"{ADMIN_REFUSED}: the requeued message"

    @checks(ADMIN_DISCARD)
    def test_admin_discard_deletes_for_good_and_frees_a_held_group(self) -> None:
        t, a = self.open_admin(on_dead="hold")
        publish(t, "a", 1, 2)
        dead = self.buried(t)
        assert t.claim("w1", self.hold) is None, f"{ADMIN_DISCARD}: held group delivered"
        assert a.discard(dead.seq) is True, f"{ADMIN_DISCARD}: discard of a dead letter"
        assert a.discard(dead.seq) is False, f"{ADMIN_DISCARD}: a second discard"
        assert (a.dead_letters(), a.held_groups()) == ([], []), (
            f"{ADMIN_DISCARD}: left after discard: {a.dead_letters()} {a.held_groups()}"
        )
        assert drain(t) == [2], f"{ADMIN_DISCARD}: after the discard the group must go on"
        assert a.requeue(dead.seq) is False, f"{ADMIN_DISCARD}: requeue of a discarded letter"

    @checks(ADMIN_PURGE)
    def test_admin_purge_group_removes_messages_and_dead_letters(self) -> None:
        t, a = self.open_admin(on_dead="release")
        t.publish("a", ev(0))
        self.buried(t)
        publish(t, "a", 1, 2, 3)
        t.publish("b", ev(10))
        held = take(t, "w1", self.hold)
        assert held.group_id == "a", f"{ADMIN_PURGE}: claim gave {held}"
        removed = a.purge_group("a")
        assert removed == 4, f"{ADMIN_PURGE}: purge_group('a') removed {removed}, expected 4"
        must_raise(ADMIN_PURGE, LeaseLost, "ack of a purged lease", lambda: t.ack(held))
        assert a.dead_letters() == [], f"{ADMIN_PURGE}: dead letters left: {a.dead_letters()}"
        assert drain(t) == [10], f"{ADMIN_PURGE}: only b's message may be left"
        assert a.purge_group("a") == 0, f"{ADMIN_PURGE}: a second purge"

    @checks(PARALLEL_FAIRNESS)
    def test_parallel_fairness_bound_claims_in_flight_serve_the_oldest_groups(self) -> None:
        # Every backend owes this bound: where claims serialize, round-robin gives it.
        self.require(MULTI_HANDLE)
        t = self.open()
        groups = [f"g{i:02d}" for i in range(IN_FLIGHT * 3)]
        for rnd in range(ROUNDS):
            for group in groups:
                t.publish(group, ev(rnd))
        handles = [self.open() for _ in range(IN_FLIGHT)]
        for handle in handles:
            handle.publish_many([])
        # The order the groups are due in: never claimed first, then least recently.
        due = list(groups)
        start = threading.Barrier(IN_FLIGHT, timeout=30)
        for rnd in range(ROUNDS * len(groups) // IN_FLIGHT):
            leases: list[Any] = [None] * IN_FLIGHT

            def claimer(i: int, leases: list[Any] = leases) -> None:
                start.wait()
                leases[i] = handles[i].claim(f"w{i}", self.hold)

            threads = [threading.Thread(target=claimer, args=(i,)) for i in range(IN_FLIGHT)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            got = [None if lease is None else lease.group_id for lease in leases]
            oldest = due[:IN_FLIGHT]
            assert sorted(g for g in got if g) == sorted(oldest), (
                f"{PARALLEL_FAIRNESS}: round {rnd}: {IN_FLIGHT} claims at once served {got}; "
                f"each must serve one of the {IN_FLIGHT} oldest ready groups {oldest}"
            )
            for lease in leases:
                t.ack(lease)
            # Claimed groups go to the back, in the order their claims were made.
            order = sorted(leases, key=lambda lease: lease.expires_at)
            due = [g for g in due if g not in oldest] + [lease.group_id for lease in order]
