"""A call made while a restarted server still loads its data set (it answers -LOADING to
everything but a few commands) waits for it within ``socket_timeout`` and then runs; past
that it fails with a `TransportError` that says nothing was done, never `OutcomeUnknown`.

The server is a private one with an append-only file that holds 20,000 filler keys
besides the queue, restarted with ``key-load-delay`` (microseconds per key) so that its
loading lasts a second or more, whatever the machine's speed, and with clients answered
after every KiB it loads (by default, only every 2 MiB).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from transports_core import (
    Event,
    OutcomeUnknown,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_redis import RedisTransport

from .server import PrivateServer, private_server, with_queue

FILLER = 20_000
LOAD_DELAY_US = "100"


def _info(client: redis.Redis, section: str) -> dict[str, object]:
    return dict(client.info(section))


def _restart_loading(server: PrivateServer) -> None:
    """SIGKILL ``server`` and start it again slowed down, returning while it loads."""
    server.kill()
    server.process = subprocess.Popen(
        [
            "redis-server", "--port", str(server.port), "--bind", "127.0.0.1",
            "--dir", str(server.directory), "--appendonly", "yes",
            "--appendfsync", "always", "--save", "", "--daemonize", "no",
            "--logfile", str(server.directory / "redis.log"),
            "--key-load-delay", LOAD_DELAY_US,
            # Answer clients every KiB loaded, not every 2 MiB: the calls meet LOADING.
            "--loading-process-events-interval-bytes", "1024",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # No retries: redis-py's default ones would wait out the loading this looks for.
    client = redis.Redis(port=server.port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + 20
    try:
        while True:
            assert time.monotonic() < deadline, "the server did not start"
            assert server.process.poll() is None, "the server exited"
            try:
                client.ping()
            except redis.BusyLoadingError:
                return
            except redis.ConnectionError:
                time.sleep(0.01)  # not listening yet: polled, nothing to wait on
                continue
            raise AssertionError("the server answered before it loaded: too little data")
    finally:
        client.close()


@pytest.fixture
def loaded() -> Iterator[PrivateServer]:
    """A private server with the filler keys in its append-only file's base."""
    with private_server("--enable-debug-command", "local") as server:
        client = redis.Redis(port=server.port, decode_responses=True)
        try:
            client.execute_command("DEBUG", "POPULATE", FILLER, "filler")  # type: ignore[no-untyped-call]
            client.bgrewriteaof()
            deadline = time.monotonic() + 60
            while _info(client, "persistence")["aof_rewrite_in_progress"]:
                assert time.monotonic() < deadline, "the rewrite did not end"
                time.sleep(0.05)
        finally:
            client.close()
        yield server


def _loading_refusals(server: PrivateServer) -> int:
    client = redis.Redis(port=server.port, decode_responses=True)
    try:
        stats = _info(client, "errorstats").get("errorstat_LOADING", {"count": 0})
        assert isinstance(stats, dict)
        return int(stats["count"])
    finally:
        client.close()


def test_a_claim_made_while_the_server_loads_waits_for_it(loaded: PrivateServer) -> None:
    url = with_queue(loaded.url, "loading")
    with open_transport(url) as transport:
        seqs = [transport.publish("g", Event(n=n)) for n in range(3)]
    _restart_loading(loaded)
    with open_transport(url, socket_timeout=60) as transport:
        lease = transport.claim("w", 30)
        assert lease is not None
        assert (lease.seq, lease.event.n) == (seqs[0], 0)
        transport.ack(lease)
    # It did meet the loading server: the refusals were waited out, not reported.
    assert _loading_refusals(loaded) >= 1


def test_an_async_publish_made_while_the_server_loads_is_stored_once(
    loaded: PrivateServer,
) -> None:
    url = with_queue(loaded.url, "loading")
    _restart_loading(loaded)

    async def publish() -> int:
        async with open_async_transport(url, socket_timeout=60) as transport:
            return await transport.publish("g", Event(n=1))

    seq = asyncio.run(publish())
    assert _loading_refusals(loaded) >= 1
    with open_transport(url) as transport:
        assert isinstance(transport, RedisTransport)
        assert transport.stats().ready == 1
        lease = transport.claim("w", 30)
        assert lease is not None
        assert lease.seq == seq
        transport.ack(lease)


def test_a_publish_that_outwaits_its_timeout_says_nothing_was_done(
    loaded: PrivateServer,
) -> None:
    url = with_queue(loaded.url, "loading")
    _restart_loading(loaded)
    with open_transport(url, socket_timeout=0.2) as transport:
        with pytest.raises(TransportError, match="loading its data set") as raised:
            transport.publish("g", Event(n=1))
        assert not isinstance(raised.value, OutcomeUnknown)
        assert "nothing was done" in str(raised.value)
    with open_transport(url, socket_timeout=60) as transport:
        assert isinstance(transport, RedisTransport)
        assert transport.stats().ready == 0
