"""Where the Redis tests find their server, a queue of their own on it, and private servers.

Order: ``TRANSPORTS_REDIS_URL``; else the local server at `LOCAL_URL`; else skip with a
message saying how to run them. Under ``CI=true`` an unreachable server fails the run
instead. (testcontainers is left to users' machines: no Docker engine answers here.)
Every queue is checked by the read-only invariant script and its keys deleted when the
test ends. Used by ``tests/redis`` and ``conformance/test_redis.py``.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from transports_core import open_transport, redact_url
from transports_redis import RedisTransport

LOCAL_URL = "redis://127.0.0.1:6379/0"
HOW = (
    "set TRANSPORTS_REDIS_URL=redis://HOST:PORT/DB, or run redis-server on 127.0.0.1:6379 "
    "(see ../shared/SERVICES.md)"
)


@functools.cache
def _reachable() -> tuple[str | None, str]:
    url = os.environ.get("TRANSPORTS_REDIS_URL") or LOCAL_URL
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except (redis.RedisError, OSError) as exc:
        return None, f"no Redis at {redact_url(url)} ({str(exc)[:200]}): {HOW}"
    return url, ""


def server_url() -> str:
    """The server's URL (no query), or skip (fail under CI) when none answers."""
    url, why = _reachable()
    if url is None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return url


def with_queue(url: str, queue: str, **query: object) -> str:
    parts = [f"queue={queue}", *(f"{key}={value}" for key, value in query.items())]
    joiner = "&" if urlsplit(url).query else "?"
    return f"{url}{joiner}{'&'.join(parts)}"


def delete_queue(url: str, queue: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"dt:{{{queue}}}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def broken_invariants(url: str) -> list[str]:
    with open_transport(url) as transport:
        assert isinstance(transport, RedisTransport)
        return transport.check()


@contextmanager
def fresh_queue(prefix: str = "t", *, check: bool = True) -> Iterator[tuple[str, str]]:
    """(server URL, a new queue name): after the test the invariants are checked, then the
    queue's keys are deleted whatever happened."""
    url = server_url()
    queue = f"{prefix}-{uuid.uuid4().hex[:12]}"
    try:
        yield url, queue
        if check:
            assert broken_invariants(with_queue(url, queue)) == []
    finally:
        delete_queue(url, queue)


def free_port() -> int:
    """A free port whose cluster bus port (10000 higher) is a port too."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port < 55000:
            return port


class PrivateServer:
    """A ``redis-server`` of the test's own: its directory, a free port, AOF fsync always."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.directory = directory
        self.port = free_port()
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.directory), "--appendonly", "yes",
                "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--logfile", str(self.directory / "redis.log"), *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                if client.ping():
                    break
            except (redis.BusyLoadingError, redis.ConnectionError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync beyond what each write already did."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextmanager
def private_server(*extra: str) -> Iterator[PrivateServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the private-server tests need it")
    directory = Path(tempfile.mkdtemp(prefix="dt-redis-"))
    server = PrivateServer(directory, *extra)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)
