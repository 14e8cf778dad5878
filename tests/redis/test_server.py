"""What a private server lets us do to the backend: kill its connection mid-call, flush its
scripts, and set an evicting maxmemory-policy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

import pytest
import redis

from transports_core import (
    Event,
    OutcomeUnknown,
    Transport,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_redis import RedisTransport
from transports_redis import _scripts as scripts
from transports_redis._sync import FRESH

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


def _clients(raw: redis.Redis) -> int:
    """The server's connections, but for ``raw``'s own."""
    return len(raw.client_list()) - 1


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_call() -> None:
    # The handle keeps its idle connection for the next call: that call must not find
    # out by sending on a dead socket, which would leave its outcome unknown. (Within
    # FRESH of its last call a connection is used unchecked, as docs/redis.md says.)
    with private_server() as server:
        raw = redis.Redis(port=server.port)
        with open_transport(with_queue(server.url, "idle")) as transport:
            first = transport.publish("g", Event(n=1))
            assert _clients(raw) == 1
            raw.client_kill_filter(_type="normal", skipme=True)  # as `timeout` does
            time.sleep(FRESH * 2)  # idle for longer than a connection used as it is
            assert transport.publish("g", Event(n=2)) == first + 1
            lease = transport.claim("w", 5)
            assert lease is not None
            transport.ack(lease)
            assert_sound(transport)
        assert _clients(raw) == 0  # closing dropped the idle connection too
        raw.close()


def test_the_async_twin_replaces_a_closed_idle_connection_and_leaks_none() -> None:
    async def main(url: str, raw: redis.Redis) -> None:
        transport = open_async_transport(url)
        first = await transport.publish("g", Event(n=1))
        raw.client_kill_filter(_type="normal", skipme=True)
        await asyncio.sleep(FRESH * 2)  # the loop reads the close meanwhile
        assert await transport.publish("g", Event(n=2)) == first + 1
        # Calls cancelled at every point of their flight leave no connection open once
        # the handle closes.
        for delay in (0, 0.0001, 0.0003, 0.001, 0.002):
            call = asyncio.ensure_future(transport.publish("g", Event(n=3)))
            await asyncio.sleep(delay)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, TransportError):
                await call
        await transport.close()

    with private_server() as server:
        raw = redis.Redis(port=server.port)
        asyncio.run(main(with_queue(server.url, "aidle"), raw))
        assert _clients(raw) == 0
        raw.close()


def test_a_forked_child_does_not_share_its_parent_s_idle_connection() -> None:
    with private_server() as server:
        raw = redis.Redis(port=server.port)
        with open_transport(with_queue(server.url, "fork")) as transport:
            transport.publish("g", Event(n=1))  # leaves a connection idle
            before = raw.info("stats")["total_connections_received"]
            pid = os.fork()
            if pid == 0:  # the child: one call on the inherited handle, then out
                code = 1
                try:
                    transport.publish("g", Event(n=2))
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            # The child connected afresh: the two processes never write to one socket.
            assert raw.info("stats")["total_connections_received"] == before + 1
            assert transport.publish("g", Event(n=3)) == 3
            events = []
            while (lease := transport.claim("w", 5)) is not None:
                events.append(lease.event.n)
                transport.ack(lease)
            assert events == [1, 2, 3]
            assert_sound(transport)
        raw.close()


def test_a_flushed_function_library_is_loaded_again() -> None:
    with private_server() as server:
        raw = redis.Redis(port=server.port)
        with open_transport(with_queue(server.url, "flush")) as transport:
            transport.publish("g", Event(n=1))
            listed = [dict(zip(x[::2], x[1::2], strict=True)) for x in raw.function_list()]
            assert [x[b"library_name"] for x in listed] == [scripts.LIBRARY.name.encode()]
            raw.function_flush()
            assert transport.publish("g", Event(n=2)) == 2
            lease = transport.claim("w", 5)
            assert lease is not None
            assert lease.event.n == 1
            assert_sound(transport)
            assert raw.info("commandstats").get("cmdstat_evalsha") is None
        raw.close()


def test_a_server_that_refuses_functions_is_sent_scripts() -> None:
    """An ACL user who may not load functions: the handle's calls go as EVALSHA, whose
    flushed script cache is loaded again too."""
    with private_server() as server:
        raw = redis.Redis(port=server.port)
        raw.acl_setuser(
            "worker", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
            commands=["+@all", "-function"],
        )  # fmt: skip
        url = with_queue(f"redis://worker:secret@127.0.0.1:{server.port}/0", "refused")
        with open_transport(url) as transport:
            transport.publish("g", Event(n=1))
            raw.script_flush()
            assert transport.publish("g", Event(n=2)) == 2
            lease = transport.claim("w", 5)
            assert lease is not None
            assert lease.event.n == 1
            assert_sound(transport)

        async def the_async_twin() -> int:
            async with open_async_transport(url) as queue:
                return await queue.publish("g", Event(n=3))

        assert asyncio.run(the_async_twin()) == 3
        assert raw.function_list() == []
        stats = raw.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] >= 4
        # Each handle tried FCALL once (not found), and the load was refused.
        assert stats["cmdstat_fcall"]["calls"] == 2
        assert stats["cmdstat_function|load"]["rejected_calls"] == 2
        raw.close()


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


def test_calls_on_more_queues_than_a_function_keeps_keys_for_stay_on_their_queue() -> None:
    """A function keeps the key tables of the last `KNOWN` queues it served: calls that
    go round more queues than that, and come back, each touch their own queue's keys."""
    with private_server() as server:
        count = scripts.KNOWN + 2
        queues = [open_transport(with_queue(server.url, f"q{i}")) for i in range(count)]
        try:
            for _ in range(2):
                for i, queue in enumerate(queues):
                    queue.publish(f"g{i}", Event(n=i))
            for _ in range(2):
                for i, queue in enumerate(queues):
                    lease = queue.claim("w", 5)
                    assert lease is not None
                    assert (lease.group_id, lease.event.n) == (f"g{i}", i)
                    queue.ack(lease)
            for queue in queues:
                assert queue.claim("w", 5) is None
                assert_sound(queue)
        finally:
            for queue in queues:
                queue.close()
