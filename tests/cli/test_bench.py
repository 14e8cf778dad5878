"""``transports bench`` end to end, in quick mode. Its report is checked for shape and
bookkeeping only: speed is never asserted in tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transports_core import Event, TransportAdmin, open_transport

from ._command import transports, transports_on_a_terminal
from ._queues import prepare, rows, seqs

CASES = {
    "publish",
    "publish_many",
    "claim_ack",
    "claim_many",
    "ack_and_claim",
    "claim_ack_async",
    "ack_and_claim_async",
    "processes.1",
    "processes.2",
}


@pytest.mark.slow
def test_quick_bench_reports_every_case_and_leaves_the_queue_empty(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}?synchronous=normal"
    out = tmp_path / "report.json"
    result = transports("bench", url, "--quick", "--workers", "2", "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert json.loads(out.read_text()) == report
    assert {"url", "quick", "sizes", "cases", "skipped", "seconds", "machine"} <= set(report)
    assert report["url"] == url
    assert report["quick"] is True
    assert report["skipped"] == {}
    assert set(report["cases"]) == CASES
    for name, case in report["cases"].items():
        assert case["unit"] == "msg/s", name
        assert case["median"] > 0, name
    for name in ("publish", "claim_ack", "claim_many", "ack_and_claim", "ack_and_claim_async"):
        assert len(report["cases"][name]["rounds"]) == report["sizes"]["rounds"]
    for workers in (1, 2):
        run = report["cases"][f"processes.{workers}"]
        assert run["workers"] == workers
        assert run["errors"] == []
        assert run["drained"] is True
        assert run["done"] == report["sizes"]["total"]
    with open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        stats = queue.stats()
        assert (stats.ready, stats.in_flight, stats.parked, stats.dead) == (0, 0, 0, 0)
        assert queue.groups() == []


def test_bench_prints_a_table_of_medians(tmp_path: Path) -> None:
    result = transports("bench", "--quick", "--workers", "0")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Benchmark of sqlite:///")
    assert lines[1].split() == ["case", "median", "range", "of", "rounds", "measured"]
    assert [line.split()[0] for line in lines[2:9]] == [
        "publish",
        "publish_many",
        "claim_ack",
        "claim_many",
        "ack_and_claim",
        "claim_ack_async",
        "ack_and_claim_async",
    ]
    assert "claim_many(50) + ack_many" in lines[5]
    assert lines[-1] == "skipped processes: --workers 0"


def test_a_queue_with_messages_is_refused_and_left_alone(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("bench", queue.url, "--quick")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line == (
        f"Error: {queue.url} holds 7 messages; the benchmark claims and acks whatever is "
        "queued, so it needs an empty queue"
    )
    assert rows(queue.path) == before


def test_dead_letters_alone_do_not_stop_it_and_survive_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}?max_attempts=1"
    with open_transport(url) as queue:
        queue.publish("poison", Event(n=1))
        lease = queue.claim("w", 60)
        assert lease is not None
        queue.nack(lease)
        assert queue.claim("w", 60) is None
    result = transports("bench", url, "--quick", "--workers", "0", "--json")
    assert result.returncode == 0, result.stderr
    assert seqs(tmp_path / "q.db", "dead_letters") == [1]


def test_an_in_memory_store_skips_the_process_cases() -> None:
    result = transports("bench", "sqlite:///:memory:", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["skipped"] == {"processes": "another connection cannot see this store's messages"}
    assert "processes.1" not in report["cases"]


def test_a_progress_bar_on_a_terminal() -> None:
    code, shown = transports_on_a_terminal("bench", "--quick", "--workers", "0")
    assert code == 0, shown
    assert "━" in shown  # the bar (the table that follows has none)
    assert "claim_ack" in shown
