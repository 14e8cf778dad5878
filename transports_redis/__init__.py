"""The Redis backend: a durable queue on a Redis server, one Lua script per operation.

Registered under the URL schemes ``redis``, ``rediss`` (TLS) and ``unix``, sync and async
(``redis://localhost:6379/0?queue=orders``). See docs/redis.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transports_core import Backend

from . import _url
from ._async import AsyncRedisTransport
from ._sync import RedisTransport
from ._url import RedisOptions

__all__ = ["AsyncRedisTransport", "RedisOptions", "RedisTransport", "backend"]


def _open(url: str, event_type: object, options: Mapping[str, object]) -> RedisTransport[Any]:
    return RedisTransport(_url.parse_url(url, options), event_type)


def _open_async(
    url: str, event_type: object, options: Mapping[str, object]
) -> AsyncRedisTransport[Any]:
    return AsyncRedisTransport(_url.parse_url(url, options), event_type)


backend = Backend(open=_open, open_async=_open_async)
