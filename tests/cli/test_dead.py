"""``transports dead`` end to end: list, requeue and purge real dead letters."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests import _privileged as privileged
from transports_cli._app import run
from transports_core import Event, TransportAdmin, open_transport
from transports_core.backend import exhausted_reason

from ._command import transports
from ._queues import LONG, prepare, rows, seqs


def _two_dead(directory: Path) -> str:
    """A queue whose groups 'a' (seq 1) and 'b' (seq 2) each have a dead letter, with
    'a' holding its group (on_dead=hold) and seq 3 waiting behind it."""
    url = f"sqlite:///{directory / 'dead.db'}?max_attempts=1&on_dead=hold"
    with open_transport(url) as queue:
        queue.publish("a", Event(n=1))
        queue.publish("b", Event(n=2), priority=3)
        queue.publish("a", Event(n=3))
        while (lease := queue.claim("w", LONG)) is not None:
            queue.nack(lease)
    return url


def test_list_shows_each_dead_letter(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("dead", queue.url, "list", "--json")
    assert result.returncode == 0, result.stderr
    [letter] = json.loads(result.stdout)
    assert (letter["seq"], letter["group_id"], letter["priority"]) == (4, "poison", 1)
    assert json.loads(letter["event"]) == {"step": 1}
    assert letter["attempts"] == 1
    assert letter["held"] is False
    table = transports("dead", queue.url)  # list is the default action
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:4] == ["seq", "group", "priority", "attempts"]
    assert row.split()[:4] == ["4", "poison", "1", "1"]


def test_list_says_why_each_letter_died(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'why.db'}"
    with open_transport(url, max_attempts=1) as transport:
        tired = transport.publish("tired", Event(n=1))
        lease = transport.claim("w", LONG)
        assert lease is not None
        transport.nack(lease)  # its one attempt spent
        assert transport.claim("w", LONG) is None  # buries it
        bad = transport.publish("bad", Event(n=2))
        lease = transport.claim("w", LONG)
        assert lease is not None
        assert lease.seq == bad
        transport.bury(lease, "malformed order")
    letters = json.loads(transports("dead", url, "--json").stdout)
    assert [(d["seq"], d["reason"]) for d in letters] == [
        (tired, exhausted_reason(1, 1, "nacked")),
        (bad, "buried: malformed order"),
    ]
    table = transports("dead", url).stdout.splitlines()
    assert "out of attempts: 1 deliveries without an ack" in table[1]
    assert "buried: malformed order" in table[2]


def test_list_and_limit_on_held_dead_letters(tmp_path: Path) -> None:
    url = _two_dead(tmp_path)
    letters = json.loads(transports("dead", url, "--json").stdout)
    assert [(d["seq"], d["group_id"], d["held"]) for d in letters] == [
        (1, "a", True),
        (2, "b", True),
    ]
    limited = json.loads(transports("dead", url, "list", "--limit", "1", "--json").stdout)
    assert [d["seq"] for d in limited] == [1]


def test_no_dead_letters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'clean.db'}"
    open_transport(url).close()
    assert transports("dead", url).stdout == "No dead letters.\n"
    assert json.loads(transports("dead", url, "--json").stdout) == []


def test_requeue_reports_requeued_and_not_found(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("dead", queue.url, "requeue", "4", "99")
    assert result.returncode == 3
    assert result.stdout.splitlines() == [
        "Requeued: 4",
        "Not found (no dead letter with that seq): 99",
    ]
    assert result.stderr == "Error: 1 of 2 dead letters were not requeued\n"
    assert seqs(queue.path, "dead_letters") == []
    assert 4 in seqs(queue.path, "messages")
    # Back in delivery: it is poison's head again, and ready.
    report = json.loads(transports("inspect", queue.url, "--json").stdout)
    assert report["totals"] == {"ready": 6, "in_flight": 1, "parked": 1, "delayed": 0, "dead": 0}
    poison = next(g for g in report["groups"] if g["group_id"] == "poison")
    assert (poison["head_seq"], poison["state"]) == (4, "ready")


def test_requeue_all_found_exits_0_and_json_says_which(tmp_path: Path) -> None:
    url = _two_dead(tmp_path)
    result = transports("dead", url, "requeue", "2", "1", "2", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"requeued": [2, 1], "not_found": [], "refused": []}
    assert json.loads(transports("dead", url, "--json").stdout) == []


def test_requeue_is_refused_while_a_worker_holds_a_lease_in_the_group(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'busy.db'}?max_attempts=1"
    with open_transport(url) as queue:
        queue.publish("g", Event(n=1))
        queue.publish("g", Event(n=2))
        first = queue.claim("w", LONG)
        assert first is not None
        queue.nack(first)
        second = queue.claim("w", LONG)  # buries seq 1 and leases seq 2 in the same group
        assert second is not None
        assert second.seq == 2
    before = rows(tmp_path / "busy.db")
    result = transports("dead", url, "requeue", "1", "--json")
    assert result.returncode == 3
    document = json.loads(result.stdout)
    assert document == {
        "requeued": [],
        "not_found": [],
        "refused": [
            {
                "seq": 1,
                "reason": "cannot requeue message 1: worker 'w' holds a lease in its group "
                "'g'; requeue it once that is settled",
            }
        ],
    }
    assert result.stderr == "Error: 1 of 1 dead letters were not requeued\n"
    assert rows(tmp_path / "busy.db") == before
    plain = transports("dead", url, "requeue", "1")
    assert plain.returncode == 3
    assert plain.stdout.startswith("Refused 1: cannot requeue message 1: worker 'w' holds")


# -- a store that fails is an error, not a refusal -------------------------------------------


def _assert_failed_untouched(
    code: int, out: str, err: str, path: Path, before: object, cause: str
) -> None:
    assert code == 1, err
    assert "Refused" not in out
    [line] = err.splitlines()
    assert line.startswith(f"Error: {path}: ")
    assert cause in line
    assert line.endswith("; not requeued: 4, 99")
    assert rows(path) == before


def test_requeue_on_a_locked_file_is_an_error(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    with closing(sqlite3.connect(queue.path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")  # holds the write lock past the busy timeout
        result = transports("dead", f"{queue.url}?busy_timeout=50", "requeue", "4", "99")
        holder.execute("ROLLBACK")
    _assert_failed_untouched(
        result.returncode, result.stdout, result.stderr, queue.path, before, "locked"
    )


def _run_captured(args: list[str]) -> list[object]:
    """`transports ARGS` in this process: [exit code, stdout, stderr]."""
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        code = run(args)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    return [code, out.getvalue(), err.getvalue()]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    with privileged.shared_directory() as path:
        yield path


def test_requeue_on_a_read_only_file_is_an_error(shared_dir: Path) -> None:
    queue = prepare(shared_dir)
    with open_transport(queue.url) as owner:  # a live owner keeps -wal and -shm around
        assert isinstance(owner, TransportAdmin)
        owner.stats()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{queue.path}{suffix}").chmod(0o644)
        before = rows(queue.path)
        outcome = privileged.as_nobody(
            lambda: _run_captured(["dead", queue.url, "requeue", "4", "99"])
        )
    assert isinstance(outcome, list)
    code, out, err = outcome
    assert isinstance(code, int)
    assert isinstance(out, str)
    assert isinstance(err, str)
    _assert_failed_untouched(code, out, err, queue.path, before, "read-only")


def test_requeue_on_a_full_disk_is_an_error(tmp_path: Path) -> None:
    with privileged.small_disk(tmp_path, size="4m") as disk:
        queue = prepare(disk)
        with closing(sqlite3.connect(queue.path, isolation_level=None)) as holder:
            # The WAL emptied and kept open: the requeue's commit must grow it.
            holder.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            before = rows(queue.path)
            filler = privileged.fill(disk)
            result = transports("dead", queue.url, "requeue", "4", "99")
            filler.unlink()
        _assert_failed_untouched(
            result.returncode, result.stdout, result.stderr, queue.path, before, "full"
        )


def test_purge_asks_and_no_changes_nothing(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    for answer in ("n\n", "", "maybe\n"):  # no, end of input, and a non-answer then EOF
        result = transports("dead", queue.url, "purge", input=answer)
        assert result.returncode == 1
        assert result.stdout == ""
        assert f"Discard 1 dead letter (seq 4) from {queue.url} for good? [y/N]" in result.stderr
        assert result.stderr.splitlines()[-1] == "Error: not confirmed; nothing was changed"
        assert rows(queue.path) == before


def test_purge_with_y_discards_every_dead_letter_and_nothing_else(tmp_path: Path) -> None:
    url = _two_dead(tmp_path)
    path = tmp_path / "dead.db"
    messages = seqs(path, "messages")
    result = transports("dead", url, "purge", input="y\n")
    assert result.returncode == 0, result.stderr
    assert "Discard 2 dead letters (seq 1, 2)" in result.stderr
    assert "2 held groups will go on" in result.stderr
    assert result.stdout == "Discarded 2 dead letters.\n"
    assert seqs(path, "dead_letters") == []
    # The held rows went with their dead letters; seq 3, waiting behind 1, is free to go.
    assert messages == [1, 2, 3]
    assert seqs(path, "messages") == [3]
    with open_transport(url) as queue:
        lease = queue.claim("w", LONG)
        assert lease is not None
        assert lease.seq == 3


def test_purge_yes_json_asks_nothing(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    messages = seqs(queue.path, "messages")
    result = transports("dead", queue.url, "purge", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout) == {"discarded": [4], "already_gone": []}
    assert seqs(queue.path, "dead_letters") == []
    assert seqs(queue.path, "messages") == messages
    again = transports("dead", queue.url, "purge", "--yes")
    assert again.returncode == 0
    assert again.stdout == "No dead letters; nothing to purge.\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["list", "5"], "'list' takes no SEQ (got 5)"),
        (["requeue"], "'requeue' needs at least one SEQ"),
        (["requeue", "0"], "0 is not in the range x>=1"),
        (["requeue", "x"], "'x' is not a valid integer"),
        (["bury"], "'bury' is not one of 'list', 'requeue', 'purge'"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    queue = prepare(tmp_path)
    before = rows(queue.path)
    result = transports("dead", queue.url, *args)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert said in line
    assert "see 'transports dead --help'" in line
    assert rows(queue.path) == before
