"""What the commands refuse, or end quietly on, as real processes: an in-memory SQLite
database (nothing else can see it), a bad URL before a worker says it started, and a
reader that stops reading."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from ._command import COMMAND, transports
from ._queues import prepare


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "sqlite:///:memory:"],
        ["dead", "sqlite:///:memory:"],
        ["purge", "sqlite:///:memory:", "--group", "g", "--yes"],
        ["worker", "jobs:handle", "sqlite:///:memory:"],
        ["worker", "jobs:handle", "sqlite:///:memory:?synchronous=off", "--processes", "2"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_an_in_memory_database_is_refused(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "jobs.py").write_text("def handle(event, ctx):\n    pass\n")
    result = subprocess.run(
        [*COMMAND, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: sqlite:///:memory:")
    assert "private to the connection that opens it" in line
    assert "sqlite:///queue.db" in line


def test_a_worker_checks_its_url_before_it_says_it_started(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(
        textwrap.dedent("""
        def handle(event, ctx):
            pass
        """)
    )
    missing = tmp_path / "no-such-directory" / "q.db"
    result = subprocess.run(
        [*COMMAND, "worker", "jobs:handle", f"sqlite:///{missing}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "does not exist" in line
    assert "started" not in result.stderr


def test_inspect_into_a_reader_that_stops_exits_0_quietly(tmp_path: Path) -> None:
    queue = prepare(tmp_path)
    command = f"{' '.join(COMMAND)} inspect {queue.url} --limit 5000"
    shell = f'{command} | head -1; echo "${{PIPESTATUS[0]}}"'
    # More than a pipe holds (64 KiB), so the command is still writing when head has gone.
    lines = "".join(f'{{"group": "group-{n:05}", "event": {{}}}}\n' for n in range(3000))
    assert transports("publish", queue.url, input=lines).returncode == 0
    result = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, timeout=60, check=False
    )
    first, code = result.stdout.splitlines()
    assert first.startswith(f"Queue {queue.url}:")
    assert code == "0"
    assert result.stderr == ""
