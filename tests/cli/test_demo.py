"""``transports demo`` end to end: real worker processes on a real SQLite file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from transports_cli.demo._worker import decide
from transports_core import Event, open_transport
from transports_core.conformance.journal import read

from ._command import transports, transports_on_a_terminal

VERDICT = re.compile(
    r"^OK: (\d+) events of (\d+) executions handled in order, one at a time, "
    r"none lost or duplicated \((\d+) workers, [\d,]+ events/s\)$"
)


FIGURES = re.compile(
    r"^192 acks in [\d.]+ s from first claim to last release \([\d,]+ events/s\); "
    r"(\d+) parks, (\d+) retries; [\d.]+ s in all$"
)


def test_quick_demo_passes_and_says_so(tmp_path: Path) -> None:
    result = transports("demo", "--quick", "--seed", "7", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Published 192 events of 24 executions (priorities 0-4, seed 7)")
    verdict = next(line for line in lines if line.startswith(("OK", "FAILED")))
    assert VERDICT.match(verdict), verdict
    assert VERDICT.match(verdict).groups() == ("192", "24", "2")  # type: ignore[union-attr]
    # --dir keeps the database and one journal per worker (the conformance journal's
    # format), with every ack in it, and each park and retry the seed drew.
    journals = sorted(tmp_path.glob("*.journal"))
    assert len(journals) == 2
    entries = read(journals)
    assert {e.worker for e in entries} == {"worker-0", "worker-1"}
    assert sum(e.outcome == "ack" for e in entries) == 192
    drawn = [decide(7, f"{g:04d}", step, 1) for g in range(24) for step in range(8)]
    figures = next(m for line in lines if (m := FIGURES.match(line)))
    parks, retries = map(int, figures.groups())
    assert (
        parks
        == sum(d.action == "park" for d in drawn)
        == sum(e.outcome == "retried" for e in entries)
    )
    assert (
        retries
        == sum(d.action == "retry" for d in drawn)
        == sum(e.outcome == "failed" for e in entries)
    )
    assert parks > 0
    assert retries > 0
    assert (tmp_path / "demo.db").is_file()


@pytest.mark.slow
def test_quiet_prints_the_verdict_line_only(tmp_path: Path) -> None:
    result = transports("demo", "--quick", "--quiet", "--executions", "10", "--workers", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    match = VERDICT.match(line)
    assert match is not None, line
    assert match.groups() == ("80", "10", "3")


@pytest.mark.slow
def test_json_verdict_parses_and_adds_up(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'given.db'}"
    result = transports("demo", url, "--quick", "--json", "--seed", "11", "--events", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["ok"] is True
    assert verdict["problems"] == []
    assert verdict["url"] == url
    assert (verdict["executions"], verdict["events"], verdict["acked"]) == (24, 120, 120)
    assert verdict["seed"] == 11
    assert verdict["events_per_second"] > 0
    assert 0 < verdict["seconds"] <= verdict["wall_seconds"]
    # The same seed draws the same parks and retries, whoever works which message.
    again = json.loads(
        transports("demo", url, "--quick", "--json", "--seed", "11", "--events", "5").stdout
    )
    assert (again["parked"], again["retried"]) == (verdict["parked"], verdict["retried"])
    assert verdict["parked"] + verdict["retried"] > 0
    # Everything was acked: the queue is empty again.
    with open_transport(url) as transport:
        assert transport.claim("checker", visibility=1) is None


def test_demo_refuses_a_queue_that_holds_messages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    with open_transport(url) as transport:
        transport.publish("someone-elses-order", Event(kind="created"))
    result = transports("demo", url, "--quick")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line == (
        f"Error: {url} holds 1 message; the demo claims and acks whatever is queued, "
        "so it needs an empty queue"
    )
    with open_transport(url) as transport:
        lease = transport.claim("checker", visibility=1)
        assert lease is not None
        # Looked at through the admin interface: not even a probe delivery was spent.
        assert (lease.group_id, lease.attempt) == ("someone-elses-order", 1)
        assert transport.claim("checker", visibility=1) is None  # nothing of the demo's


@pytest.mark.slow
def test_live_view_renders_on_a_terminal_and_ends_with_the_verdict() -> None:
    code, shown = transports_on_a_terminal("demo", "--quick", "--executions", "30")
    assert code == 0, shown
    assert "\x1b[" in shown  # drawn with terminal control sequences
    assert "events acked" in shown
    assert "in flight" in shown
    assert "240/240" in shown  # the bar reached the end
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    verdict = next(line for line in plain.splitlines() if line.startswith(("OK", "FAILED")))
    assert VERDICT.match(verdict.strip()), verdict
    assert plain.rindex("OK: 240 events") > plain.rindex("240/240")


@pytest.mark.slow
def test_piped_output_has_no_live_view_or_colour() -> None:
    result = transports("demo", "--quick", "--executions", "4", "--events", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\x1b" not in result.stdout
    assert "events acked" not in result.stdout
