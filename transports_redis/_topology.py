"""Where a queue lives when the URL names more than one server: the node of a Redis
Cluster that serves the queue's slot (through redis-py's `RedisCluster`), or the primary
that a set of Sentinels names (through redis-py's `Sentinel`), for each twin.

A locator only finds the node; the runners send the calls themselves, on pools of their
own made from `RedisOptions.node_url`. redis-py's cluster client would send a call again
after a lost connection (its ``cluster_error_retry_attempts``): a publish stored twice,
an ack that then fails. So it is asked nothing but the slot map, and the Sentinel
nothing but the primary's address. `locate` asks afresh each time it is called: the
runners call it when they open, and again when the node they use cannot be reached or
says it no longer serves the queue (MOVED, READONLY), a failover. Imports redis.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import unquote

import redis.asyncio.cluster as acluster
import redis.asyncio.sentinel as asentinel
import redis.cluster as cluster
import redis.exceptions as rex
import redis.sentinel as sentinel
from redis.crc import key_slot

from transports_core import TransportError

from ._url import Node, RedisOptions


def _client_kwargs(options: RedisOptions) -> dict[str, Any]:
    """Credentials, timeouts and TLS for the clients that only look the node up."""
    netloc = options.server.partition("://")[2].partition("/")[0]
    userinfo = netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    kwargs: dict[str, Any] = {
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.connect_timeout,
        "decode_responses": True,
    }
    if user:
        kwargs["username"] = unquote(user)
    if password:
        kwargs["password"] = unquote(password)
    return kwargs


def _slot_key(options: RedisOptions) -> bytes:
    return f"dt:{{{options.queue}}}:seq".encode()


def _lost(options: RedisOptions, exc: BaseException) -> TransportError:
    what = (
        "none of the cluster's seed nodes answered with its slot map"
        if options.topology == "cluster"
        else f"no Sentinel named a primary for service {options.service!r}"
    )
    return TransportError(f"{options.redacted}: {what} ({exc}); nothing was done")


class Locator:
    """The sync twin's: `locate` blocks."""

    def __init__(self, options: RedisOptions) -> None:
        self._options = options
        self._cluster: cluster.RedisCluster | None = None
        self._sentinel: sentinel.Sentinel | None = None
        # The threads of one handle may all look at once after a failover: one asks.
        self._lock = threading.Lock()

    def locate(self) -> Node:
        with self._lock:
            return self._locate()

    def _locate(self) -> Node:
        opts = self._options
        try:
            if opts.topology == "sentinel":
                if self._sentinel is None:
                    self._sentinel = sentinel.Sentinel(
                        list(opts.nodes), sentinel_kwargs=_client_kwargs(opts) | {
                            "username": None, "password": None,
                        }
                    )  # fmt: skip
                host, port = self._sentinel.discover_master(opts.service or "")
                return (str(host), int(port))
            if self._cluster is None:
                # Builds the slot map from the first seed that answers.
                self._cluster = cluster.RedisCluster(
                    startup_nodes=[cluster.ClusterNode(h, p) for h, p in opts.nodes],  # type: ignore[no-untyped-call]
                    require_full_coverage=False,
                    **_client_kwargs(opts),
                    **({"ssl": True, **opts.tls} if opts.tls else {}),
                )
            else:
                self._cluster.nodes_manager.initialize()
            slot = key_slot(_slot_key(opts))
            node = self._cluster.nodes_manager.get_node_from_slot(slot)
            return (str(node.host), int(node.port))
        except (rex.RedisError, OSError) as exc:
            raise _lost(opts, exc) from exc

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
        if self._sentinel is not None:
            for client in self._sentinel.sentinels:
                client.close()


class AsyncLocator:
    """The async twin's: `locate` awaits."""

    def __init__(self, options: RedisOptions) -> None:
        self._options = options
        self._cluster: acluster.RedisCluster | None = None
        self._sentinel: asentinel.Sentinel | None = None
        self._lock = asyncio.Lock()

    async def locate(self) -> Node:
        async with self._lock:
            return await self._locate()

    async def _locate(self) -> Node:
        opts = self._options
        try:
            if opts.topology == "sentinel":
                if self._sentinel is None:
                    self._sentinel = asentinel.Sentinel(
                        list(opts.nodes), sentinel_kwargs=_client_kwargs(opts) | {
                            "username": None, "password": None,
                        }
                    )  # fmt: skip
                host, port = await self._sentinel.discover_master(opts.service or "")
                return (str(host), int(port))
            if self._cluster is None:
                self._cluster = acluster.RedisCluster(
                    startup_nodes=[acluster.ClusterNode(h, p) for h, p in opts.nodes],
                    require_full_coverage=False,
                    **_client_kwargs(opts),
                    **({"ssl": True, **opts.tls} if opts.tls else {}),
                )
                await self._cluster.initialize()
            else:
                await self._cluster.nodes_manager.initialize()
            slot = key_slot(_slot_key(opts))
            node = self._cluster.nodes_manager.get_node_from_slot(slot)
            return (str(node.host), int(node.port))
        except (rex.RedisError, OSError) as exc:
            raise _lost(opts, exc) from exc

    async def close(self) -> None:
        if self._cluster is not None:
            await self._cluster.aclose()
        if self._sentinel is not None:
            for client in self._sentinel.sentinels:
                await client.aclose()
