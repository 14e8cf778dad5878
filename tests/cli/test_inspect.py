"""``transports inspect`` end to end, on a real SQLite file prepared with the library."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.core.broken_backends import MemoryStore
from transports_cli._app import run
from transports_core import (
    Backend,
    Event,
    Lease,
    Message,
    Transport,
    open_transport,
    register_backend,
)
from transports_core.backend import Closing

from ._command import transports
from ._queues import prepare, rows


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_json_counts_match_what_was_set_up(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("inspect", queue.url, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["url"] == queue.url
    # ready: deep's 3, ready's 1, and leased's second message (waiting behind its head).
    assert report["totals"] == {"ready": 5, "in_flight": 1, "parked": 1, "delayed": 0, "dead": 1}
    assert report["keys"] == 0  # nothing was published with a key
    by_priority = {p["priority"]: p for p in report["by_priority"]}
    assert sorted(by_priority) == [0, 1, 2]
    counts = {
        p: [by_priority[p][k] for k in ("ready", "in_flight", "parked", "dead")]
        for p in by_priority
    }
    assert counts == {0: [2, 1, 1, 0], 1: [0, 0, 0, 1], 2: [3, 0, 0, 0]}
    assert report["oldest"] == {"seq": 1, "group_id": "leased", "priority": 0, "state": "in_flight"}
    assert by_priority[1]["oldest"] is None  # poison's only message is dead
    assert by_priority[2]["oldest"]["seq"] == 5
    assert report["groups_total"] == 4
    assert (report["ready_groups"], report["busy_groups"]) == (2, 2)  # leased, parked busy
    assert report["oldest_ready_age"] == max(
        by_priority[0]["oldest_ready_age"], by_priority[2]["oldest_ready_age"]
    )
    assert by_priority[1]["oldest_ready_age"] is None
    groups = [(g["group_id"], g["depth"], g["head_seq"], g["state"]) for g in report["groups"]]
    assert groups == [
        ("deep", 3, 5, "ready"),
        ("leased", 2, 1, "in_flight"),
        ("parked", 1, 3, "parked"),
        ("ready", 1, 8, "ready"),
    ]
    leased = report["groups"][1]
    assert leased["busy_until"] == pytest.approx(queue.lease.expires_at)
    assert report["groups"][0]["last_claimed_at"] is None
    assert report["held_groups"] == []


def test_limit_lists_the_deepest_groups_only(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    report = json.loads(transports("inspect", queue.url, "--json", "--limit", "2").stdout)
    assert [g["group_id"] for g in report["groups"]] == ["deep", "leased"]
    assert report["groups_total"] == 4
    assert report["oldest"]["seq"] == 1  # found among all groups, not only those listed


def test_inspect_changes_no_byte_and_takes_no_lease(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    before_bytes, before_rows = _digest(queue.path), rows(queue.path)
    for args in (["--json"], [], ["--limit", "1"]):
        result = transports("inspect", queue.url, *args)
        assert result.returncode == 0, result.stderr
    assert rows(queue.path) == before_rows  # includes every lease: holder, expiry, attempt
    assert _digest(queue.path) == before_bytes
    # The lease taken before inspect is still the current one: it can be acked.
    with open_transport(queue.url) as again:
        again.ack(queue.lease)


def test_table_shows_totals_oldest_and_deepest_groups(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    result = transports("inspect", queue.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        lines[0] == f"Queue {queue.url}: 7 messages in 4 groups, 1 dead letter, 0 idempotency keys"
    )
    assert lines[2].split() == [
        "priority",
        "ready",
        "in",
        "flight",
        "parked",
        "delayed",
        "dead",
        "groups",
        "ready/busy",
        "oldest",
        "ready",
        "first",
        "seq",
    ]
    # Ages ("12.3 s", or "-") are read apart: they grow while the test runs.
    found = [_age_apart(line.split()) for line in lines[3:7]]
    assert [row for row, _ in found] == [
        ["0", "2", "1", "1", "0", "0", "1/2", "1"],
        ["1", "0", "0", "0", "0", "1", "0/0", "-"],
        ["2", "3", "0", "0", "0", "0", "1/0", "5"],
        ["total", "5", "1", "1", "0", "1", "2/2", "1"],
    ]
    ages = [age for _, age in found]
    assert ages[1] is None
    assert ages[0] is not None
    assert ages[2] is not None
    assert ages[3] == max(ages[0], ages[2]) > 0
    assert "First in line: seq 1, head of group 'leased' (priority 0, in flight)" in lines
    deep = next(line for line in lines if line.startswith("deep "))
    assert deep.split()[:5] == ["deep", "2", "3", "5", "ready"]
    assert "\x1b[" not in result.stdout


def _age_apart(row: list[str]) -> tuple[list[str], float | None]:
    """A table row without its "oldest ready" cell, and that cell's seconds."""
    if row[-2] == "s":
        return [*row[:-3], row[-1]], float(row[-3])
    return [*row[:-2], row[-1]], None


