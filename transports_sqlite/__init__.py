"""The SQLite backend: a durable queue in one file, safe across threads and processes.

Registered under the URL scheme ``sqlite`` (``sqlite:///queue.db``), sync and async."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transports_core import Backend

from . import _url
from ._async import AsyncSqliteTransport
from ._sync import SqliteTransport
from ._url import SqliteOptions

__all__ = ["AsyncSqliteTransport", "SqliteOptions", "SqliteTransport", "backend"]


def _open(url: str, event_type: object, options: Mapping[str, object]) -> SqliteTransport[Any]:
    return SqliteTransport(_url.parse_url(url, options), event_type)


def _open_async(
    url: str, event_type: object, options: Mapping[str, object]
) -> AsyncSqliteTransport[Any]:
    return AsyncSqliteTransport(_url.parse_url(url, options), event_type)


backend = Backend(open=_open, open_async=_open_async)
