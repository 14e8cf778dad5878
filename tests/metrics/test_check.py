"""``transports check URL``: exit 0 with one line when the queue answers, 1 with one line
saying why when it does not, for probes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.cli._command import transports
from transports_core import Event, open_transport

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/test"


@pytest.fixture
def queue(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        store.publish("g", Event(n=1))
        lease = store.claim("w", 30)
        assert lease is not None
        store.bury(lease, "for the count")
    return url


def test_a_good_file_exits_0_with_its_totals(queue: str) -> None:
    result = transports("check", queue)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout == (
        f"ok: {queue} answers; 0 ready, 0 in flight, 0 parked, 1 dead letter\n"
    )


def test_the_url_may_come_from_the_environment(queue: str) -> None:
    result = transports("check", env={"TRANSPORTS_URL": queue})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: {queue} answers")


def test_a_missing_file_exits_1_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    result = transports("check", f"sqlite:///{missing}")
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: no queue at ")
    assert "does not exist" in line
    assert not missing.exists()


def test_an_unreachable_postgresql_exits_1_with_one_line() -> None:
    result = transports("check", UNREACHABLE, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ")
    assert "cannot connect" in line
    assert "Traceback" not in result.stderr


def test_max_oldest_ready_passes_with_nothing_ready(queue: str) -> None:
    result = transports("check", queue, "--max-oldest-ready", "60")
    assert result.returncode == 0, result.stderr


def test_max_oldest_ready_fails_when_a_ready_message_waited_longer(queue: str) -> None:
    with open_transport(queue) as store:
        store.publish("g", Event(n=2), priority=3)
    published = time.time()
    young = transports("check", queue, "--max-oldest-ready", "60")
    assert young.returncode == 0, young.stderr
    time.sleep(max(0.0, published + 0.6 - time.time()))  # let it age past 0.5 s
    old = transports("check", queue, "--max-oldest-ready", "0.5")
    assert old.returncode == 1, old.stdout
    [line] = old.stderr.splitlines()
    found = re.fullmatch(
        rf"Error: {re.escape(queue)}: the oldest ready message has waited ([0-9.]+) s "
        r"\(priority 3\), more than 0.5 s",
        line,
    )
    assert found, line
    assert 0.5 < float(found[1]) < time.time() - published + 0.1


def test_max_oldest_ready_must_be_positive(queue: str) -> None:
    result = transports("check", queue, "--max-oldest-ready", "0")
    assert result.returncode == 2
    assert "--max-oldest-ready" in result.stderr
