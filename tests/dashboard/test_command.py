"""What ``transports dashboard`` refuses before it serves anything, each with a reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli._command import transports
from tests.postgres.server import drop_schema, fresh_schema, with_schema
from transports_cli.dashboard import TOKEN_VARIABLE
from transports_cli.dashboard._command import is_loopback

from ._queues import prepare
from ._server import dashboard, request
from .conftest import with_password


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "example.invalid"])
def test_a_host_off_loopback_needs_allow_remote(tmp_path: Path, host: str) -> None:
    done = transports("dashboard", f"sqlite:///{tmp_path / 'queue.db'}", "--host", host)
    assert done.returncode == 1
    assert f"refusing to listen on {host!r}: it is not a loopback address" in done.stderr
    assert "--allow-remote" in done.stderr
    assert list(tmp_path.iterdir()) == []  # refused before the queue was opened


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False),
     ("localhost.example", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_missing_extra_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    prepare(url)
    # Blocking the import is how the extra's absence looks to the command.
    program = (
        "import sys; sys.modules['starlette'] = None\n"
        "from transports_cli._app import run\n"
        f"sys.exit(run(['dashboard', {url!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "the dashboard needs the 'dashboard' extra (starlette is not installed)" in done.stderr
    assert "pip install 'durable-transports[dashboard]'" in done.stderr


def test_a_short_token_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    prepare(url)
    done = transports("dashboard", url, "--allow-actions", env={TOKEN_VARIABLE: "short"})
    assert done.returncode == 1
    assert f"{TOKEN_VARIABLE} is 5 characters long" in done.stderr
    assert "short" not in done.stdout


def test_a_missing_queue_file_is_refused(tmp_path: Path) -> None:
    done = transports("dashboard", f"sqlite:///{tmp_path / 'none.db'}", "--port", "0")
    assert done.returncode == 1
    assert "the file does not exist" in done.stderr
    assert not (tmp_path / "none.db").exists()


def test_the_help_needs_no_extra() -> None:
    program = (
        "import sys; sys.modules['starlette'] = sys.modules['uvicorn'] = None\n"
        "from transports_cli._app import run\n"
        "sys.exit(run(['dashboard', '--help']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert done.returncode == 0, done.stderr
    assert "--allow-actions" in done.stdout


def test_a_store_that_fails_answers_503_naming_no_password() -> None:
    with fresh_schema("td") as (server, schema):
        url, password = with_password(server)
        url = with_schema(url, schema)
        prepare(url)
        with dashboard(url) as running:
            assert request(running.at("/")).status == 200
            drop_schema(server, schema)  # the queue's tables are gone under it
            page, api = request(running.at("/dead")), request(running.at("/api/stats"))
        assert (page.status, api.status) == (503, 503)
        assert "the queue did not answer" in page.body
        assert "the queue did not answer" in api.body
        for text in (page.body, api.body, running.output):
            assert password not in text
        assert running.returncode == 0, running.output
