"""``transports publish``: one event from the command line, or JSON lines from stdin in
batches, on a real SQLite file; a bad line names its number and its batch is not written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from transports_core import TransportAdmin, open_transport

from ._command import COMMAND, transports


def _messages(url: str) -> list[tuple[str, int, dict[str, object]]]:
    """(group, priority, event fields) of every message, claimed and acked in turn."""
    found: list[tuple[str, int, dict[str, object]]] = []
    with open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        priorities = {g.group_id: g.priority for g in queue.groups(limit=1000)}
        while (lease := queue.claim("reader", 60)) is not None:
            found.append((lease.group_id, priorities[lease.group_id], lease.event.model_dump()))
            queue.ack(lease)
    return found


def test_one_event_from_the_command_line_prints_its_seq(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    first = transports("publish", url, "order-1", '{"step": 1}', "--priority", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "Published seq 1 to group 'order-1'\n"
    keyed = transports("publish", url, "order-1", '{"step": 2}', "--key", "k", "--json")
    again = transports("publish", url, "order-1", '{"step": 3}', "--key", "k", "--json")
    assert json.loads(keyed.stdout) == {"seq": 2, "duplicate": False}
    assert json.loads(again.stdout) == {"seq": 2, "duplicate": True}
    assert _messages(url) == [("order-1", 3, {"step": 1}), ("order-1", 3, {"step": 2})]


def test_an_event_that_is_not_a_json_object_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    for bad in ("[1, 2]", "{nope"):
        result = transports("publish", url, "g", bad)
        assert result.returncode == 2
        assert "EVENT" in result.stderr
    assert not (tmp_path / "q.db").exists() or _messages(url) == []


def test_json_lines_from_stdin_are_published_in_batches_and_counted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    lines = [
        json.dumps({"group": f"g{n % 3}", "event": {"n": n}, "priority": n % 3}) for n in range(7)
    ]
    lines.insert(3, "")  # blank lines are skipped
    lines.append(json.dumps({"group": "g0", "event": {"n": 99}, "key": "once"}))
    lines.append(json.dumps({"group": "g0", "event": {"n": 100}, "key": "once"}))
    result = transports("publish", url, "--batch", "2", input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Published 8 events (1 duplicate skipped)\n"
    got = _messages(url)
    assert sorted(int(str(e["n"])) for _, _, e in got) == [0, 1, 2, 3, 4, 5, 6, 99]
    assert {(g, p) for g, p, _ in got} == {("g0", 0), ("g1", 1), ("g2", 2)}


def test_group_argument_is_the_default_group_of_lines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    lines = '{"event": {"n": 1}}\n{"group": "other", "event": {"n": 2}}\n'
    result = transports("publish", url, "mine", "--json", input=lines)
    assert json.loads(result.stdout) == {"published": 2, "duplicates": 0}
    assert sorted(g for g, _, _ in _messages(url)) == ["mine", "other"]


def test_a_bad_line_names_its_number_and_its_batch_is_not_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    good = [json.dumps({"group": "g", "event": {"n": n}}) for n in range(5)]
    cases = {
        '{"group": "g", "event": {"n": 5}, "priority": 9}': "priority",
        '{"group": "g", "event": [5]}': "JSON object",
        '{"group": "g"}': "'event'",
        '{"group": "g", "event": {}, "colour": "red"}': "'colour'",
        "not json": "not JSON",
        '{"event": {"n": 5}}': "'group'",
        # JSON as Python's json module takes it, but not JSON: stored, it would be null.
        '{"group": "g", "event": {"n": NaN}}': "NaN is not JSON",
        '{"group": "g", "event": {"n": Infinity}}': "Infinity is not JSON",
        '{"group": "g", "event": {"n": [-Infinity]}}': "-Infinity is not JSON",
        '{"group": "g", "event": {"n": 1e999}}': "1e999 is too large for a JSON number",
        '{"group": "g", "event": {"n": -2.5E400}}': "-2.5E400 is too large",
        # Text no store can write: named, with the line, like any other bad line.
        '{"group": "g\\ud800", "event": {"n": 5}}': "group_id must be Unicode text",
        '{"group": "g", "event": {"n": "\\udc00"}}': "the event holds a lone surrogate",
        '{"group": "g", "event": {"\\ud83d": 1}}': "the event holds a lone surrogate",
        '{"group": "g", "key": "k\\u0000", "event": {"n": 5}}': "key must not contain a NUL",
        json.dumps({"group": "g" * 513, "event": {"n": 5}}): "group_id must be at most 512",
    }
    for bad, said in cases.items():
        path = tmp_path / f"q{len(bad)}-{len(said)}.db"
        url = f"sqlite:///{path}"
        with open_transport(url):
            pass
        # Batches of 4: lines 1-4 are written, line 6 is bad, so line 5 is not.
        result = transports("publish", url, "--batch", "4", input="\n".join([*good, bad]) + "\n")
        assert result.returncode == 1, (bad, result.stdout)
        [line] = result.stderr.splitlines()
        assert line.startswith("Error: line 6 of standard input: "), line
        assert said in line, line
        assert [e["n"] for _, _, e in _messages(url)] == [0, 1, 2, 3]
        assert result.stdout == ""


def test_priority_and_key_options_are_refused_with_stdin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    result = transports("publish", url, "--key", "k", input='{"group": "g", "event": {}}\n')
    assert result.returncode == 2
    assert "--priority and --key" in result.stderr


def test_publish_takes_the_url_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    one = transports("publish", "g", '{"n": 1}', env={"TRANSPORTS_URL": url})
    assert one.returncode == 0, one.stderr
    many = transports(
        "publish", env={"TRANSPORTS_URL": url}, input='{"group": "h", "event": {"n": 2}}\n'
    )
    assert many.stdout == "Published 1 event\n"
    assert [(g, e) for g, _, e in _messages(url)] == [("g", {"n": 1}), ("h", {"n": 2})]


def test_a_line_that_is_not_utf8_names_its_number(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    lines = b'{"group": "g", "event": {"n": 1}}\n{"group": "g\xff", "event": {"n": 2}}\n'
    result = subprocess.run(
        [*COMMAND, "publish", url], input=lines, capture_output=True, check=False, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        "Error: line 2 of standard input: not UTF-8 text (an undecodable byte or a lone "
        "surrogate at column 13)"
    ]
    assert _messages(url) == []


def test_good_unicode_and_escaped_pairs_are_published_as_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    lines = '{"group": "gr\\u00fcn", "event": {"s": "\\ud83d\\ude00", "t": "\u00fc"}}\n'
    result = transports("publish", url, input=lines)
    assert result.returncode == 0, result.stderr
    assert _messages(url) == [("grün", 0, {"s": "\U0001f600", "t": "ü"})]


def test_an_event_argument_that_is_not_json_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    for bad, said in (
        ('{"ratio": NaN}', "NaN is not JSON"),
        ('{"big": 1e999}', "1e999 is too large for a JSON number"),
        ('{"s": "\\ud800"}', "the event holds a lone surrogate"),
    ):
        result = transports("publish", url, "g", bad)
        assert result.returncode == 2, (bad, result.stdout)
        assert said in result.stderr, result.stderr
        assert "EVENT" in result.stderr
    assert not (tmp_path / "q.db").exists() or _messages(url) == []
