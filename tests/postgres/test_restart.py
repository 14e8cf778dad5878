"""A private PostgreSQL server crashed and restarted under load: nothing that a call
returned from is lost, and the workers carry on after it. Needs the server binaries and
root (to run them as the ``postgres`` user); skipped with the reason otherwise."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests._children import until_stopped
from transports_core import Event, OutcomeUnknown, TransportAdmin, TransportError, open_transport

from . import _workers

WORKERS = 2
MESSAGES = 300


def _bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(out.stdout.strip())
    return path if (path / "initdb").exists() and (path / "pg_ctl").exists() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateServer:
    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir, self.root, self.port = bindir, root, _free_port()
        self.data = root / "data"

    def _as_postgres(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120
        )

    def init(self) -> None:
        self._as_postgres(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        )

    def pg_ctl(self, action: str, *more: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._as_postgres(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            action,
            *more,
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    bindir = _bindir()
    if bindir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip(
            "needs PostgreSQL's server binaries (pg_config --bindir) and root, to run "
            "initdb and pg_ctl as the postgres user"
        )
    root = Path(tempfile.mkdtemp(prefix="transports-pg-"))
    shutil.chown(root, "postgres", "postgres")
    server = PrivateServer(bindir, root)
    try:
        server.init()
        server.pg_ctl("start")
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_crash_and_restart_under_load_loses_nothing_that_returned(
    private_server: PrivateServer, tmp_path: Path
) -> None:
    url = f"{private_server.url}?schema=restart&pool_min_size=0&pool_max_size=2&pool_timeout=20"
    published: set[int] = set()
    maybe: int = 0
    with open_transport(url) as queue:
        with until_stopped(_workers.resilient, url, tmp_path, WORKERS) as journals:
            for n in range(MESSAGES):
                if n == MESSAGES // 2:
                    # A crash: no shutdown checkpoint, recovery replays the WAL.
                    private_server.pg_ctl("restart", "-m", "immediate")
                while True:
                    try:
                        published.add(queue.publish(f"g{n % 7}", Event(n=n)))
                        break
                    except OutcomeUnknown:
                        maybe += 1
                        break
                    except TransportError:
                        time.sleep(0.1)
        assert isinstance(queue, TransportAdmin)
        stats = queue.stats()
    lines = [line.split() for j in journals if j.exists() for line in j.read_text().splitlines()]
    acked = [int(seq) for kind, seq in lines if kind == "acked"]
    unknown = {int(seq) for kind, seq in lines if kind == "unknown"}
    assert len(acked) == len(set(acked)), "a message was acked twice"
    missing = published - set(acked) - unknown
    assert not missing, f"published and returned, never acked: {sorted(missing)}"
    assert (stats.ready, stats.in_flight, stats.parked) == (0, 0, 0)
    assert len(published) >= MESSAGES - maybe


def _server_pids(server: PrivateServer) -> tuple[int, list[int]]:
    """The postmaster's pid and those of every other process of the server."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(
        ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=True
    )
    return postmaster, [int(pid) for pid in children.stdout.split()]


def _walwriter(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
@pytest.mark.parametrize("lease_commit", ["flush", "async"])
def test_a_power_cut_keeps_a_flushed_claim_and_undoes_an_async_one(
    private_server: PrivateServer, lease_commit: str
) -> None:
    url = f"{private_server.url}?schema=cut&pool_min_size=0&pool_max_size=1"
    with open_transport(url, lease_commit=lease_commit) as queue:
        queue.publish("g", Event(n=1))
        # The WAL writer stopped: what no commit has flushed stays in the server's memory.
        writer = _walwriter(private_server.url)
        os.kill(writer, signal.SIGSTOP)
        try:
            lease = queue.claim("w", 600)
            assert lease is not None
            # The power cut: every process of the server dies at once, its memory with it.
            postmaster, children = _server_pids(private_server)
            for pid in (postmaster, *children):
                os.kill(pid, signal.SIGKILL)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGCONT)
    _wait_gone(postmaster)
    private_server.pg_ctl("start")
    with open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        stats = queue.stats()
        if lease_commit == "flush":
            # The claim returned, so it was on disk: the lease is still held.
            assert (stats.ready, stats.in_flight) == (0, 1)
            queue.ack(lease)
        else:
            # The claim was undone: the message is due again, as if its lease had lapsed,
            # and the same worker claiming it gets the very same lease back.
            assert (stats.ready, stats.in_flight) == (1, 0)
            again = queue.claim("w", 600)
            assert again is not None
            assert (again.seq, again.attempt) == (lease.seq, lease.attempt)
            queue.ack(again)
        assert queue.stats().ready == 0


def _wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not die")
