"""PostgreSQL URLs and options -> `PostgresOptions`, through one typed whitelist.

The URL is libpq's: ``postgresql://[user[:password]@][host][:port][,...]/dbname?...``
(``postgres://`` too), with sockets as ``host=/path`` or a percent-encoded host, and any
libpq parameter in the query (``sslmode``, ``connect_timeout``, ``application_name``...).
Our own options are taken out of the query (or come as keywords, typed); what is left
goes to libpq, which checks it. Imports psycopg's conninfo parser only, not a connection.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, cast
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from transports_core import backend as core

URL_FORMS = (
    "postgresql://user@host:5432/dbname?schema=NAME, "
    "postgresql:///dbname?host=/var/run/postgresql, or postgres://..."
)
DEFAULT_SCHEMA = "durable_transports"
# A plain identifier: it is also the LISTEN channel, and it appears in messages.
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

OnDead = Literal["release", "hold"]
LeaseCommit = Literal["flush", "async"]
LEASE_COMMITS = ("flush", "async")
Migrate = Literal["create", "auto", "never"]
# psycopg's own default.
PREPARE_THRESHOLD = 5


def _no_clock() -> None:
    return None


@dataclass(frozen=True)
class PostgresOptions:
    """Everything a PostgreSQL transport is opened with.

    ``conninfo``: the URL as libpq takes it, our options removed (it may hold a password:
    never print it; `display` is the redacted form).
    ``schema``: the queue; one schema is one queue, created on first open.
    ``pool_min_size`` / ``pool_max_size``: connections the pool keeps / may open.
    ``pool_timeout``: seconds a call waits for a free connection before failing.
    ``max_attempts``: deliveries before the claim that would deliver again buries it
    instead; None (default): never. ``on_dead``: ``release`` (default) or ``hold``.
    ``lease_commit``: ``flush`` (default): every commit waits for its WAL flush, as the
    session's ``synchronous_commit`` says. ``async``: a claim, nack or extend, which only
    moves a lease, commits without waiting; a server crash may then undo it (see
    docs/postgres.md, "Durability").
    ``dedup_window``: seconds a publish's idempotency key is remembered (a day unless
    set): a publish with the same key in the same group within it is a `Duplicate`.
    ``prepare_threshold``: psycopg's: executions of a statement on one connection before
    it is prepared on the server (5 unless set; 0: at once); None (``none`` in a URL):
    never, as a pooler in transaction mode (PgBouncer before 1.21) needs.
    ``listen_url``: a second URL, straight to the server, for the one LISTEN connection
    that wakes blocked claims (when the main URL goes through a pooler in transaction
    mode); None: the main URL. Only libpq's parameters in it (it may hold a password).
    ``migrate``: what opening may change in the schema. ``create`` (default): create a
    missing queue, when the role may, but refuse one at an older schema version, naming
    ``transports migrate``; ``auto``: also upgrade an older one in place; ``never``:
    neither, refuse a missing queue too (opening only reads the schema).
    ``clock``: seconds since the epoch, for tests (keyword only); by default every
    timestamp is the server's clock, one clock for every host.
    """

    conninfo: str = field(repr=False)
    display: str = ""
    schema: str = DEFAULT_SCHEMA
    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout: float = 30.0
    max_attempts: int | None = None
    on_dead: OnDead = "release"
    lease_commit: LeaseCommit = "flush"
    dedup_window: float = core.DEDUP_WINDOW
    prepare_threshold: int | None = PREPARE_THRESHOLD
    listen_url: str | None = field(default=None, repr=False)
    migrate: Migrate = "create"
    clock: Callable[[], float | None] = field(default=_no_clock)

    @property
    def server_clock(self) -> bool:
        return self.clock is _no_clock

    @property
    def lease_synchronous_commit(self) -> str | None:
        """The ``synchronous_commit`` of lease-only transactions: None keeps the session's."""
        return "off" if self.lease_commit == "async" else None


def _schema(value: object) -> str:
    if not isinstance(value, str) or not _SCHEMA.fullmatch(value):
        raise ValueError(
            f"schema must be a plain identifier (letters, digits, _; not starting with a "
            f"digit; at most 63 characters), got {value!r}"
        )
    if value.lower().startswith("pg_") or value.lower() == "information_schema":
        raise ValueError(f"schema {value!r} is reserved by PostgreSQL")
    return value


