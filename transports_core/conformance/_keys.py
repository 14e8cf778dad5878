"""Scenarios of idempotency keys: a repeated key in its group stores nothing and returns
the original seq as a `Duplicate`, whatever became of the original (acked, dead, purged)
within the window; after the window the key publishes anew; another group's same key is
its own; batches deduplicate within themselves and against earlier publishes; and many
OS processes racing on the same keys store each once.

Every key a scenario uses carries a token of its own (`KeyScenarios.key`), because a
store shared by the tests (the suite at a URL) remembers keys for a day: purging and
draining forget messages, never keys.
"""

from __future__ import annotations

import json
import multiprocessing
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Final, cast

from transports_core import Duplicate, Event, Message, Transport, TransportAdmin

from ._base import ADMIN, CLOCK, MULTIPROCESS, checks, must_raise
from ._properties import (
    KEY_AFTER_SETTLE,
    KEY_BATCH,
    KEY_DUPLICATE,
    KEY_GROUP_SCOPE,
    KEY_PROCESSES,
    KEY_STATS,
    KEY_WINDOW,
)
from ._steps import Steps, ev, take
from ._workers import publish_keys, publish_keys_async

# A window short enough to pass in a test, on the suite's clock.
WINDOW: Final = 10.0
KEY_PROCESSES_COUNT: Final = 8
KEYS_EACH: Final = 100


def delivered(t: Transport[Event]) -> list[tuple[int, str, int]]:
    """Claim and ack until nothing comes: (seq, group, n) of each delivery, in order."""
    got = []
    while (lease := t.claim("w-keys", 3600)) is not None:
        got.append((lease.seq, lease.group_id, lease.event.n))
        t.ack(lease)
    return got


def is_duplicate_of(prop: str, what: str, seq: int, original: int) -> None:
    """Fail unless ``seq`` is a `Duplicate` whose value is ``original``."""
    assert isinstance(seq, Duplicate), (
        f"{prop}: {what} returned {seq!r}, not Duplicate({original}): it was stored again"
    )
    assert int(seq) == original, (
        f"{prop}: {what} returned {seq!r}; the original's seq is {original}"
    )


def is_new(prop: str, what: str, seq: int, *others: int) -> None:
    """Fail unless ``seq`` is a plain seq of a newly stored message, unlike ``others``."""
    assert not isinstance(seq, Duplicate), (
        f"{prop}: {what} returned {seq!r}: a new message was expected"
    )
    assert seq not in others, f"{prop}: {what} returned seq {seq}, already used by {others}"


