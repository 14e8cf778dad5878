"""Recovery: a private PostgreSQL server restarted under a transport whose pool holds eight
connections, all dead after the restart; the first call after the server answers again
succeeds at once. A server that cannot be reached, or refuses, fails the call in seconds,
with its own reason on one line. Needs the server binaries and root (see `test_restart`).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest

from transports_core import Event, TransportError, open_async_transport, open_transport

from .server import server_url
from .test_restart import PrivateServer, private_server

__all__ = ["private_server"]

POOL = 8


def _pooled(server: PrivateServer, name: str) -> int:
    with psycopg.connect(server.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _url(server: PrivateServer, name: str) -> str:
    return (
        f"{server.url}?schema=recovery&pool_min_size={POOL}&pool_max_size={POOL}"
        f"&application_name={name}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_the_first_call_after_a_restart_succeeds_at_once_with_every_pooled_connection_dead(
    private_server: PrivateServer, mode: str
) -> None:
    name = f"recovery-{uuid.uuid4().hex[:8]}"
    with open_transport(_url(private_server, name)) as queue:
        queue.publish("g", Event(n=1))
        assert _pooled(private_server, name) == POOL
        # pg_ctl -w returns once the server accepts connections again.
        private_server.pg_ctl("restart", "-m", mode)
        answered = time.monotonic()
        lease = queue.claim("w", 60)
        took = time.monotonic() - answered
        assert lease is not None
        queue.ack(lease)
    assert took < 1.0, f"the first call after the restart took {took:.2f} s"


@pytest.mark.slow
def test_the_async_twin_recovers_as_fast(private_server: PrivateServer) -> None:
    name = f"recovery-{uuid.uuid4().hex[:8]}"

    async def scenario() -> float:
        async with open_async_transport(_url(private_server, name)) as queue:
            await queue.publish("g", Event(n=1))
            assert _pooled(private_server, name) == POOL
            private_server.pg_ctl("restart", "-m", "fast")
            answered = time.monotonic()
            lease = await queue.claim("w", 60)
            took = time.monotonic() - answered
            assert lease is not None
            await queue.ack(lease)
            return took

    took = asyncio.run(scenario())
    assert took < 1.0, f"the first call after the restart took {took:.2f} s"


@pytest.mark.slow
def test_a_call_while_the_server_is_down_fails_at_once_then_the_next_one_succeeds(
    private_server: PrivateServer,
) -> None:
    name = f"recovery-{uuid.uuid4().hex[:8]}"
    with open_transport(_url(private_server, name)) as queue:
        queue.publish("g", Event(n=1))
        private_server.pg_ctl("stop", "-m", "fast")
        started = time.monotonic()
        with pytest.raises(TransportError) as info:
            queue.claim("w", 60)
        assert time.monotonic() - started < 5
        message = str(info.value)
        assert "\n" not in message
        assert str(private_server.port) in message, message
        private_server.pg_ctl("start")
        answered = time.monotonic()
        lease = queue.claim("w", 60)
        took = time.monotonic() - answered
        assert lease is not None
    assert took < 1.0, f"the first call after the restart took {took:.2f} s"


def _refused_port() -> int:
    from .test_restart import _free_port

    return _free_port()


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("database", "does not exist"),
        ("port", "refused"),
        ("host", "192.0.2.1"),
    ],
)
def test_a_wrong_address_fails_in_seconds_with_the_servers_reason_on_one_line(
    where: str, reason: str
) -> None:
    server = server_url()
    if where == "database":
        url = server.rsplit("/", 1)[0] + f"/no_such_db_{uuid.uuid4().hex[:8]}"
    elif where == "port":
        url = f"postgresql://postgres@127.0.0.1:{_refused_port()}/test"
    else:
        # TEST-NET-1 (RFC 5737): routed nowhere; a connection waits for its timeout (or a
        # sandbox refuses it at once).
        url = "postgresql://postgres@192.0.2.1:5432/test"
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        open_transport(url)
    took = time.monotonic() - started
    message = str(info.value)
    assert reason in message
    assert "\n" not in message
    assert took < 5, f"failed after {took:.1f} s"


def _first_call(twin: str, url: str) -> None:
    if twin == "sync":
        open_transport(url).close()
        return

    async def first_call() -> None:
        async with open_async_transport(url) as queue:
            await queue.publish("g", Event(n=1))

    asyncio.run(first_call())


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_wrong_password_fails_at_once_with_the_servers_reason_on_one_line(
    private_server: PrivateServer, twin: str
) -> None:
    with psycopg.connect(private_server.url, autocommit=True) as conn:
        conn.execute("ALTER USER postgres PASSWORD 'right-one'")
    hba = private_server.data / "pg_hba.conf"
    hba.write_text("host all all 127.0.0.1/32 scram-sha-256\nlocal all all trust\n")
    private_server.pg_ctl("reload")
    url = private_server.url.replace("postgres@", "postgres:wrong-one@")
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        _first_call(twin, url)
    took = time.monotonic() - started
    message = str(info.value)
    assert "password authentication failed" in message
    assert "\n" not in message
    assert "wrong-one" not in message
    assert took < 5, f"failed after {took:.1f} s"
