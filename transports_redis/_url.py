"""Redis URLs and options -> `RedisOptions`, through one typed whitelist.

``redis://[[user]:password@]host[:port][/db]?queue=NAME&...``, ``rediss://`` (TLS) or
``unix:///path/to/socket?db=N&queue=NAME``. Options come from the URL query (strings,
coerced here) or keyword arguments (typed values, checked here), one place each; the
connection part is handed to redis-py without its query. Imports no driver.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, urlsplit

from transports_core import backend as core

URL_FORMS = (
    "redis://[[user]:password@]host[:port][/db]?queue=NAME, rediss://... (TLS) "
    "or unix:///path/to/redis.sock?db=N&queue=NAME"
)
SCHEMES = ("redis", "rediss", "unix")
MaxmemoryCheck = Literal["refuse"]
OnDead = Literal["release", "hold"]
CertReqs = Literal["required", "optional", "none"]


@dataclass(frozen=True)
class RedisOptions:
    """Everything a Redis transport is opened with.

    ``server``: the connection URL without its query (it may hold a password: never
    shown; see `redacted`). ``db``: the database number of a ``unix://`` URL.
    ``queue``: the queue's name; its keys all start with ``dt:{queue}:``.
    ``socket_timeout`` / ``connect_timeout``: seconds before a silent server is given up
    on (a call then raises `OutcomeUnknown`).
    ``max_attempts`` / ``on_dead``: the dead-letter policy (see `TransportAdmin`).
    ``maxmemory_policy``: ``refuse``, the only value: a server whose maxmemory-policy may
    evict the queue's keys is refused (``warn``, which opened one, is refused itself).
    ``dedup_window``: seconds a publish's idempotency key is remembered (default a day);
    each key costs memory for that long (see docs/redis.md).
    ``clock``: seconds since the epoch, for tests (keyword only); None (default): every
    script reads the server's TIME.
    ``ssl_*``: TLS, for ``rediss://`` only: ``ssl_ca_certs`` the CA file (PEM) the
    server's certificate must chain to (None: the system's CAs); ``ssl_certfile`` and
    ``ssl_keyfile`` the client's certificate and key, for a server that asks for one;
    ``ssl_password`` the key's passphrase (keyword only, never shown); ``ssl_cert_reqs``
    ``required`` (default), ``optional`` or ``none`` (no check of the server at all);
    ``ssl_check_hostname`` whether the certificate must name the URL's host (default:
    unless ``ssl_cert_reqs`` is ``none``).
    """

    server: str = field(repr=False)  # shown redacted: see `__repr__`
    queue: str = "default"
    db: int | None = None
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    max_attempts: int | None = None
    on_dead: OnDead = "release"
    maxmemory_policy: MaxmemoryCheck = "refuse"
    dedup_window: float = core.DEDUP_WINDOW
    clock: Callable[[], float] | None = None
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_cert_reqs: CertReqs = "required"
    ssl_check_hostname: bool | None = None

    def __repr__(self) -> str:
        shown = (f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}(server={self.redacted!r}, {', '.join(shown)})"

    @functools.cached_property
    def redacted(self) -> str:
        """`server` with any password masked: worked out once, as every call names it."""
        return core.redact_url(self.server)

    @property
    def tls(self) -> dict[str, Any]:
        """The TLS settings for redis-py's connections (none for a plain connection)."""
        if not self.server.startswith("rediss://"):
            return {}
        check = self.ssl_check_hostname
        return {
            "ssl_ca_certs": self.ssl_ca_certs,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": self.ssl_password,
            "ssl_cert_reqs": self.ssl_cert_reqs,
            "ssl_check_hostname": self.ssl_cert_reqs != "none" if check is None else check,
        }


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


def _db(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"db must be a database number >= 0, got {value!r}")
    return value


def _maxmemory(value: object) -> MaxmemoryCheck:
    if value == "refuse":
        return value
    if value == "warn":
        # An evicted key silently breaks the queue's structures (a group's chain loses a
        # link, the seq counter restarts and hands out seqs again): no warning covers that.
        raise ValueError(
            "maxmemory_policy=warn is no longer accepted: a server that may evict the "
            "queue's keys can corrupt the queue, not just lose messages; run it with "
            "maxmemory-policy noeviction (or a volatile-* policy, see docs/redis.md)"
        )
    raise ValueError(f"maxmemory_policy must be refuse, got {value!r}")


def _on_dead(value: object) -> OnDead:
    return cast(OnDead, core.check_on_dead(value))


def _file(name: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        if not isinstance(value, (str, os.PathLike)) or not os.path.isfile(value):
            raise ValueError(f"{name} must name a readable file, got {value!r}")
        return os.fspath(value)

    return check


def _cert_reqs(value: object) -> CertReqs:
    if value == "required" or value == "optional" or value == "none":
        return value
    raise ValueError(f"ssl_cert_reqs must be required, optional or none, got {value!r}")


def _flag(name: str) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{name} must be true or false, got {value!r}")

    return check


def _passphrase(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("ssl_password must be a string")  # never shown
    return value


OPTIONS = core.OptionTable(
    "Redis",
    {
        "queue": _queue,
        "db": _db,
        "socket_timeout": core.seconds_option("socket_timeout"),
        "connect_timeout": core.seconds_option("connect_timeout"),
        "max_attempts": core.check_max_attempts,
        "on_dead": _on_dead,
        "maxmemory_policy": _maxmemory,
        "dedup_window": core.seconds_option("dedup_window"),
        "ssl_ca_certs": _file("ssl_ca_certs"),
        "ssl_certfile": _file("ssl_certfile"),
        "ssl_keyfile": _file("ssl_keyfile"),
        "ssl_cert_reqs": _cert_reqs,
        "ssl_check_hostname": _flag("ssl_check_hostname"),
    },
    # Never from the URL: a callable, and a secret (messages show a URL with its query).
    keyword_only={"clock": core.check_clock, "ssl_password": _passphrase},
)


def parse_url(url: str, options: Mapping[str, object]) -> RedisOptions:
    """Check ``url`` and ``options`` and return the options to open with."""
    shown = core.redact_url(url)
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

    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key in OPTIONS.keyword_only for key, _ in query):
        # Before any message that shows the URL: it would show the secret too.
        raise ValueError(f"{', '.join(OPTIONS.keyword_only)} may only be given as keywords")
    chosen = OPTIONS.choose(url, query, options)
    if "db" in chosen and parts.scheme != "unix":
        raise ValueError(f"Redis URL {shown!r}: give the database as its path (/N), not db=")
    tls = sorted(key for key in chosen if key.startswith("ssl_"))
    if tls and parts.scheme != "rediss":
        raise ValueError(f"Redis URL {shown!r}: {', '.join(tls)} need a rediss:// (TLS) URL")
    if "ssl_keyfile" in chosen and "ssl_certfile" not in chosen:
        raise ValueError("ssl_keyfile needs ssl_certfile, the certificate it is the key of")
    if chosen.get("ssl_cert_reqs") == "none" and chosen.get("ssl_check_hostname") is True:
        raise ValueError("ssl_check_hostname=true needs ssl_cert_reqs required or optional")
    server = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return OPTIONS.build(RedisOptions, chosen, server=server)
