"""Translating redis-py errors into `TransportError`s that name the server (never its
password), used by both runners.

    redis.ConnectionError / TimeoutError while connecting   -> TransportError (nothing sent)
    redis.ConnectionError / TimeoutError once a write was sent
                                                            -> OutcomeUnknown
    the same during a read                                  -> TransportError
    redis.ResponseError (OOM, READONLY, MOVED, script error) -> TransportError

NOSCRIPT and MOVED are not translated: the runners load the script, or follow the queue's
slot to the cluster node named, and send the call once more (neither ran it). Retries
are off in the pools the runners build, so nothing is ever sent twice behind the
caller's back. Imports redis only for its exception classes (redis.asyncio raises the
same ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis.exceptions as rex

from transports_core import OutcomeUnknown, TransportError


@contextmanager
def connecting(server: str) -> Iterator[None]:
    """Opening a connection: whatever fails, nothing reached the server."""
    try:
        yield
    except rex.AuthenticationError as exc:
        raise TransportError(f"{server}: the server refused the credentials ({exc})") from exc
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        raise TransportError(f"{server}: cannot connect ({exc})") from exc


@contextmanager
def redis_errors(server: str, operation: str, writes: bool) -> Iterator[None]:
    """A call in flight: a broken connection leaves a write's outcome unknown."""
    try:
        yield
    except (rex.NoScriptError, rex.MovedError):
        raise
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        if writes:
            raise OutcomeUnknown(operation, f"{server}: {exc}") from exc
        raise TransportError(f"{server}: {operation}: the connection was lost ({exc})") from exc
    except rex.ResponseError as exc:
        text = str(exc)
        if isinstance(exc, rex.OutOfMemoryError) or text.startswith("OOM"):
            why = "the server is out of memory (maxmemory reached; nothing was written)"
        elif text.startswith("READONLY"):
            why = "the server is a read-only replica; connect to the primary"
        elif text.startswith("ASK"):
            why = "the queue's slot is migrating between cluster nodes; try again"
        else:
            why = "the server refused the call"
        raise TransportError(f"{server}: {operation}: {why} ({text})") from exc
