"""The demo's verdict must be able to say no: feed it journals that break each promise.

Order, exclusivity and loss are the conformance journal checker's (tests/core/test_journal.py);
here, that its findings reach the verdict, and the demo's own checks: the priority floor,
and no lease lost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from transports_cli.demo._journal import Plan, verify
from transports_core.conformance.journal import Entry

PLAN = Plan(
    published={1: "g1", 2: "g2", 3: "g1", 4: "g2", 5: "g1"},
    events={"g1": 3, "g2": 2},
    priorities={"g1": 4, "g2": 0},
    floors={"urgent": 3},
)


def _entry(seq: int, start: int, end: int, outcome: str = "ack", worker: str = "w") -> Entry:
    return Entry(worker, seq, PLAN.published.get(seq, "g1"), 1, start, end, outcome)


GOOD = [
    _entry(1, 10, 20),
    _entry(2, 11, 12, worker="x"),
    _entry(3, 21, 30, outcome="retried"),
    replace(_entry(3, 40, 50), attempt=2),
    _entry(4, 13, 19, outcome="failed", worker="x"),
    replace(_entry(4, 25, 26), attempt=2),
    _entry(5, 51, 60, worker="urgent"),
]


def test_a_good_journal_passes_and_counts() -> None:
    verdict = verify(PLAN, GOOD)
    assert verdict.ok, verdict.problems
    assert (verdict.published, verdict.acked, verdict.parked, verdict.retried) == (5, 5, 1, 1)
    assert verdict.span_ns == 50
    assert verdict.events_per_second == pytest.approx(5 / 50e-9)


def test_the_conformance_checkers_findings_reach_the_verdict() -> None:
    overlapping = [*GOOD[:3], replace(GOOD[3], claimed_ns=29, worker="y"), *GOOD[4:]]
    verdict = verify(PLAN, overlapping)
    assert not verdict.ok
    assert verdict.problems == [
        "group 'g1' was leased twice at once: seq 3 to w and seq 3 to y overlap by 0.000 ms"
    ]
    assert verify(PLAN, GOOD[:-1]).problems == ["1 of 5 messages were never acked: [5]"]


def test_a_lost_lease_fails() -> None:
    verdict = verify(PLAN, [*GOOD, _entry(5, 61, 62, outcome="lost")])
    assert verdict.problems == ["group 'g1': seq 5 attempt 1 ended lost at w"]


def test_priority_floor_breach_fails() -> None:
    verdict = verify(PLAN, [*GOOD[:5], replace(GOOD[5], worker="urgent"), GOOD[6]])
    assert verdict.problems == ["group 'g2': priority 0 served by urgent, whose floor is 3"]


def test_problems_found_elsewhere_are_kept() -> None:
    verdict = verify(PLAN, GOOD, ["worker-1 exited with code 75"])
    assert verdict.problems == ["worker-1 exited with code 75"]
