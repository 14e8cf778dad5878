"""The SQLite backend: a durable queue in one file, safe across threads and processes.

Registered under the URL scheme ``sqlite`` (``sqlite:///queue.db``), sync and async."""

from __future__ import annotations

from transports_core.backend import build_backend

from . import _sync, _url
from ._async import AsyncSqliteTransport
from ._sync import SqliteTransport, migrate
from ._url import SqliteOptions

__all__ = ["AsyncSqliteTransport", "SqliteOptions", "SqliteTransport", "backend", "migrate"]


backend = build_backend(
    _url.parse_url,
    SqliteTransport,
    AsyncSqliteTransport,
    features=("timers", "tenants", "group-control"),
    migrate=_sync.run_migration,
)
