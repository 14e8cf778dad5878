"""Where a queue lives when the URL names more than one server: the node of a Redis
Cluster that serves the queue's slot, or the primary that a set of Sentinels names (through
redis-py's `Sentinel`), for each twin.

A locator only finds the node; the runners send the calls themselves, on pools of their
own made from `RedisOptions.node_url`. For a cluster it asks one node after another for
``CLUSTER SLOTS`` on a short-lived connection, and reads the owner of the queue's slot
from the first answer. It does not use redis-py's cluster client: that client would send
a call again after a lost connection (a publish stored twice), and on its first refresh
it also fetches the command table from a primary of the map, which fails while that
primary is down even though the map was read. During a failover the map may still name
a dead primary: the runners then find it unreachable and ask again, as after any
failover. `locate` asks afresh each time it is called: when a handle opens, and again
when the node it uses cannot be reached or says it no longer serves the queue (MOVED,
READONLY). Imports redis.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel as asentinel
import redis.exceptions as rex
import redis.sentinel as sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from transports_core import TransportError

from ._url import Node, RedisOptions


def _client_kwargs(options: RedisOptions, retry: Any) -> dict[str, Any]:
    """Credentials and timeouts for the clients that only look the node up; ``retry``:
    the twin's Retry class. A lookup that fails moves on to the next node at once, rather
    than after redis-py's default retries with their back-off (seconds)."""
    netloc = options.server.partition("://")[2].partition("/")[0]
    userinfo = netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    kwargs: dict[str, Any] = {
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.connect_timeout,
        "decode_responses": True,
        "retry": retry(NoBackoff(), 0),
    }
    if user:
        kwargs["username"] = unquote(user)
    if password:
        kwargs["password"] = unquote(password)
    return kwargs


def _node_kwargs(options: RedisOptions, retry: Any) -> dict[str, Any]:
    """`_client_kwargs`, and TLS, for a connection to one cluster node."""
    tls = {"ssl": True, **options.tls} if options.tls else {}
    return _client_kwargs(options, retry) | tls


def _lost(options: RedisOptions, why: object) -> TransportError:
    what = (
        "no cluster node answered with the slot map"
        if options.topology == "cluster"
        else f"no Sentinel named a primary for service {options.service!r}"
    )
    return TransportError(f"{options.redacted}: {what} ({why}); nothing was done")


class SlotMap:
    """The cluster decisions of both twins' locators: which nodes to ask for the slot
    map, in which order, and what an answer says. The URL's seeds come first, then every
    node a map named (so a handle still finds the cluster once all its seeds are gone).
    The node that answered last is asked first, and one that failed goes last: a node that
    is cut off costs ``connect_timeout`` each time it is asked."""

    def __init__(self, options: RedisOptions) -> None:
        self._options = options
        self._slot = key_slot(f"dt:{{{options.queue}}}:seq".encode())
        self._nodes: list[Node] = list(dict.fromkeys(options.nodes))
        self._errors: list[str] = []

    def to_ask(self) -> list[Node]:
        self._errors = []
        return list(self._nodes)

    def failed(self, node: Node, exc: BaseException) -> None:
        self._errors.append(f"{_shown(node)}: {exc}")
        self._nodes.remove(node)
        self._nodes.append(node)

    def answered(self, node: Node, reply: Any) -> Node:
        """The primary that serves the queue's slot, by ``reply`` (``CLUSTER SLOTS``)
        from ``node``."""
        found: Node | None = None
        named: list[Node] = []
        for start, end, *servers in reply:
            here = [(str(host or node[0]), int(port)) for host, port, *_ in servers]
            named += here
            if int(start) <= self._slot <= int(end) and here:
                found = here[0]
        self._nodes = list(dict.fromkeys([node, *self._nodes, *named]))
        if found is None:
            raise TransportError(
                f"{self._options.redacted}: no node of the cluster serves slot {self._slot}"
                f" (queue {self._options.queue!r}), by {_shown(node)}'s slot map; nothing"
                " was done"
            )
        return found

    def lost(self) -> TransportError:
        return _lost(self._options, "; ".join(self._errors))


def _shown(node: Node) -> str:
    return f"[{node[0]}]:{node[1]}" if ":" in node[0] else f"{node[0]}:{node[1]}"


_NOT_REACHED = (rex.RedisError, OSError)


class Locator:
    """The sync twin's: `locate` blocks."""

    def __init__(self, options: RedisOptions) -> None:
        self._options = options
        self._map = SlotMap(options) if options.topology == "cluster" else None
        self._sentinel: sentinel.Sentinel | None = None
        # The threads of one handle may all look at once after a failover: one asks.
        self._lock = threading.Lock()

    def locate(self) -> Node:
        with self._lock:
            if self._map is None:
                return self._primary()
            for node in self._map.to_ask():
                try:
                    with redis.Redis(
                        node[0], node[1], **_node_kwargs(self._options, Retry)
                    ) as client:
                        reply = client.execute_command("CLUSTER SLOTS")
                except _NOT_REACHED as exc:
                    self._map.failed(node, exc)
                else:
                    return self._map.answered(node, reply)
            raise self._map.lost()

    def _primary(self) -> Node:
        opts = self._options
        try:
            if self._sentinel is None:
                self._sentinel = sentinel.Sentinel(
                    list(opts.nodes), sentinel_kwargs=_client_kwargs(opts, Retry) | {
                        "username": None, "password": None,
                    }
                )  # fmt: skip
            host, port = self._sentinel.discover_master(opts.service or "")
            return (str(host), int(port))
        except _NOT_REACHED as exc:
            raise _lost(opts, exc) from exc

    def close(self) -> None:
        if self._sentinel is not None:
            for client in self._sentinel.sentinels:
                client.close()


class AsyncLocator:
    """The async twin's: `locate` awaits."""

    def __init__(self, options: RedisOptions) -> None:
        self._options = options
        self._map = SlotMap(options) if options.topology == "cluster" else None
        self._sentinel: asentinel.Sentinel | None = None
        self._lock = asyncio.Lock()

    async def locate(self) -> Node:
        async with self._lock:
            if self._map is None:
                return await self._primary()
            for node in self._map.to_ask():
                try:
                    client = redis.asyncio.Redis(
                        host=node[0], port=node[1], **_node_kwargs(self._options, AsyncRetry)
                    )
                    async with client:
                        reply = await client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
                except _NOT_REACHED as exc:
                    self._map.failed(node, exc)
                else:
                    return self._map.answered(node, reply)
            raise self._map.lost()

    async def _primary(self) -> Node:
        opts = self._options
        try:
            if self._sentinel is None:
                self._sentinel = asentinel.Sentinel(
                    list(opts.nodes), sentinel_kwargs=_client_kwargs(opts, AsyncRetry) | {
                        "username": None, "password": None,
                    }
                )  # fmt: skip
            host, port = await self._sentinel.discover_master(opts.service or "")
            return (str(host), int(port))
        except _NOT_REACHED as exc:
            raise _lost(opts, exc) from exc

    async def close(self) -> None:
        if self._sentinel is not None:
            for client in self._sentinel.sentinels:
                await client.aclose()
