"""The Redis backend: a durable queue on a Redis server, one Lua script per operation.

Registered under the URL schemes ``redis``, ``rediss`` (TLS), ``unix``,
``redis+cluster``/``rediss+cluster`` (Redis Cluster) and ``redis+sentinel``, sync and
async (``redis://localhost:6379/0?queue=orders``). See docs/redis.md."""

from __future__ import annotations

from transports_core.backend import FEATURES as _FEATURES
from transports_core.backend import build_backend

from . import _url
from ._async import AsyncRedisTransport
from ._sync import RedisTransport
from ._url import RedisOptions

__all__ = ["AsyncRedisTransport", "RedisOptions", "RedisTransport", "backend"]


backend = build_backend(_url.parse_url, RedisTransport, AsyncRedisTransport, features=_FEATURES)
