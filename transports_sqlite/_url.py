"""SQLite URLs and options -> `SqliteOptions`, through one typed whitelist.

Options come from the URL query (strings, coerced here) or from keyword arguments (typed
values, checked here); an option may come from one place only. Imports no driver.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from transports_core import TransportError
from transports_core import backend as core

URL_FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db or sqlite:///:memory:"
MEMORY = ":memory:"

Synchronous = Literal["off", "normal", "full", "extra"]
SYNCHRONOUS_LEVELS: tuple[Synchronous, ...] = ("off", "normal", "full", "extra")
OnDead = Literal["release", "hold"]


@dataclass(frozen=True)
class SqliteOptions:
    """Everything a SQLite transport is opened with.

    ``synchronous``: SQLite's durability level. ``full`` (default): publishes, acks and
    admin changes survive power loss, while lease moves (claim, nack, extend) are flushed
    with the next of those (see `_ops.lease_durability`); ``extra``: every commit is
    flushed; ``normal`` may lose the last commits on power loss (never on a process
    crash) and is much faster; ``off`` may corrupt on power loss.
    ``busy_timeout``: milliseconds a writer waits for another's write lock.
    ``max_attempts``: deliveries a message gets before the claim that would deliver it
    again moves it to the dead letters instead; None (default): never.
    ``on_dead``: what a dead letter does to its group: ``release`` (default) lets the
    group go on with its next message; ``hold`` blocks the group until the dead letter
    is requeued or discarded.
    ``file_mode``: permission bits of a database file this transport creates (0o600).
    ``dedup_window``: seconds a group remembers an idempotency key (a day by default);
    a publish with a key used within it is a `Duplicate`.
    ``migrate``: what opening may change in the file's schema. ``create`` (default):
    create the queue in a new or empty file, but refuse a queue of an older schema
    version, naming ``transports migrate``; ``auto``: also upgrade an older one in place
    (in one write transaction); ``never``: neither, refuse a file without a queue too.
    ``clock``: seconds since the epoch; injectable for tests (keyword only).
    """

    path: str
    synchronous: Synchronous = "full"
    busy_timeout: int = 5000
    max_attempts: int | None = None
    on_dead: OnDead = "release"
    file_mode: int = 0o600
    dedup_window: float = core.DEDUP_WINDOW
    migrate: str = "create"
    clock: Callable[[], float] = time.time

    @property
    def memory(self) -> bool:
        return self.path == MEMORY


def _synchronous(value: object) -> Synchronous:
    for level in SYNCHRONOUS_LEVELS:
        if isinstance(value, str) and value.lower() == level:
            return level
    raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}, got {value!r}")


def _busy_timeout(value: object) -> int:
    # isdigit() alone also accepts digits int() refuses, such as '²'.
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"busy_timeout must be a whole number of milliseconds >= 0, got {value!r}")
    return value


def _file_mode(value: object) -> int:
    """An int (``0o640``) or, from a URL, octal digits (``640``, ``0640``, ``0o640``)."""
    if isinstance(value, str):
        digits = value.strip().lower().removeprefix("0o")
        if digits and all(c in "01234567" for c in digits):
            value = int(digits, 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise ValueError(f"file_mode must be permission bits from 0o000 to 0o777, got {value!r}")
    if value & 0o600 != 0o600:
        raise ValueError(f"file_mode must let the owner read and write, got {oct(value)}")
    return value


def _dedup_window(value: object) -> float:
    """Seconds > 0; from a URL, a decimal number of them."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(
                f"dedup_window must be a number of seconds > 0, got {value!r}"
            ) from None
    return core.check_seconds(value, "dedup_window")


OPTIONS = core.OptionTable(
    "SQLite",
    {
        "synchronous": _synchronous,
        "busy_timeout": _busy_timeout,
        "file_mode": _file_mode,
        "max_attempts": core.check_max_attempts,
        "on_dead": core.check_on_dead,
        "dedup_window": _dedup_window,
        "migrate": core.check_migrate,
    },
    keyword_only={"clock": core.check_clock},
)


def parse_url(url: str, options: Mapping[str, object]) -> SqliteOptions:
    """Check ``url`` and ``options`` and return the options to open with."""
    parts = urlsplit(url)
    # urlsplit reads "sqlite:/q.db" as an empty netloc too; only the "sqlite://" forms exist.
    if not url.startswith("sqlite://") or parts.netloc or not parts.path.startswith("/"):
        raise ValueError(f"malformed SQLite URL {core.redact_url(url)!r}; use {URL_FORMS}")
    path = unquote(parts.path[1:])
    if not path:
        raise ValueError(f"SQLite URL {core.redact_url(url)!r} names no file; use {URL_FORMS}")
    if parts.fragment:
        raise ValueError(
            f"SQLite URL {core.redact_url(url)!r} has a fragment (#...); use {URL_FORMS}"
        )
    chosen = OPTIONS.choose(url, parse_qsl(parts.query, keep_blank_values=True), options)
    return OPTIONS.build(SqliteOptions, chosen, path=path)


def database_target(options: SqliteOptions) -> str:
    """The URI to hand the driver, after checking what the file system can tell up front.

    A new file is created here, empty (SQLite reads that as an empty database) and with
    mode ``file_mode`` (0o600 unless asked otherwise), so that a queue is never readable by
    other users by accident. The mode is set exactly, whatever the umask; SQLite gives the
    ``-wal`` and ``-shm`` files the database file's mode.
    """
    if options.memory:
        return "file::memory:"
    path = Path(options.path)
    parent = path.parent
    if not parent.is_dir():
        raise TransportError(f"{options.path}: directory {str(parent)!r} does not exist")
    if path.is_dir():
        raise TransportError(f"{options.path}: is a directory, not a database file")
    mode = "rw"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, options.file_mode)
    except FileExistsError:
        if not os.access(path, os.W_OK):
            mode = "ro"
    except OSError as exc:
        raise TransportError(
            f"{options.path}: cannot create the database file in directory "
            f"{str(parent)!r} ({exc.strerror or exc})"
        ) from exc
    else:
        try:
            os.fchmod(fd, options.file_mode)
        finally:
            os.close(fd)
    return f"file:{quote(str(path.absolute()))}?mode={mode}"


def wal_bytes(options: SqliteOptions) -> int:
    """The size of the database's write-ahead log (0 when it has none)."""
    if options.memory:
        return 0
    try:
        return os.stat(f"{options.path}-wal").st_size
    except OSError:
        return 0
