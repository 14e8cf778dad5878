"""Where the Redis tests find their server (see `tests._services` for the order:
``TRANSPORTS_REDIS_URL``, the local server at `LOCAL_URL`, testcontainers, else skip, or
fail under ``CI=true``), a queue of their own on it, and private servers. Every queue is
checked by the read-only invariant script and its keys deleted when the test ends. Used by
``tests/redis`` and ``conformance/test_redis.py``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests import _services
from transports_core import open_transport
from transports_redis import RedisTransport

LOCAL_URL = "redis://127.0.0.1:6379/0"


def _answers(url: str) -> str | None:
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return str(exc)[:200]
    finally:
        client.close()
    return None


def _start_container(image: str) -> tuple[str, Callable[[], None]]:
    from testcontainers.redis import RedisContainer  # type: ignore[import-not-found,unused-ignore]

    container = RedisContainer(image).start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return f"redis://{host}:{port}/0", container.stop


SERVICE = _services.Service("Redis", "redis:7", LOCAL_URL, _answers, _start_container)
# The server's URL, or skip (fail under CI) when none answers.
server_url = SERVICE.url


def with_queue(url: str, queue: str, **query: object) -> str:
    return _services.with_query(url, queue=queue, **query)


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
