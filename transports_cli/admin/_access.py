"""What the admin commands (``inspect``, ``dead``, ``purge``) share: opening a queue
through the admin protocol, reading every group, times relative to now, and asking
before anything is deleted.

Backend-neutral: a queue is opened by URL and used only through
`transports_core.TransportAdmin`. The single backend fact here is that a SQLite URL
naming a missing file would create one; these commands refuse instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click

from transports_core import (
    Event,
    GroupInfo,
    QueueStats,
    Transport,
    TransportAdmin,
    open_transport,
    redact_url,
)

__all__ = ["all_groups", "confirm", "open_admin", "plural", "refuse_private", "relative"]


@contextmanager
def open_admin(url: str) -> Iterator[TransportAdmin]:
    """Open ``url`` and hand back its admin interface; refuse a backend without one."""
    refuse_private(url, "there is no queue to read or repair")
    _refuse_missing_file(url)
    with open_transport(url) as transport:
        if not isinstance(transport, TransportAdmin):
            scheme = url.partition("://")[0]
            raise click.ClickException(
                f"the {scheme!r} backend ({type(transport).__name__}) does not implement the "
                "admin interface (transports_core.TransportAdmin), so its queues cannot be "
                "inspected or repaired from here"
            )
        yield transport


def _sqlite_path(url: str) -> str | None:
    if not url.startswith("sqlite:///"):
        return None
    try:
        return unquote(urlsplit(url).path[1:])
    except ValueError:  # malformed: the backend says so when it opens the URL
        return None


def refuse_private(url: str, why: str) -> None:
    """Refuse an in-memory SQLite database: each connection opens a new, empty one that
    no other connection or process sees. ``why`` says what that means here."""
    if _sqlite_path(url) == ":memory:":
        raise click.ClickException(
            f"{redact_url(url)} is a new, empty database private to the connection that "
            f"opens it: {why}; name a file instead, such as sqlite:///queue.db"
        )


def _refuse_missing_file(url: str) -> None:
    # Opening a SQLite URL creates a missing file: a typo would then "inspect" a new,
    # empty queue, and leave a stray file behind.
    path = _sqlite_path(url)
    if path and not Path(path).exists():
        raise click.ClickException(
            f"no queue at {path}: the file does not exist (this command never creates one)"
        )


def all_groups(admin: TransportAdmin, stats: QueueStats) -> list[GroupInfo]:
    """Every group that has messages, deepest first. Each group holds at least one message
    or dead letter, so the totals of ``stats`` bound their number."""
    bound = stats.ready + stats.in_flight + stats.parked + stats.dead
    return admin.groups(limit=max(1, bound))


def relative(when: float | None, now: float) -> str:
    """``when`` (epoch seconds) as "in 3.2 s" or "3.2 s ago"; "-" for None."""
    if when is None:
        return "-"
    delta = when - now
    return f"in {delta:.1f} s" if delta >= 0 else f"{-delta:.1f} s ago"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def confirm(question: str, yes: bool) -> None:
    """Go on if ``yes`` or the user answers y; otherwise fail with nothing changed. The
    question goes to stderr, so that stdout carries only the result (``--json``)."""
    if yes:
        return
    try:
        agreed = click.confirm(question, default=False, err=True)
    except click.Abort:  # end of input: no answer is a no
        agreed = False
    if not sys.stdin.isatty():  # the answer was not echoed: end the question's line
        click.echo(err=True)
    if not agreed:
        raise click.ClickException("not confirmed; nothing was changed")


def refuse_busy(transport: Transport[Event], url: str, who: str) -> None:
    """Refuse a queue that holds messages: ``who`` (the demo, the benchmark) claims and
    acks whatever comes next, so another application's messages would be lost. Dead
    letters are never claimed: they may stay. Without the admin interface, one probe
    claim looks (and hands the message straight back)."""
    if isinstance(transport, TransportAdmin):
        stats = transport.stats()
        waiting = stats.ready + stats.in_flight + stats.parked
        if waiting:
            raise click.ClickException(
                f"{redact_url(url)} holds {waiting} message{'' if waiting == 1 else 's'}; "
                f"{who} claims and acks whatever is queued, so it needs an empty queue"
            )
        return
    lease = transport.claim("transports-probe", visibility=5)
    if lease is not None:
        transport.nack(lease)
        raise click.ClickException(
            f"{redact_url(url)} already holds messages (group {lease.group_id!r}); "
            f"{who} claims and acks whatever is queued, so it needs an empty queue"
        )