def test_an_empty_queue_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_transport(url).close()
    result = transports("inspect", url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"Queue {url}: 0 messages in 0 groups, 0 dead letters, 0 idempotency keys\n"
    )
    report = json.loads(transports("inspect", url, "--json").stdout)
    assert report["totals"] == {"ready": 0, "in_flight": 0, "parked": 0, "delayed": 0, "dead": 0}
    assert report["keys"] == 0
    assert report["oldest"] is None
    assert report["groups"] == []


def test_a_missing_file_is_refused_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    result = transports("inspect", f"sqlite:///{missing}")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert (
        line
        == f"Error: no queue at {missing}: the file does not exist (this command never creates one)"
    )
    assert not missing.exists()


# -- the keys a queue remembers ------------------------------------------------------------


@pytest.fixture
def keyed() -> Iterator[str]:
    """A queue that remembers three keys: in the suite's in-memory backend, whose stats
    count keys as every backend's must (a subprocess cannot see it, so tests run `run`)."""
    store = MemoryStore(time.time)
    with store.open() as queue:
        queue.publish("a", Event(n=1), key="k1")
        queue.publish("a", Event(n=2), key="k1")  # a duplicate: no new key
        queue.publish("b", Event(n=3), key="k1")  # another group's: a key of its own
        queue.publish_many([Message("a", Event(n=4), key="k2"), ("a", Event(n=5), 0)])
        lease = queue.claim("w1", 60)
        assert lease is not None
        queue.ack(lease)  # an acked message's key is remembered still
    register_backend("keyed", Backend(open=lambda url, event_type, options: store.open()))
    yield "keyed://somewhere/queue"
    register_backend("keyed", None)


def test_json_and_table_count_the_keys_remembered(
    keyed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["inspect", keyed, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["keys"] == 3
    assert report["totals"] == {"ready": 3, "in_flight": 0, "parked": 0, "delayed": 0, "dead": 0}
    assert run(["inspect", keyed]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"Queue {keyed}: 3 messages in 2 groups, 0 dead letters, 3 idempotency keys"


# -- a backend without the admin interface -----------------------------------------------


class _PlainTransport(Closing):
    """A transport with the six methods only: no admin interface."""

    def __init__(self, inner: Transport[Event]) -> None:
        self._inner = inner

    def publish(self, group_id: str, event: Event, priority: int = 0) -> int:
        return self._inner.publish(group_id, event, priority)

    def publish_many(self, items: object) -> list[int]:
        return self._inner.publish_many(items)  # type: ignore[arg-type]

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Lease[Event] | None:
        return self._inner.claim(worker_id, visibility, min_priority)

    def ack(self, lease: Lease[object]) -> None:
        self._inner.ack(lease)

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._inner.nack(lease, delay)

    def extend(self, lease: Lease[Event], visibility: float) -> Lease[Event]:
        return self._inner.extend(lease, visibility)

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[str]:
    def open_plain(
        url: str, event_type: object, options: Mapping[str, object]
    ) -> Transport[object]:
        inner = open_transport(f"sqlite:///{tmp_path / 'plain.db'}")
        return _PlainTransport(inner)  # type: ignore[return-value]

    register_backend("plain", Backend(open=open_plain))
    yield "plain://somewhere/queue"
    register_backend("plain", None)


@pytest.mark.parametrize(
    "args", [["inspect"], ["dead"], ["dead", "requeue", "1"], ["purge", "--group", "g", "--yes"]]
)
def test_a_backend_without_the_admin_interface_gets_one_clear_line(
    plain: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # In process: a subprocess cannot see register_backend. `run` is what the script calls.
    code = run([args[0], plain, *args[1:]])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    [line] = err.splitlines()
    assert line == (
        "Error: the 'plain' backend (_PlainTransport) does not implement the admin interface "
        "(transports_core.TransportAdmin), so its queues cannot be inspected or repaired from here"
    )
