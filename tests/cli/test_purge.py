"""``transports purge --group`` end to end: it deletes exactly one group, after asking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transports_core import LeaseLost, open_transport

from ._command import transports
from ._queues import Rows, prepare, rows


def _without_group(before: Rows, group_id: str) -> Rows:
    """``before`` minus every row that names ``group_id`` (messages, groups, dead letters)."""
    return {table: [row for row in found if group_id not in row] for table, found in before.items()}


@pytest.mark.parametrize("answer", ["n\n", "", "\n"])
def test_without_yes_and_no_answer_nothing_changes(tmp_path: Path, answer: str) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("purge", queue.url, "--group", "deep", input=answer)
    assert result.returncode == 1
    assert result.stdout == ""
    assert (
        f"Delete 3 messages and 0 dead letters of group 'deep' from {queue.url} for good? [y/N]"
        in result.stderr
    )
    assert result.stderr.splitlines()[-1] == "Error: not confirmed; nothing was changed"
    assert rows(queue.path) == before


def test_y_deletes_that_group_and_nothing_else(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("purge", queue.url, "--group", "deep", input="y\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Purged group 'deep': removed 3 messages and 0 dead letters.\n"
    after = rows(queue.path)
    assert after == _without_group(before, "deep")
    assert after != before


def test_a_leased_group_goes_too_and_its_worker_loses_the_lease(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("purge", queue.url, "--group", "leased", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout) == {
        "group_id": "leased",
        "removed": 2,
        "messages": 2,
        "dead_letters": 0,
    }
    assert rows(queue.path) == _without_group(before, "leased")
    with open_transport(queue.url) as again, pytest.raises(LeaseLost):
        again.ack(queue.lease)


def test_the_prompt_warns_about_a_leased_head(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("purge", queue.url, "--group", "leased", input="n\n")
    assert result.returncode == 1
    assert "A worker holds a lease on the head of 'leased'; it will get LeaseLost." in (
        result.stderr
    )


def test_a_group_with_only_a_dead_letter_loses_it(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("purge", queue.url, "--group", "poison", input="y\n")
    assert result.returncode == 0, result.stderr
    assert "Delete 0 messages and 1 dead letter of group 'poison'" in result.stderr
    assert result.stdout == "Purged group 'poison': removed 0 messages and 1 dead letter.\n"
    assert rows(queue.path) == _without_group(before, "poison")


def test_an_unknown_group_is_an_error_and_changes_nothing(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("purge", queue.url, "--group", "no-such-group", "--yes")
    assert result.returncode == 1
    assert result.stderr == "Error: group 'no-such-group' has no messages and no dead letters\n"
    assert rows(queue.path) == before


def test_group_is_required(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("purge", queue.url, "--yes")
    assert result.returncode == 2
    assert "Missing option '--group'" in result.stderr
