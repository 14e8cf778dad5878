"""The demo's verifier must be able to say no: feed it journals that break each promise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from transports_cli.demo._journal import Plan, Record, parse_journal, verify

PLAN = Plan(events={"g1": 3, "g2": 2}, priorities={"g1": 4, "g2": 0}, floors={"urgent": 3})


def _record(
    group: str, step: int, start: int, end: int, kind: str = "ack", worker: str = "w"
) -> Record:
    return Record(kind, group, step, 1, start, end, 0, worker)  # type: ignore[arg-type]


GOOD = [
    _record("g1", 0, 10, 20),
    _record("g2", 0, 11, 12, worker="x"),
    _record("g1", 1, 21, 30, kind="park"),
    _record("g1", 1, 40, 50),
    _record("g2", 1, 13, 19, kind="retry", worker="x"),
    _record("g2", 1, 25, 26),
    _record("g1", 2, 51, 60, worker="urgent"),
]


def test_a_good_journal_passes_and_counts() -> None:
    verdict = verify(PLAN, GOOD)
    assert verdict.ok, verdict.problems
    assert (verdict.published, verdict.acked, verdict.parked, verdict.retried) == (5, 5, 1, 1)
    assert verdict.span_ns == 50
    assert verdict.events_per_second == pytest.approx(5 / 50e-9)


def test_journal_lines_round_trip() -> None:
    records, problems = parse_journal([r.line() + "\n" for r in GOOD], "w.journal")
    assert records == GOOD
    assert problems == []


def test_out_of_order_step_fails() -> None:
    swapped = [*GOOD[:3], replace(GOOD[3], step=2), *GOOD[4:6], replace(GOOD[6], step=1)]
    verdict = verify(PLAN, swapped)
    assert not verdict.ok
    assert "g1: step 2 was handled before step 1 was acked (out of order)" in verdict.problems


def test_overlapping_intervals_fail() -> None:
    overlapping = [*GOOD[:3], replace(GOOD[3], claimed_ns=29, worker="y"), *GOOD[4:]]
    verdict = verify(PLAN, overlapping)
    assert verdict.problems == ["g1: step 1 was claimed by y while w still held step 1 (overlap)"]


def test_overlap_with_an_earlier_long_interval_fails() -> None:
    # Not with its neighbour in claim order, but with the one before, which ends later.
    long_hold = [replace(GOOD[0], released_ns=45), *GOOD[1:]]
    verdict = verify(PLAN, long_hold)
    assert "g1: step 1 was claimed by w while w still held step 0 (overlap)" in verdict.problems
    assert any("step 1 was claimed" in p and "(overlap)" in p for p in verdict.problems)


def test_missing_ack_fails() -> None:
    verdict = verify(PLAN, GOOD[:-1])
    assert verdict.problems == ["g1: step 2 never acked (lost)"]


def test_a_group_never_handled_fails() -> None:
    verdict = verify(PLAN, [r for r in GOOD if r.group != "g2"])
    assert verdict.problems == ["g2: steps 0, 1 never acked (lost)"]


def test_duplicate_ack_fails() -> None:
    verdict = verify(PLAN, [*GOOD, _record("g1", 2, 70, 80)])
    assert verdict.problems == ["g1: step 2 was handled again after it was acked (duplicate)"]


def test_lost_lease_and_foreign_group_fail() -> None:
    verdict = verify(PLAN, [*GOOD, _record("g1", 2, 61, 62, kind="lost"), _record("zz", 0, 1, 2)])
    assert "g1: w lost its lease on step 2" in verdict.problems
    assert "zz: handled by w but never published" in verdict.problems


def test_priority_floor_breach_fails() -> None:
    verdict = verify(PLAN, [*GOOD[:5], replace(GOOD[5], worker="urgent"), GOOD[6]])
    assert verdict.problems == ["g2: priority 0 served by urgent, whose floor is 3"]


def test_unreadable_lines_are_problems() -> None:
    records, problems = parse_journal(
        [GOOD[0].line() + "\n", "ack\tg1\t1\t1\t5", "bogus\tg1\t1\t1\t1\t2\t0\tw\n"], "w.journal"
    )
    assert records == [GOOD[0]]
    assert problems == [
        "w.journal line 2 is unreadable: 'ack\\tg1\\t1\\t1\\t5'",
        "w.journal line 3 is unreadable: 'bogus\\tg1\\t1\\t1\\t1\\t2\\t0\\tw'",
    ]
    assert not verify(PLAN, [*GOOD], problems).ok


def test_an_unfinished_run_counts_unacked_events_once_but_still_checks_order() -> None:
    partial = GOOD[:2]
    verdict = verify(PLAN, partial, finished=False)
    assert verdict.problems == ["3 of 5 events not acked when the run stopped"]
    out_of_order = [replace(GOOD[0], step=1)]
    verdict = verify(PLAN, out_of_order, finished=False)
    assert "g1: step 1 was handled before step 0 was acked (out of order)" in verdict.problems
