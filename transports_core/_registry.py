"""Choosing a backend by URL scheme.

A backend is a module-level `Backend` object registered under its URL scheme, either in
process with `register_backend` or by a distribution's entry point in the group
``durable_transports.backends``. Core never parses a backend's URL or options: it hands
the whole URL and the keyword options to the backend. Imports no backend.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final, Literal, Protocol, TypeVar, overload
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ._errors import UnknownBackend
from ._models import Event
from ._protocol import AsyncTransport, Transport

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "Migration",
    "known_schemes",
    "migrate",
    "open_async_transport",
    "open_transport",
    "redact_url",
    "register_backend",
]

ENTRY_POINT_GROUP = "durable_transports.backends"
_LOOSE_PASSWORD = re.compile(r":[^:/@?#]*@")

E = TypeVar("E")


class Opener(Protocol):
    def __call__(
        self, url: str, event_type: object, options: Mapping[str, object]
    ) -> Transport[Any]: ...


class AsyncOpener(Protocol):
    def __call__(
        self, url: str, event_type: object, options: Mapping[str, object]
    ) -> AsyncTransport[Any]: ...


@dataclass(frozen=True)
class Migration:
    """What `migrate` found at a URL, and the DDL that brings it to this code's schema.

    ``found``: ``missing`` (no queue there yet: `statements` create it), ``old`` (an
    older schema version, ``version``: they upgrade it) or ``current`` (at ``target``,
    this code's version: there are none). ``statements``: complete SQL statements, their
    values written in as literals, meant to run in order in one transaction; ``applied``:
    whether they ran (`migrate` with ``apply=False`` only reads)."""

    found: Literal["missing", "old", "current"]
    version: int | None
    target: int
    statements: tuple[str, ...] = ()
    applied: bool = False

    def script(self) -> str:
        """`statements` as a script to review and run (psql, or any client): one
        statement per block, each ending with ``;``, in one transaction."""
        if not self.statements:
            return ""
        blocks = ["BEGIN;", *(text.strip().rstrip(";") + ";" for text in self.statements)]
        return "\n\n".join([*blocks, "COMMIT;"]) + "\n"


class Migrator(Protocol):
    """What a backend offers `migrate` (see `Backend.migrate`): the URL, the keyword
    options as given, and whether to run the DDL or only return it."""

    def __call__(self, url: str, options: Mapping[str, object], apply: bool) -> Migration: ...


@dataclass(frozen=True)
class Backend:
    """What a backend registers: how to open its sync and async transports from a URL.

    Each callable receives the full URL, the event type, and the keyword options exactly as
    the caller passed them; it validates both the URL's query and the options itself.
    ``features`` names the optional parts of the contract its transports offer, among
    `FEATURES` (``timers``, ``tenants``, ``group-control``); those it does not name, its
    transports refuse with `Unsupported`. The conformance suite at a URL reads them.
    ``migrate``: for a backend that keeps a versioned schema, what `migrate` calls; None
    for one that has nothing to set up before use.
    """

    open: Opener
    open_async: AsyncOpener | None = None
    features: frozenset[str] = frozenset()
    migrate: Migrator | None = None

    def __post_init__(self) -> None:
        unknown = set(self.features) - FEATURES
        if unknown:
            raise ValueError(
                f"unknown backend features {sorted(unknown)}; known: {', '.join(sorted(FEATURES))}"
            )


# The optional parts of the contract a backend may offer (see `Backend.features`).
FEATURES: Final = frozenset({"timers", "tenants", "group-control"})


_registered: dict[str, Backend] = {}
_lock = threading.Lock()


def register_backend(scheme: str, backend: Backend | None) -> None:
    """Register ``backend`` for ``scheme`` in this process (ahead of entry points);
    ``None`` removes a registration."""
    if not scheme or "://" in scheme:
        raise ValueError(f"scheme must be a non-empty name such as 'sqlite', got {scheme!r}")
    with _lock:
        if backend is None:
            _registered.pop(scheme, None)
        elif isinstance(backend, Backend):
            _registered[scheme] = backend
        else:
            raise TypeError(f"backend must be a Backend, got {backend!r}")


def known_schemes() -> dict[str, str]:
    """Every scheme that resolves, mapped to where it comes from (sorted by scheme)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    with _lock:
        found.update(dict.fromkeys(_registered, "register_backend()"))
    return dict(sorted(found.items()))


def _scheme(url: object) -> str:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ValueError(
            f"malformed transport URL {redact_url(url)!r}: expected SCHEME://..., "
            "for example sqlite:///queue.db"
        )
    return scheme


def _resolve(scheme: str) -> Backend:
    with _lock:
        backend = _registered.get(scheme)
    if backend is not None:
        return backend
    for ep in entry_points(group=ENTRY_POINT_GROUP).select(name=scheme):
        try:
            loaded = ep.load()
        except ModuleNotFoundError as exc:
            raise _missing_driver(ep, exc) from exc
        if not isinstance(loaded, Backend):
            raise TypeError(
                f"entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP} "
                f"is not a transports_core.Backend: {loaded!r:.100}"
            )
        return loaded
    raise UnknownBackend(scheme, known_schemes())


_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*;.*\bextra\s*==\s*['\"]([^'\"]+)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _missing_driver(ep: EntryPoint, exc: ModuleNotFoundError) -> ImportError:
    """The error for a backend whose driver is not installed: it names the extra of the
    backend's distribution that requires the missing module, when one does."""
    missing = (exc.name or "").partition(".")[0]
    dist = ep.dist
    extra = None
    if dist is not None and missing:
        for requirement in dist.requires or ():
            found = _REQUIREMENT.match(requirement)
            name = _normal(found[1]) if found else ""
            if found and (name == _normal(missing) or name.startswith(_normal(missing) + "-")):
                extra = found[2]
                break
    where = f"the {ep.name!r} backend ({ep.value})"
    if extra is None or dist is None:
        return ImportError(f"{where} cannot be imported: {exc}")
    return ImportError(
        f"{where} needs {missing!r}, which is not installed: "
        f"pip install '{dist.metadata['Name']}[{extra}]'"
    )


# The overlap mypy reports is intended: without event_type, **options cannot hold it.
@overload
def open_transport(  # type: ignore[overload-overlap]
    url: str, *, event_type: type[E], **options: object
) -> Transport[E]: ...
@overload
def open_transport(url: str, *, event_type: object, **options: object) -> Transport[Any]: ...
@overload
def open_transport(url: str, **options: object) -> Transport[Event]: ...
def open_transport(url: str, *, event_type: object = Event, **options: object) -> Transport[Any]:
    """Open the transport that ``url`` names, for events of ``event_type``.

    >>> with open_transport("sqlite:///:memory:") as t:
    ...     t.publish("order-1", Event(kind="created"))
    1
    """
    return _resolve(_scheme(url)).open(url, event_type, options)


@overload  # overlapping as open_transport's first, on purpose
def open_async_transport(  # type: ignore[overload-overlap]
    url: str, *, event_type: type[E], **options: object
) -> AsyncTransport[E]: ...
@overload
def open_async_transport(
    url: str, *, event_type: object, **options: object
) -> AsyncTransport[Any]: ...
@overload
def open_async_transport(url: str, **options: object) -> AsyncTransport[Event]: ...
def open_async_transport(
    url: str, *, event_type: object = Event, **options: object
) -> AsyncTransport[Any]:
    """Open the async twin of the transport that ``url`` names (connects lazily)."""
    scheme = _scheme(url)
    backend = _resolve(scheme)
    if backend.open_async is None:
        raise UnknownBackend(scheme, known_schemes(), asynchronous=True)
    return backend.open_async(url, event_type, options)


def migrate(url: str, *, apply: bool = True, **options: object) -> Migration | None:
    """Bring the schema of the queue at ``url`` to this code's version: create it when
    missing, upgrade it when older; with ``apply=False``, only read, and return the DDL
    that would run. None when the backend keeps no schema (nothing to migrate)."""
    backend = _resolve(_scheme(url))
    if backend.migrate is None:
        return None
    return backend.migrate(url, options, apply)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and reprs: the one in
    its user info, a query parameter whose name ends in ``password`` (``?password=``,
    libpq's ``sslpassword``), and those of a URL given as a query value (``listen_url``)."""
    head, mark, rest = url.partition("?")
    query, hash_, fragment = rest.partition("#")
    base = _redact_netloc(head)
    if base is None:
        return "<unparseable URL>"
    return base + mark + _redact_query(query) + hash_ + fragment


def _redact_netloc(head: str) -> str | None:
    try:
        parts = urlsplit(head)
    except ValueError:
        return None
    if parts.password is None:
        # A URL that urlsplit cannot read as SCHEME://USER:PASSWORD@HOST (a typo such as
        # "postgresql:/user:pw@host") may still carry a password: mask any ":...@".
        return _LOOSE_PASSWORD.sub(":***@", head)
    userinfo = f"{parts.username or ''}:***@"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=userinfo + host))


def _redact_query(query: str) -> str:
    pairs = []
    for pair in query.split("&") if query else ():
        key, eq, value = pair.partition("=")
        inner = unquote(value)
        if eq and unquote(key).lower().endswith("password"):
            value = "***"
        elif "://" in inner and (hidden := redact_url(inner)) != inner:
            # Kept readable, but quoted as a query value must be.
            value = quote(hidden, safe=":/@*")
        pairs.append(key + eq + value)
    return "&".join(pairs)