def _whole(name: str, low: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        return value

    return check


def _lease_commit(value: object) -> LeaseCommit:
    if isinstance(value, str) and value.lower() in LEASE_COMMITS:
        return cast(LeaseCommit, value.lower())
    raise ValueError(f"lease_commit must be one of {', '.join(LEASE_COMMITS)}, got {value!r}")


def _migrate(value: object) -> Migrate:
    return cast(Migrate, core.check_migrate(value))


def _prepare_threshold(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        return _whole("prepare_threshold", 0)(value)
    except ValueError:
        raise ValueError(
            f"prepare_threshold must be none (never prepare) or a whole number >= 0, got {value!r}"
        ) from None


# libpq's parameters whose values libpq checks only as it connects: checked here instead,
# so that a bad one is a ValueError before anything connects.
_CHOICES: dict[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
}


def _libpq_values(conninfo: str, what: str) -> None:
    """Refuse what libpq (or psycopg) would refuse only once it connects: a port out of
    range, an unknown ``sslmode`` or ``target_session_attrs``, a ``connect_timeout`` that
    is not a number. ``what`` names the URL in the message, without its password."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        # libpq's message names the bad part, never the password.
        raise ValueError(f"malformed {what}: {str(exc).strip()}; use {URL_FORMS}") from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{what}: port must be from 1 to 65535, got {port!r}")
    for name, choices in _CHOICES.items():
        value = params.get(name)
        if value is not None and value not in choices:
            raise ValueError(f"{what}: {name} must be one of {', '.join(choices)}, got {value!r}")
    timeout = params.get("connect_timeout")
    if timeout is not None:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds):
            raise ValueError(
                f"{what}: connect_timeout must be a number of seconds, got {timeout!r}"
            )


def _listen_url(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"listen_url must be a PostgreSQL URL, got {type(value).__name__}")
    display = core.redact_url(value)
    scheme, sep, rest = value.partition("://")
    if scheme not in ("postgresql", "postgres") or not sep or "#" in rest:
        raise ValueError(f"listen_url {display!r} is not a PostgreSQL URL; use {URL_FORMS}")
    _, _, query = rest.partition("?")
    ours = sorted(
        {unquote(pair.partition("=")[0]) for pair in query.split("&") if query}
        & set(OPTIONS.checks)
    )
    if ours:
        raise ValueError(
            f"listen_url {display!r} takes libpq's parameters only, not {', '.join(ours)}: "
            "give those in the main URL"
        )
    _libpq_values(value, f"listen_url {display!r}")
    return value


OPTIONS = core.OptionTable(
    "PostgreSQL",
    {
        "schema": _schema,
        "pool_min_size": _whole("pool_min_size", 0),
        "pool_max_size": _whole("pool_max_size", 1),
        "pool_timeout": core.seconds_option("pool_timeout"),
        "max_attempts": core.check_max_attempts,
        "on_dead": core.check_on_dead,
        "lease_commit": _lease_commit,
        "dedup_window": core.seconds_option("dedup_window"),
        "prepare_threshold": _prepare_threshold,
        "listen_url": _listen_url,
        "migrate": _migrate,
    },
    keyword_only={"clock": core.check_clock},
    elsewhere="and libpq's, in the URL",
)


def parse_url(url: str, options: Mapping[str, object]) -> PostgresOptions:
    """Check ``url`` and ``options`` and return the options to open with."""
    display = core.redact_url(url)
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres") or not sep:
        raise ValueError(f"malformed PostgreSQL URL {display!r}; use {URL_FORMS}")
    if "#" in rest:
        raise ValueError(f"PostgreSQL URL {display!r} has a fragment (#...); use {URL_FORMS}")
    base, _, query = rest.partition("?")
    # Our options are taken out of the query; the rest is libpq's, passed on as it came.
    ours: list[tuple[str, str]] = []
    kept: list[str] = []
    for pair in query.split("&") if query else ():
        key, _, value = pair.partition("=")
        if unquote(key) in OPTIONS.checks:
            ours.append((unquote(key), unquote(value)))
        else:
            kept.append(pair)
    chosen = OPTIONS.choose(url, ours, options)
    conninfo = f"{scheme}://{base}" + (f"?{'&'.join(kept)}" if kept else "")
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        # libpq's message names the bad part, never the password.
        known = ", ".join(sorted(OPTIONS.checks))
        raise ValueError(
            f"malformed PostgreSQL URL {display!r}: {str(exc).strip()}; use {URL_FORMS} "
            f"(unknown query keys must be libpq parameters; ours: {known})"
        ) from None
    _libpq_values(conninfo, f"PostgreSQL URL {display!r}")
    low, high = chosen.get("pool_min_size", 1), chosen.get("pool_max_size", 10)
    assert isinstance(low, int)
    assert isinstance(high, int)
    if low > high:
        raise ValueError(f"pool_min_size ({low}) must not exceed pool_max_size ({high})")
    return OPTIONS.build(PostgresOptions, chosen, conninfo=conninfo, display=display)
