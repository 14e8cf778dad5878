"""Failures to reach a store, as the commands report them: one line, fast, naming the
place and the reason (a PostgreSQL server that is down, a Redis database number the
server does not have, a directory SQLite cannot write, the conformance suite without
pytest)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from transports_core import Event, TransportError, open_async_transport

from ._command import transports

DOWN = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens on port 1


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def test_a_postgres_server_that_is_down_fails_at_once_with_one_line() -> None:
    started = time.monotonic()
    result = transports("inspect", DOWN)
    took = time.monotonic() - started
    assert result.returncode == 1
    [line] = result.stderr.splitlines()  # no log lines of the pool's retries
    assert line.startswith(f"Error: {DOWN}")
    assert '"127.0.0.1", port 1' in line
    assert "Connection refused" in line
    assert took < 10, f"took {took:.1f} s; the pool timeout is 30 s"


def test_the_async_twin_fails_at_once_too() -> None:
    async def publish() -> None:
        async with open_async_transport(DOWN) as queue:
            await queue.publish("g", Event())

    started = time.monotonic()
    with pytest.raises(TransportError, match=r"cannot connect: .*Connection refused"):
        asyncio.run(publish())
    assert time.monotonic() - started < 10


def test_a_worker_on_a_postgres_server_that_is_down_says_so_before_starting(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobs.py").write_text("def handle(event, ctx):\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "transports_cli", "worker", "jobs:handle", DOWN],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "Connection refused" in line


@pytest.mark.skipif(not _listening(6379), reason="no Redis server at 127.0.0.1:6379")
def test_a_redis_database_number_out_of_range_is_named() -> None:
    result = transports("inspect", "redis://127.0.0.1:6379/99")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: redis://127.0.0.1:6379/99: the server has no database")
    assert "'databases' setting" in line
    assert "--debug" not in line  # an error of ours, not an unexpected one


def test_a_database_file_that_cannot_be_created_names_its_directory() -> None:
    # /sys refuses new files even to root, which the permission bits of a test directory
    # would not stop.
    result = transports("publish", "sqlite:////sys/queue.db", "g", "{}")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "cannot create the database file in directory '/sys'" in line


HIDE_PYTEST = """
import runpy, sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "pytest" or name.startswith(("pytest.", "_pytest")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hide())
sys.argv = ["conformance", "sqlite:///unused.db"]
runpy.run_module("transports_core.conformance", run_name="__main__", alter_sys=True)
"""


def test_the_conformance_module_without_pytest_names_the_extra(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HIDE_PYTEST)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "error: the conformance suite needs pytest: pip install 'durable-transports[conformance]'"
    )
    assert not (tmp_path / "unused.db").exists()
