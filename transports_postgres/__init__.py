"""The PostgreSQL backend: one schema is one queue, shared by any number of processes on
any number of hosts, with claims on different groups running in parallel.

Registered under the URL schemes ``postgresql`` and ``postgres``, sync and async."""

from __future__ import annotations

from transports_core.backend import FEATURES as _FEATURES
from transports_core.backend import build_backend

from . import _sync, _url
from ._async import AsyncPostgresTransport
from ._sync import PostgresTransport, migrate
from ._url import PostgresOptions

__all__ = [
    "AsyncPostgresTransport",
    "PostgresOptions",
    "PostgresTransport",
    "backend",
    "migrate",
]


backend = build_backend(
    _url.parse_url,
    PostgresTransport,
    AsyncPostgresTransport,
    features=_FEATURES,
    migrate=_sync.run_migration,
)
