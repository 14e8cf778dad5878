"""From a URL to a backend's transport: the rules every backend states the same way about
its options, and the `Backend` built from a backend's parser and transport classes.

Core still interprets no backend's options: a backend lists its own, each with the check
that turns a URL's text or a keyword's value into the option's value. `OptionTable` only
applies the rules they share: an option comes from the URL's query or from a keyword, once;
an unknown name is refused with the list of known ones. Imports only ``_protocol``,
``_registry`` and ``_validate``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from ._protocol import AsyncTransport, Transport
from ._registry import Backend, Migration, Migrator, redact_url
from ._validate import MAX_PUBLISH_DELAY, isfinite

__all__ = ["OptionTable", "build_backend", "check_clock", "seconds_option"]

Parsed = TypeVar("Parsed")
Check = Callable[[object], object]


@dataclass(frozen=True)
class OptionTable:
    """A backend's options: each name with its check, which returns the option's value
    from a URL's text or a keyword's value, or raises ``ValueError``/``TypeError`` naming
    the option and the bad value.

    ``backend`` names the backend in messages (``"SQLite"``); ``checks`` are the options
    a URL's query or a keyword may give; ``keyword_only`` those only a keyword may (a
    clock, say); ``elsewhere`` is added to the list of known options in messages, for a
    backend that passes other query keys on (``"and libpq's, in the URL"``).
    """

    backend: str
    checks: Mapping[str, Check]
    keyword_only: Mapping[str, Check] = field(default_factory=dict)
    elsewhere: str = ""

    def choose(
        self, url: str, query: Iterable[tuple[str, str]], keywords: Mapping[str, object]
    ) -> dict[str, object]:
        """The checked value of each option given: ``query`` is the URL's (name, text)
        pairs, decoded; ``keywords`` the caller's keyword options. ``url`` is only shown,
        redacted, in messages."""
        chosen: dict[str, object] = {}
        for key, text in query:
            if key not in self.checks:
                raise ValueError(self._unknown(key, self.checks))
            if key in chosen:
                shown = redact_url(url)
                raise ValueError(f"{self.backend} option {key!r} is given twice in {shown!r}")
            chosen[key] = self.checks[key](text)
        for key, value in keywords.items():
            check = self.checks.get(key) or self.keyword_only.get(key)
            if check is None:
                raise ValueError(self._unknown(key, {**self.checks, **self.keyword_only}))
            if key in chosen:
                raise ValueError(
                    f"{self.backend} option {key!r} is given both in the URL and as a keyword"
                )
            chosen[key] = check(value)
        return chosen

    def build(
        self, options_type: Callable[..., Parsed], chosen: Mapping[str, object], /, **fixed: object
    ) -> Parsed:
        """``options_type(**fixed, **chosen)``: the backend's options dataclass, from what
        the URL fixes (its path, say) and what `choose` checked. Typed by ``...`` on
        purpose: each check returns its own option's type, which ``chosen``'s type cannot
        say; the table's names are the dataclass's fields, so a wrong one fails here."""
        return options_type(**fixed, **chosen)

    def _unknown(self, key: str, known: Mapping[str, Check]) -> str:
        more = f" ({self.elsewhere})" if self.elsewhere else ""
        return (
            f"unknown {self.backend} option {key!r}; known options: "
            f"{', '.join(sorted(known))}{more}"
        )


def check_clock(value: object) -> Callable[[], float]:
    """The ``clock`` option (keyword only): a callable returning seconds since the epoch."""
    if not callable(value):
        raise TypeError(f"clock must be a callable returning epoch seconds, got {value!r}")
    return cast(Callable[[], float], value)


def seconds_option(name: str) -> Callable[[object], float]:
    """The check of option ``name``, a number of seconds > 0 and at most a year
    (`MAX_PUBLISH_DELAY`; a timeout, say): from a URL's text (``"2.5"``) or a keyword's
    int or float, never a bool. A year bounds it because drivers turn a timeout into a
    deadline on the platform's clock, which overflows (a raw ``OverflowError``) near
    1e10 seconds; no timeout needs more than a year."""

    def check(value: object) -> float:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if not isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r:.200}")
        if value > MAX_PUBLISH_DELAY:
            raise ValueError(
                f"{name} must be at most {MAX_PUBLISH_DELAY:.0f} seconds (a year), got {value!r}"
            )
        return float(value)

    return check


def build_backend(
    parse: Callable[[str, Mapping[str, object]], Parsed],
    transport: Callable[[Parsed, Any], Transport[Any]],
    async_transport: Callable[[Parsed, Any], AsyncTransport[Any]] | None = None,
    *,
    features: Iterable[str] = (),
    migrate: Callable[[Parsed, bool], Migration] | None = None,
) -> Backend:
    """The `Backend` of a backend whose transports are built from one options value:
    ``parse(url, options)`` checks the URL and the keyword options and returns it, and
    ``transport(parsed, event_type)`` (``async_transport`` for the async twin, if any)
    opens the transport. ``features``: see `Backend.features`. ``migrate(parsed,
    apply)``: see `Backend.migrate`."""

    def open_sync(url: str, event_type: object, options: Mapping[str, object]) -> Any:
        return transport(parse(url, options), event_type)

    migrator: Migrator | None = None
    if migrate is not None:
        migrates = migrate

        def migrate_url(url: str, options: Mapping[str, object], apply: bool) -> Migration:
            return migrates(parse(url, options), apply)

        migrator = migrate_url

    offered = frozenset(features)
    if async_transport is None:
        return Backend(open=open_sync, features=offered, migrate=migrator)
    opens_async = async_transport

    def open_async(url: str, event_type: object, options: Mapping[str, object]) -> Any:
        return opens_async(parse(url, options), event_type)

    return Backend(open=open_sync, open_async=open_async, features=offered, migrate=migrator)
