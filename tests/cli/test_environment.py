"""``TRANSPORTS_URL``: every command takes its URL from the environment when the command
line gives none, the command line wins when it does, and neither is a clear usage error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ._command import transports
from ._queues import prepare


@pytest.fixture(autouse=True)
def no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands run with this process's environment, less TRANSPORTS_URL."""
    monkeypatch.delenv("TRANSPORTS_URL", raising=False)


NEEDS_A_URL = [
    ["inspect"],
    ["inspect", "--limit", "3", "--json"],
    ["dead"],
    ["dead", "list"],
    ["dead", "requeue", "3"],
    ["purge", "--group", "g"],
    ["publish", "g", "{}"],
    ["conformance"],
    ["worker", "jobs:handle"],
]


@pytest.mark.parametrize("args", NEEDS_A_URL, ids=" ".join)
def test_no_url_and_no_variable_is_a_usage_error_naming_both(args: list[str]) -> None:
    result = transports(*args)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "TRANSPORTS_URL is not set" in line
    assert "on the command line" in line
    assert f"transports {args[0]} --help" in line


def test_a_word_in_the_url_place_is_named(tmp_path: Path) -> None:
    result = transports("dead", "purge")
    assert result.returncode == 2
    assert "'purge' is not a URL, and TRANSPORTS_URL is not set" in result.stderr


@pytest.mark.parametrize(
    "args", [["inspect", "--json"], ["dead", "list", "--json"], ["dead", "--json"]], ids=" ".join
)
def test_the_variable_gives_the_same_answer_as_the_argument(
    tmp_path: Path, args: list[str]
) -> None:
    queue = prepare(tmp_path)
    given = transports(args[0], queue.url, *args[1:])
    from_environment = transports(*args, env={"TRANSPORTS_URL": queue.url})
    assert given.returncode == from_environment.returncode == 0, from_environment.stderr
    assert _ageless(json.loads(given.stdout)) == _ageless(json.loads(from_environment.stdout))


def _ageless(report: Any) -> Any:
    """A JSON report without the backlog's ages, which grow between the two runs."""
    if isinstance(report, dict):
        return {k: _ageless(v) for k, v in report.items() if k != "oldest_ready_age"}
    if isinstance(report, list):
        return [_ageless(item) for item in report]
    return report


def test_a_url_on_the_command_line_wins_over_the_variable(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("inspect", queue.url, "--json", env={"TRANSPORTS_URL": "nope://elsewhere"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["url"] == queue.url


def test_requeue_with_the_variable_keeps_its_seqs(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("dead", "requeue", "4", env={"TRANSPORTS_URL": queue.url})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Requeued: 4\n"


def test_help_needs_no_url_and_names_the_variable() -> None:
    assert transports("inspect", "--help").returncode == 0
    result = transports("--help")
    assert result.returncode == 0
    assert "TRANSPORTS_URL" in result.stdout
