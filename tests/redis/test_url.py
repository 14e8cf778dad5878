"""URL and option parsing: the whitelist, the three schemes, and no password in any message."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis.exceptions as rex

from transports_core import OutcomeUnknown, TransportError, open_async_transport, open_transport
from transports_core.backend import DEDUP_WINDOW
from transports_redis import RedisOptions
from transports_redis._errors import redis_errors
from transports_redis._url import parse_url


def test_defaults_and_plain_url() -> None:
    options = parse_url("redis://cache.example:6380/2", {})
    assert options == RedisOptions(server="redis://cache.example:6380/2")
    assert options.queue == "default"
    assert (options.max_attempts, options.on_dead) == (None, "release")
    assert options.maxmemory_policy == "refuse"
    assert options.clock is None
    assert options.dedup_window == DEDUP_WINDOW


def test_the_dedup_window_comes_from_the_url_or_a_keyword() -> None:
    assert parse_url("redis://h?dedup_window=300", {}).dedup_window == 300.0
    assert parse_url("redis://h", {"dedup_window": 0.5}).dedup_window == 0.5


def test_our_options_leave_the_server_url_bare() -> None:
    options = parse_url(
        "rediss://app:s3cret@h:6390/1?queue=orders&max_attempts=5&on_dead=HOLD"
        "&socket_timeout=2.5&connect_timeout=1&maxmemory_policy=refuse",
        {},
    )
    assert options.server == "rediss://app:s3cret@h:6390/1"
    assert (options.queue, options.max_attempts, options.on_dead) == ("orders", 5, "hold")
    assert (options.socket_timeout, options.connect_timeout) == (2.5, 1.0)
    assert options.maxmemory_policy == "refuse"
    assert "s3cret" not in options.redacted
    assert "s3cret" not in repr(options)
    assert "server='rediss://app:***@h:6390/1', queue='orders'" in repr(options)


def test_unix_socket_takes_its_database_as_an_option() -> None:
    options = parse_url("unix:///run/redis/redis.sock?db=3&queue=q", {})
    assert (options.server, options.db, options.queue) == ("unix:///run/redis/redis.sock", 3, "q")


def test_keywords_are_typed_and_cannot_repeat_the_url() -> None:
    def clock() -> float:
        return 1.0

    options = parse_url("redis://h", {"queue": "q2", "max_attempts": 2, "clock": clock})
    assert (options.queue, options.max_attempts, options.clock) == ("q2", 2, clock)
    with pytest.raises(ValueError, match="both in the URL and as a keyword"):
        parse_url("redis://h?queue=a", {"queue": "b"})
    with pytest.raises(ValueError, match="clock"):
        parse_url("redis://h?clock=1", {})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h", "malformed Redis URL"),
        ("redis:/h", "malformed Redis URL"),
        ("redis://", "names no host"),
        ("redis://h:notaport", "malformed Redis URL"),
        ("redis://h/zero", "database number"),
        ("redis://h#frag", "fragment"),
        ("unix://", "socket path"),
        ("redis://h?nosuch=1", "nosuch"),
        ("redis://h?queue=a&queue=b", "given twice"),
        ("redis://h?queue=a{b}", "without braces"),
        ("redis://h?queue=", "queue must be"),
        ("redis://h?max_attempts=0", "max_attempts"),
        ("redis://h?on_dead=keep", "on_dead"),
        ("redis://h?socket_timeout=-1", "socket_timeout"),
        ("redis://h?socket_timeout=inf", "socket_timeout"),
        ("redis://h?maxmemory_policy=ignore", "maxmemory_policy"),
        ("redis://h?maxmemory_policy=warn", "no longer accepted"),
        ("redis://h?dedup_window=0", "dedup_window"),
        ("redis://h?dedup_window=nan", "dedup_window"),
        ("redis://h?db=1", "as its path"),
        ("rediss://h?ssl_ca_certs=/no/such.pem", "ssl_ca_certs must name a readable file"),
        ("rediss://h?ssl_cert_reqs=always", "ssl_cert_reqs must be"),
        ("rediss://h?ssl_check_hostname=yes", "ssl_check_hostname must be true or false"),
        ("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=true", "needs ssl_cert_reqs"),
        ("redis://h?ssl_cert_reqs=none", "need a rediss:// \\(TLS\\) URL"),
        ("unix:///s?ssl_cert_reqs=none", "need a rediss://"),
    ],
)
def test_bad_urls_are_named(url: str, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        parse_url(url, {})


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("redis://h", {"queue": 3}, "queue must be"),
        ("redis://h", {"max_attempts": True}, "max_attempts"),
        ("redis://h", {"clock": 5}, "clock"),
        ("redis://h", {"dedup_window": -1.0}, "dedup_window"),
        ("rediss://h", {"ssl_password": 5}, "ssl_password must be a string"),
    ],
)
def test_bad_keywords_are_named(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        parse_url(url, options)


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:hunter2@h?nosuch=1",
        "redis://:hunter2@h/notdb",
        "redis://user:hunter2@h#x",
        "redis://:hunter2@h?queue=a&queue=b",
        "rediss://h?queue=a&queue=b&ssl_password=hunter2",
    ],
)
def test_a_password_is_never_shown(url: str) -> None:
    with pytest.raises((ValueError, TypeError)) as caught:
        parse_url(url, {})
    assert "hunter2" not in str(caught.value)


def test_an_unreachable_server_is_a_clear_error_without_the_password() -> None:
    with pytest.raises(TransportError, match="cannot connect") as caught:
        open_transport("redis://:hunter2@127.0.0.1:1/0?connect_timeout=0.5")
    assert "hunter2" not in str(caught.value)
    assert "***" in str(caught.value)


@pytest.fixture
def http_port() -> Iterator[int]:
    """A real server that is not Redis (the standard library's HTTP server), on a free port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_server_that_is_not_redis_is_a_clear_error_on_both_twins(http_port: int) -> None:
    url = f"redis://:hunter2@127.0.0.1:{http_port}/0?queue=q"
    with pytest.raises(TransportError) as caught:
        open_transport(url)
    message = str(caught.value)
    assert f"redis://:***@127.0.0.1:{http_port}/0: what answered is not a Redis server" in message
    assert "hunter2" not in message
    assert not isinstance(caught.value, OutcomeUnknown)  # nothing was sent

    async def main() -> str:
        handle = open_async_transport(url)
        try:
            with pytest.raises(TransportError) as caught:
                await handle.claim("w", 5.0)
            return str(caught.value)
        finally:
            await handle.close()

    message = asyncio.run(main())
    assert "what answered is not a Redis server" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("writes", [True, False])
def test_a_garbled_reply_in_flight_is_a_lost_connection(writes: bool) -> None:
    expected = OutcomeUnknown if writes else TransportError
    with pytest.raises(expected) as caught, redis_errors("redis://h:6379/0", "ack", writes):
        raise rex.InvalidResponse('Protocol error, got "<" as reply type byte')
    assert type(caught.value) is expected
    assert "redis://h:6379/0" in str(caught.value)


def test_tls_options_reach_the_connections_only_on_rediss(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert, key):
        path.write_text("not read until a connection is made\n")
    options = parse_url(
        f"rediss://:pw@h:6390/0?ssl_ca_certs={ca}&ssl_certfile={cert}&ssl_keyfile={key}",
        {"ssl_password": "hunter2"},
    )
    assert options.tls == {
        "ssl_ca_certs": str(ca),
        "ssl_certfile": str(cert),
        "ssl_keyfile": str(key),
        "ssl_password": "hunter2",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
    }
    assert "hunter2" not in repr(options)
    bare = parse_url("rediss://h?ssl_cert_reqs=none", {})
    assert (bare.tls["ssl_cert_reqs"], bare.tls["ssl_check_hostname"]) == ("none", False)
    assert parse_url("redis://h", {}).tls == {}
    with pytest.raises(ValueError, match="ssl_keyfile needs ssl_certfile"):
        parse_url(f"rediss://h?ssl_keyfile={key}", {})
