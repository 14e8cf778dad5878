"""The journal checker says what went wrong, and nothing when nothing did."""

from __future__ import annotations

from pathlib import Path

from transports_core import Event, Lease
from transports_core.conformance.journal import Entry, Journal, check, read

PUBLISHED = {1: "a", 2: "a", 3: "b"}


def entry(seq: int, worker: str, claimed: int, released: int, outcome: str = "ack") -> Entry:
    return Entry(worker, seq, PUBLISHED.get(seq, "a"), 1, claimed, released, outcome)


GOOD = [entry(1, "w1", 10, 20), entry(3, "w2", 12, 30), entry(2, "w2", 21, 25)]


def test_a_clean_run_has_no_problems() -> None:
    assert check(PUBLISHED, GOOD) == []


def test_lost_duplicate_unknown_and_wrong_group_are_named() -> None:
    problems = check(
        PUBLISHED,
        [
            entry(1, "w1", 10, 20),
            entry(1, "w2", 30, 40),
            entry(9, "w1", 50, 60),
            Entry("w1", 3, "a", 1, 70, 80, "ack"),
        ],
    )
    text = "\n".join(problems)
    assert "never acked: [2]" in text
    assert "acked more than once: seqs [1]" in text
    assert "never published: [9]" in text
    assert "wrong group for seqs [3]" in text


def test_overlapping_leases_of_one_group_are_caught() -> None:
    problems = check(PUBLISHED, [entry(1, "w1", 10, 20), entry(2, "w2", 20, 25), GOOD[1]])
    assert problems == [
        "group 'a' was leased twice at once: seq 1 to w1 and seq 2 to w2 overlap by 0.000 ms"
    ]


def test_acks_out_of_publish_order_are_caught() -> None:
    problems = check(PUBLISHED, [entry(2, "w1", 10, 20), entry(1, "w2", 21, 25), GOOD[1]])
    assert problems == ["group 'a' was acked out of publish order: [2, 1]"]


def test_entries_round_trip_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "w1.jsonl"
    lease = Lease(1, "a", Event(n=1), "w1", 1, 0.0)
    with Journal(path) as journal:
        written = journal.record(lease, 10, 20, "ack")
    with path.open("a") as f:
        f.write('{"worker": "w1", "seq": 2')  # killed mid-line
    assert read([path, tmp_path / "missing.jsonl"]) == [written]
    assert written == Entry("w1", 1, "a", 1, 10, 20, "ack")
