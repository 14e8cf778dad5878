"""A server whose maxmemory-policy may evict the queue's keys is refused at open, sync and
async, whatever the options say; one that evicts only keys with a TTL (none of the queue's
state has one) is opened, and at its memory limit refuses writes as ``noeviction`` does.
Each runs on a private server (see `server`)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from transports_core import Event, TransportError, open_async_transport, open_transport
from transports_redis import RedisTransport

from .server import private_server, with_queue


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_server_that_may_evict_any_key_is_refused(policy: str) -> None:
    with private_server("--maxmemory-policy", policy) as server:
        url = with_queue(server.url, "evict")
        with pytest.raises(TransportError, match=f"maxmemory-policy is '{policy}'"):
            open_transport(url)

        async def open_async() -> None:
            async with open_async_transport(url):
                pass

        with pytest.raises(TransportError, match="set maxmemory-policy noeviction"):
            asyncio.run(open_async())
        with pytest.raises(ValueError, match="maxmemory_policy=warn is no longer accepted"):
            open_transport(url, maxmemory_policy="warn")
        raw = redis.Redis(port=server.port)
        assert raw.keys("dt:*") == []  # refused before anything was written
        raw.close()


def test_a_policy_changed_to_evict_any_key_is_refused_at_the_next_open() -> None:
    with private_server("--maxmemory-policy", "noeviction") as server:
        url = with_queue(server.url, "evict")
        with open_transport(url) as transport:
            transport.publish("g", Event(n=1))
        raw = redis.Redis(port=server.port)
        raw.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(TransportError, match="allkeys-lru"):
            open_transport(url)
        raw.close()


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl"])
def test_a_server_that_evicts_only_keys_with_a_ttl_keeps_the_queue_whole(policy: str) -> None:
    with private_server("--maxmemory-policy", policy) as server:
        raw = redis.Redis(port=server.port)
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory", used + 2_000_000)
        raw.set("scratch", "x" * 1000, ex=3600)  # a key the server may evict
        with open_transport(with_queue(server.url, "evict")) as transport:
            assert isinstance(transport, RedisTransport)
            big = "x" * 10_000
            published = 0
            with pytest.raises(TransportError, match="out of memory"):  # noqa: PT012
                for n in range(1000):
                    transport.publish(f"g{n % 7}", Event(n=n, pad=big))
                    published += 1
            assert raw.exists("scratch") == 0  # the server did evict what it could
            assert transport.stats().ready == published  # and none of the queue
            assert transport.check() == []
            seen = 0
            while (lease := transport.claim("w", 30)) is not None:
                transport.ack(lease)
                seen += 1
            assert seen == published
        raw.close()
