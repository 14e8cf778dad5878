"""What a private server lets us do to the backend: kill its connection mid-call, flush its
scripts, and set an evicting maxmemory-policy."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from transports_core import Event, OutcomeUnknown, Transport, TransportError, open_transport
from transports_redis import RedisTransport

from .server import private_server, with_queue


def assert_sound(transport: Transport[Event]) -> None:
    """The invariant check the shared server's queues get after each test, here on a
    private server's queue before it goes."""
    assert isinstance(transport, RedisTransport)
    assert transport.check() == []


def test_a_connection_killed_mid_call_is_outcome_unknown_and_the_next_call_reconnects() -> None:
    with private_server() as server:
        url = with_queue(server.url, "kill")
        raw = redis.Redis(port=server.port)
        with open_transport(url) as transport:
            transport.publish("g", Event(n=0))  # connected, scripts loaded
            # Writes wait while the server is paused; kill our call's connection meanwhile.
            raw.client_pause(5000, all=False)
            errors: list[BaseException] = []

            def publish() -> None:
                try:
                    transport.publish("g", Event(n=1))
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=publish)
            thread.start()
            deadline = time.monotonic() + 10
            while not any(
                "b" in c.get("flags", "") for c in raw.client_list()
            ):  # held by the pause
                assert time.monotonic() < deadline
                time.sleep(0.01)
            raw.client_kill_filter(_type="normal", skipme=True)
            thread.join(10)
            raw.client_unpause()
            assert len(errors) == 1
            assert isinstance(errors[0], OutcomeUnknown)
            assert errors[0].operation == "publish"
            assert transport.publish("g", Event(n=2)) >= 2  # a fresh connection
            assert_sound(transport)
        raw.close()


def test_a_flushed_script_cache_is_loaded_again() -> None:
    with private_server() as server:
        raw = redis.Redis(port=server.port)
        with open_transport(with_queue(server.url, "flush")) as transport:
            transport.publish("g", Event(n=1))
            raw.script_flush()
            assert transport.publish("g", Event(n=2)) == 2
            lease = transport.claim("w", 5)
            assert lease is not None
            assert lease.event.n == 1
            assert_sound(transport)
        raw.close()


def test_an_evicting_maxmemory_policy_is_refused_or_warned_about() -> None:
    with private_server("--maxmemory-policy", "allkeys-lru") as server:
        with pytest.raises(TransportError, match="maxmemory-policy is 'allkeys-lru'"):
            open_transport(with_queue(server.url, "lru"))
        with pytest.warns(RuntimeWarning, match="allkeys-lru"):
            transport = open_transport(with_queue(server.url, "lru"), maxmemory_policy="warn")
        transport.close()


def test_a_full_server_refuses_publishes_but_workers_still_drain_it() -> None:
    with private_server("--maxmemory-policy", "noeviction") as server:
        raw = redis.Redis(port=server.port)
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory", used + 2_000_000)
        with open_transport(with_queue(server.url, "full")) as transport:
            big = "x" * 10_000
            with pytest.raises(TransportError, match="out of memory"):  # noqa: PT012
                for n in range(1000):
                    transport.publish(f"g{n % 7}", Event(n=n, pad=big))
            assert transport.stats().ready > 0  # type: ignore[attr-defined]
            drained = 0
            while (lease := transport.claim("w", 30)) is not None:
                transport.ack(lease)  # claims and acks run even at the limit
                drained += 1
            assert drained > 50
            assert transport.publish("g", Event(n=-1)) > 0  # the memory came back
            assert_sound(transport)  # a refused publish wrote nothing, not even a counter
        raw.close()


def test_a_unix_socket_url_reaches_the_server(tmp_path_factory: pytest.TempPathFactory) -> None:
    socket_path = tmp_path_factory.mktemp("sock") / "redis.sock"
    with private_server("--unixsocket", str(socket_path), "--unixsocketperm", "700") as server:
        with open_transport(f"unix://{socket_path}?db=2&queue=sock") as transport:
            seq = transport.publish("g", Event(n=1))
            lease = transport.claim("w", 5)
            assert lease is not None
            assert lease.seq == seq
            transport.ack(lease)
            assert_sound(transport)
        raw = redis.Redis(port=server.port, db=2)
        assert raw.get("dt:{sock}:seq") == b"1"  # in database 2, as the URL asked
        raw.close()
