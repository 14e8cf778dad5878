"""Redis URLs and options -> `RedisOptions`, through one typed whitelist.

``redis://[[user]:password@]host[:port][/db]?queue=NAME&...``, ``rediss://`` (TLS) or
``unix:///path/to/socket?db=N&queue=NAME``. Options come from the URL query (strings,
coerced here) or keyword arguments (typed values, checked here), one place each; the
connection part is handed to redis-py without its query. Imports no driver.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, cast
from urllib.parse import parse_qsl, urlsplit

from transports_core.backend import check_max_attempts, check_on_dead, redact_url

URL_FORMS = (
    "redis://[[user]:password@]host[:port][/db]?queue=NAME, rediss://... (TLS) "
    "or unix:///path/to/redis.sock?db=N&queue=NAME"
)
SCHEMES = ("redis", "rediss", "unix")
MaxmemoryCheck = Literal["refuse", "warn"]
OnDead = Literal["release", "hold"]


@dataclass(frozen=True)
class RedisOptions:
    """Everything a Redis transport is opened with.

    ``server``: the connection URL without its query (it may hold a password: never
    shown; see `redacted`). ``db``: the database number of a ``unix://`` URL.
    ``queue``: the queue's name; its keys all start with ``dt:{queue}:``.
    ``socket_timeout`` / ``connect_timeout``: seconds before a silent server is given up
    on (a call then raises `OutcomeUnknown`).
    ``max_attempts`` / ``on_dead``: the dead-letter policy (see `TransportAdmin`).
    ``maxmemory_policy``: ``refuse`` (default) to open a server whose maxmemory-policy
    may evict keys, or ``warn`` to open it with a warning.
    ``clock``: seconds since the epoch, for tests (keyword only); None (default): every
    script reads the server's TIME.
    """

    server: str
    queue: str = "default"
    db: int | None = None
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    max_attempts: int | None = None
    on_dead: OnDead = "release"
    maxmemory_policy: MaxmemoryCheck = "refuse"
    clock: Callable[[], float] | None = None

    @property
    def redacted(self) -> str:
        return redact_url(self.server)


def _queue(value: object) -> str:
    # A brace would end the hash tag early and spread the queue over cluster slots.
    if (
        not isinstance(value, str)
        or not value
        or len(value) > 200
        or any(c in value for c in "{}")
        or not value.isprintable()
    ):
        raise ValueError(
            "queue must be a non-empty printable name of at most 200 characters without "
            f"braces, got {value!r}"
        )
    return value


def _seconds(name: str) -> Callable[[object], float]:
    def check(value: object) -> float:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        return float(value)

    return check


def _db(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"db must be a database number >= 0, got {value!r}")
    return value


def _maxmemory(value: object) -> MaxmemoryCheck:
    if value == "refuse" or value == "warn":
        return value
    raise ValueError(f"maxmemory_policy must be refuse or warn, got {value!r}")


def _on_dead(value: object) -> OnDead:
    return cast(OnDead, check_on_dead(value))


def _clock(value: object) -> Callable[[], float]:
    if not callable(value):
        raise TypeError(f"clock must be a callable returning epoch seconds, got {value!r}")
    return cast(Callable[[], float], value)


_FROM_URL: dict[str, Callable[[object], object]] = {
    "queue": _queue,
    "db": _db,
    "socket_timeout": _seconds("socket_timeout"),
    "connect_timeout": _seconds("connect_timeout"),
    "max_attempts": check_max_attempts,
    "on_dead": _on_dead,
    "maxmemory_policy": _maxmemory,
}
_FROM_KWARGS: dict[str, Callable[[object], object]] = {**_FROM_URL, "clock": _clock}


def parse_url(url: str, options: Mapping[str, object]) -> RedisOptions:
    """Check ``url`` and ``options`` and return the options to open with."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"malformed Redis URL {shown!r} ({exc}); use {URL_FORMS}") from None
    if parts.scheme not in SCHEMES or not url.startswith(f"{parts.scheme}://"):
        raise ValueError(f"malformed Redis URL {shown!r}; use {URL_FORMS}")
    if parts.fragment:
        raise ValueError(f"Redis URL {shown!r} has a fragment (#...); use {URL_FORMS}")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise ValueError(f"Redis URL {shown!r} names no socket path; use {URL_FORMS}")
    else:
        if not parts.hostname:
            raise ValueError(f"Redis URL {shown!r} names no host; use {URL_FORMS}")
        if port == 0:
            raise ValueError(f"Redis URL {shown!r} has port 0; use {URL_FORMS}")
        path = parts.path.strip("/")
        if path and not (path.isascii() and path.isdigit()):
            raise ValueError(
                f"Redis URL {shown!r}: the path must be a database number, got {path!r}"
            )

    chosen: dict[str, object] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _FROM_URL:
            raise ValueError(_unknown(key, _FROM_URL))
        if key in chosen:
            raise ValueError(f"Redis option {key!r} is given twice in {shown!r}")
        chosen[key] = _FROM_URL[key](value)
    for key, given in options.items():
        if key not in _FROM_KWARGS:
            raise ValueError(_unknown(key, _FROM_KWARGS))
        if key in chosen:
            raise ValueError(f"Redis option {key!r} is given both in the URL and as a keyword")
        chosen[key] = _FROM_KWARGS[key](given)
    if "db" in chosen and parts.scheme != "unix":
        raise ValueError(f"Redis URL {shown!r}: give the database as its path (/N), not db=")
    server = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return RedisOptions(server=server, **chosen)  # type: ignore[arg-type]


def _unknown(key: str, known: Mapping[str, object]) -> str:
    return f"unknown Redis option {key!r}; known options: {', '.join(sorted(known))}"
