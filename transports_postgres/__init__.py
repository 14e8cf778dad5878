"""The PostgreSQL backend: one schema is one queue, shared by any number of processes on
any number of hosts, with claims on different groups running in parallel.

Registered under the URL schemes ``postgresql`` and ``postgres``, sync and async."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transports_core import Backend

from . import _url
from ._async import AsyncPostgresTransport
from ._sync import PostgresTransport
from ._url import PostgresOptions

__all__ = ["AsyncPostgresTransport", "PostgresOptions", "PostgresTransport", "backend"]


def _open(url: str, event_type: object, options: Mapping[str, object]) -> PostgresTransport[Any]:
    return PostgresTransport(_url.parse_url(url, options), event_type)


def _open_async(
    url: str, event_type: object, options: Mapping[str, object]
) -> AsyncPostgresTransport[Any]:
    return AsyncPostgresTransport(_url.parse_url(url, options), event_type)


backend = Backend(open=_open, open_async=_open_async)