class KeyScenarios(Steps):
    def key(self, name: str) -> str:
        """``name`` made unique to this run of this test."""
        token = getattr(self, "_key_token", None)
        if token is None:
            token = self._key_token = uuid.uuid4().hex[:12]
        return f"{token}-{name}"

    @checks(KEY_DUPLICATE)
    def test_key_duplicate_returns_the_original_seq_and_stores_nothing(self) -> None:
        t = self.open()
        first = t.publish("a", ev(1), key=self.key("k1"))
        is_new(KEY_DUPLICATE, "the first publish with key k1", first)
        again = t.publish("a", ev(2), key=self.key("k1"))
        is_duplicate_of(KEY_DUPLICATE, "a second publish with key k1", again, first)
        other = self.open()  # another handle sees the same keys
        is_duplicate_of(
            KEY_DUPLICATE,
            "a publish with key k1 on another handle",
            other.publish("a", ev(3), 4, key=self.key("k1")),
            first,
        )
        plain = t.publish("a", ev(4))
        is_new(KEY_DUPLICATE, "an unkeyed publish after them", plain, first)
        # The held original is a duplicate too: in flight is one of the states it may be in.
        held = take(t, "w1", self.hold)
        assert held.seq == first, f"{KEY_DUPLICATE}: claim gave {held}, expected seq {first}"
        is_duplicate_of(
            KEY_DUPLICATE,
            "a publish with key k1 while its message is leased",
            t.publish("a", ev(5), key=self.key("k1")),
            first,
        )
        t.ack(held)
        got = delivered(t)
        assert got == [(plain, "a", 4)], (
            f"{KEY_DUPLICATE}: after the original, only the unkeyed message may come; got {got}"
        )

    @checks(KEY_AFTER_SETTLE)
    def test_key_duplicate_after_settle_once_acked(self) -> None:
        t = self.open()
        first = t.publish("a", ev(1), key=self.key("k"))
        lease = take(t, "w1", self.hold)
        t.ack(lease)
        is_duplicate_of(
            KEY_AFTER_SETTLE,
            "a publish with the key of an acked message",
            t.publish("a", ev(2), key=self.key("k")),
            first,
        )
        got = delivered(t)
        assert got == [], f"{KEY_AFTER_SETTLE}: the duplicate of an acked message came: {got}"

    @checks(KEY_AFTER_SETTLE)
    def test_key_duplicate_after_settle_once_dead_discarded_or_purged(self) -> None:
        self.require(ADMIN)
        t = self.open()
        admin = cast(TransportAdmin, t)
        dead = t.publish("a", ev(1), key=self.key("dead"))
        self.buried(t)
        is_duplicate_of(
            KEY_AFTER_SETTLE,
            "a publish with the key of a dead letter",
            t.publish("a", ev(2), key=self.key("dead")),
            dead,
        )
        admin.discard(dead)
        is_duplicate_of(
            KEY_AFTER_SETTLE,
            "a publish with the key of a discarded dead letter",
            t.publish("a", ev(3), key=self.key("dead")),
            dead,
        )
        purged = t.publish("b", ev(4), key=self.key("purged"))
        admin.purge_group("b")
        is_duplicate_of(
            KEY_AFTER_SETTLE,
            "a publish with the key of a purged message",
            t.publish("b", ev(5), key=self.key("purged")),
            purged,
        )
        got = delivered(t)
        assert got == [], f"{KEY_AFTER_SETTLE}: duplicates of settled messages came: {got}"

    @checks(KEY_WINDOW)
    def test_key_forgotten_after_the_window_and_then_points_at_the_new_message(self) -> None:
        self.require(CLOCK)
        t = self.open(dedup_window=WINDOW)
        began = self.now()
        first = t.publish("a", ev(1), key=self.key("k"))
        self.pass_deadline(began + WINDOW / 2)
        is_duplicate_of(
            KEY_WINDOW,
            f"a publish {WINDOW / 2:g} s into a {WINDOW:g} s window",
            t.publish("a", ev(2), key=self.key("k")),
            first,
        )
        # Past the window of the first use, and of the duplicate's too.
        self.pass_deadline(began + WINDOW * 1.5 + 1)
        second = t.publish("a", ev(3), key=self.key("k"))
        is_new(KEY_WINDOW, "a publish with the key once its window passed", second, first)
        # The key now points at the new message, for a window from its publish.
        self.pass_deadline(self.now() + WINDOW / 2)
        is_duplicate_of(
            KEY_WINDOW,
            "a publish with the key again, within the window of its new message",
            t.publish("a", ev(4), key=self.key("k")),
            second,
        )
        got = [n for _, _, n in delivered(t)]
        assert got == [1, 3], f"{KEY_WINDOW}: delivered n={got}, expected the first and third"

    @checks(KEY_WINDOW)
    def test_key_forgotten_after_the_window_which_must_be_positive(self) -> None:
        for bad in (0, -1.0):

            def opening(bad: float = bad) -> object:
                return self.open(dedup_window=bad)

            must_raise(KEY_WINDOW, ValueError, f"opening with dedup_window={bad!r}", opening)

    @checks(KEY_GROUP_SCOPE)
    def test_key_scoped_to_its_group_another_groups_same_key_is_a_new_message(self) -> None:
        t = self.open()
        a = t.publish("a", ev(1), key=self.key("k"))
        b = t.publish("b", ev(2), key=self.key("k"))
        is_new(KEY_GROUP_SCOPE, "group b's publish with group a's key", b, a)
        is_duplicate_of(
            KEY_GROUP_SCOPE, "group b's key again", t.publish("b", ev(3), key=self.key("k")), b
        )
        is_duplicate_of(
            KEY_GROUP_SCOPE, "group a's key again", t.publish("a", ev(4), key=self.key("k")), a
        )
        got = sorted((group, n) for _, group, n in delivered(t))
        assert got == [("a", 1), ("b", 2)], f"{KEY_GROUP_SCOPE}: delivered {got}"

    @checks(KEY_BATCH)
    def test_key_in_publish_many_repeated_within_the_batch_is_a_duplicate_of_the_first(
        self,
    ) -> None:
        t = self.open()
        k, other = self.key("k"), self.key("other")
        seqs = t.publish_many(
            [
                Message("a", ev(1), key=k),
                ("a", ev(2), 0),
                Message("b", ev(3), key=k),  # another group: its own key
                Message("a", ev(4), key=k),  # a repeat of the first item
                Message("a", ev(5), key=other),
            ]
        )
        assert len(seqs) == 5, f"{KEY_BATCH}: publish_many of 5 items returned {seqs}"
        is_new(KEY_BATCH, "the batch's first item with key k", seqs[0])
        for i in (1, 2, 4):
            is_new(KEY_BATCH, f"item {i} of the batch", seqs[i], seqs[0])
        is_duplicate_of(KEY_BATCH, "item 3, repeating item 0's group and key", seqs[3], seqs[0])
        got = sorted(n for _, _, n in delivered(t))
        assert got == [1, 2, 3, 5], f"{KEY_BATCH}: the batch stored n={got}"

    @checks(KEY_BATCH)
    def test_key_in_publish_many_repeating_an_earlier_publish_is_a_duplicate(self) -> None:
        t = self.open()
        first = t.publish("a", ev(1), key=self.key("k"))
        seqs = t.publish_many(
            [Message("a", ev(2)), Message("a", ev(3), key=self.key("k")), ("b", ev(4), 0)]
        )
        is_new(KEY_BATCH, "an unkeyed Message item", seqs[0], first)
        is_duplicate_of(KEY_BATCH, "a batch item repeating an earlier key", seqs[1], first)
        is_new(KEY_BATCH, "the triple after it", seqs[2], first, seqs[0])
        got = sorted(n for _, _, n in delivered(t))
        assert got == [1, 2, 4], f"{KEY_BATCH}: stored n={got}"

    @checks(KEY_BATCH)
    def test_key_in_publish_many_with_a_bad_item_writes_nothing_and_remembers_no_key(self) -> None:
        t = self.open()
        items: list[Any] = [
            Message("a", ev(1), key=self.key("k")),
            Message("a", ev(2), key=""),
        ]
        raised = must_raise(
            KEY_BATCH, ValueError, "a batch with an empty key", lambda: t.publish_many(items)
        )
        assert "key" in str(raised), f"{KEY_BATCH}: the ValueError does not name key: {raised}"
        assert delivered(t) == [], f"{KEY_BATCH}: the rejected batch stored messages"
        seq = t.publish("a", ev(3), key=self.key("k"))
        is_new(KEY_BATCH, "a publish with the key of a rejected batch's item", seq)

    @checks(KEY_STATS)
    def test_key_count_in_stats_counts_the_keys_remembered(self) -> None:
        self.require(ADMIN)
        t = self.open()
        admin = cast(TransportAdmin, t)
        before = admin.stats().keys
        t.publish("a", ev(1), key=self.key("1"))
        t.publish("a", ev(2), key=self.key("1"))
        t.publish("b", ev(3), key=self.key("1"))
        t.publish_many([Message("a", ev(4), key=self.key("2")), ("a", ev(5), 0)])
        t.publish("a", ev(6))
        delivered(t)  # acked messages' keys are remembered still
        after = admin.stats().keys
        assert after - before == 3, (
            f"{KEY_STATS}: stats().keys went from {before} to {after} after three new keys"
        )

    @checks(KEY_PROCESSES)
    def test_key_processes_store_once_racing_on_the_same_keys(self, tmp_path: Path) -> None:
        self.require(MULTIPROCESS)
        url: str = self._request.getfixturevalue("transport_url")
        t = self.open()
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Barrier(KEY_PROCESSES_COUNT)
        target = publish_keys_async if self._async_twin else publish_keys
        prefix = self.key("p")
        outs = [tmp_path / f"keys-{i}.json" for i in range(KEY_PROCESSES_COUNT)]
        children = [
            ctx.Process(target=target, args=(url, prefix, KEYS_EACH, str(out), start))
            for out in outs
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(120)
        codes = [child.exitcode for child in children]
        assert codes == [0] * KEY_PROCESSES_COUNT, f"{KEY_PROCESSES}: publisher exit codes {codes}"
        # Each child's (n, seq, was it a duplicate) for n in 0..KEYS_EACH-1.
        results = [json.loads(out.read_text()) for out in outs]
        problems = []
        for n in range(KEYS_EACH):
            answers = [tuple(result[n]) for result in results]
            seqs = {seq for seq, _ in answers}
            stored = sum(1 for _, duplicate in answers if not duplicate)
            if len(seqs) != 1 or stored != 1:
                problems.append(f"key {n}: {answers}")
        got = delivered(t)
        counts = Counter(n for _, _, n in got)
        assert len(got) == KEYS_EACH, (
            f"{KEY_PROCESSES}: {KEY_PROCESSES_COUNT} processes publishing the same "
            f"{KEYS_EACH} keys stored {len(got)} messages; stored more than once: "
            f"{sorted(n for n, c in counts.items() if c > 1)[:20]}"
        )
        assert sorted(counts) == list(range(KEYS_EACH)), (
            f"{KEY_PROCESSES}: keys whose message was never stored: "
            f"{sorted(set(range(KEYS_EACH)) - set(counts))[:20]}"
        )
        assert not problems, (
            f"{KEY_PROCESSES}: each key must be stored by one process and reported as "
            f"Duplicate of that seq to the others; (seq, duplicate) per process: "
            + "; ".join(problems[:5])
        )
