"""``transports group pause|resume|peek|purge`` and ``transports cancel`` end to end, on a
real SQLite file, and what ``inspect`` shows of delayed messages, pauses and tenants."""

from __future__ import annotations

import json
from pathlib import Path

from transports_core import Event, TransportAdmin, open_transport

from ._command import transports


def _queue(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as t:
        t.publish("order-1", Event(step=1))
        t.publish("order-1", Event(step=2))
        t.publish("order-1", Event(step=3), delay=3600)
        t.publish("order-2", Event(step=1), tenant="acme")
    return url


def test_pause_and_resume_change_what_claims_get(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    paused = transports("group", "pause", url, "order-1")
    assert (paused.returncode, paused.stdout) == (0, "Paused group 'order-1'.\n"), paused.stderr
    again = transports("group", "pause", url, "order-1", "--json")
    assert json.loads(again.stdout) == {"group_id": "order-1", "paused": True, "changed": False}
    with open_transport(url) as t:
        lease = t.claim("w1", 60)
        assert lease is not None
        assert lease.group_id == "order-2"
        t.ack(lease)
        assert t.claim("w1", 60) is None  # order-1 is paused
    resumed = transports("group", "resume", url, "order-1")
    assert resumed.stdout == "Resumed group 'order-1'.\n", resumed.stderr
    with open_transport(url) as t:
        lease = t.claim("w1", 60)
        assert lease is not None
        assert lease.event.step == 1


def test_peek_lists_the_next_messages_and_takes_no_lease(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    shown = json.loads(transports("group", "peek", url, "order-1", "--json").stdout)
    assert [(m["seq"], m["state"], m["attempts"]) for m in shown] == [
        (1, "ready", 0),
        (2, "queued", 0),
        (3, "delayed", 0),
    ]
    assert shown[2]["due_at"] is not None
    table = transports("group", "peek", url, "order-1", "--limit", "2")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["seq", "state", "attempts", "due", "priority", "event"]
    assert len(lines) == 3  # the header and two rows
    assert "delayed" not in table.stdout
    with open_transport(url) as t:
        lease = t.claim("w1", 60)
        assert lease is not None
        assert (lease.seq, lease.attempt) == (1, 1)
    empty = transports("group", "peek", url, "nobody")
    assert empty.stdout == "Group 'nobody' has no messages.\n"


def test_cancel_removes_a_delayed_message_and_refuses_one_in_flight(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    with open_transport(url) as t:
        held = t.claim("w1", 600)
        assert held is not None
        assert held.seq == 1
        refused = transports("cancel", url, "1", "--yes")
        assert refused.returncode == 1
        assert "message 1 was not cancelled: it is in flight or gone" in refused.stderr
        unasked = transports("cancel", url, "3")  # no answer on stdin: nothing happens
        assert unasked.returncode == 1
        assert "nothing was changed" in unasked.stderr
        done = transports("cancel", url, "3", "--yes")
        assert (done.returncode, done.stdout) == (0, "Cancelled message 3.\n"), done.stderr
        assert isinstance(t, TransportAdmin)
        assert [m.seq for m in t.peek("order-1")] == [1, 2]
        t.ack(held)
    bad = transports("cancel", url, "0", "--yes")
    assert bad.returncode == 2
    assert "0" in bad.stderr


def test_group_purge_deletes_delayed_messages_too(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    done = transports("group", "purge", url, "order-1", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["removed"] == 3
    with open_transport(url) as t:
        assert isinstance(t, TransportAdmin)
        assert t.peek("order-1") == []
        assert t.stats().delayed == 0


def test_inspect_shows_delayed_paused_and_tenants(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    transports("group", "pause", url, "order-2")
    report = json.loads(transports("inspect", url, "--json").stdout)
    assert report["totals"] == {"ready": 3, "in_flight": 0, "parked": 0, "delayed": 1, "dead": 0}
    assert report["paused_groups"] == ["order-2"]
    assert {t["tenant"]: (t["weight"], t["groups"]) for t in report["tenants"]} == {
        None: (1, 1),
        "acme": (1, 1),
    }
    text = transports("inspect", url).stdout
    assert "Paused groups (1): order-2" in text
    assert "Tenants: (none) weight 1, 1 group, acme weight 1, 1 group" in text
    header = next(line for line in text.splitlines() if line.startswith("priority"))
    assert header.split()[5] == "delayed"  # priority, ready, in flight, parked, delayed


def test_group_takes_its_url_from_the_environment(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    done = transports("group", "pause", "order-1", env={"TRANSPORTS_URL": url})
    assert done.stdout == "Paused group 'order-1'.\n", done.stderr
    with open_transport(url) as t:
        assert isinstance(t, TransportAdmin)
        assert t.paused_groups() == ["order-1"]
