"""``transports check URL``: one probe of a queue, for readiness and liveness checks.

Exit 0 when the store answers, its schema is current and its server's settings are sound
(what the backend verifies as it opens), and one read of its totals through the admin
interface succeeds; exit 1 otherwise, with one line saying why (a queue of an older
schema version included: run ``transports migrate``). Never creates a SQLite file, never
claims, never writes.

``--max-oldest-ready`` also fails when the oldest ready message has waited longer
(`QueueStats.oldest_ready_age`, on the store's clock). A backend that reports no age
(one of another package) fails it while it has ready messages, saying so; a queue with
none ready passes it: no ready message has waited at all.
"""

from __future__ import annotations

import click

from transports_core import QueueStats, redact_url

from ._output import url_argument
from .admin._access import open_admin, plural
from .worker import seconds_option

__all__ = ["check"]


def _totals(stats: QueueStats) -> str:
    return (
        f"{stats.ready} ready, {stats.in_flight} in flight, {stats.parked} parked, "
        f"{plural(stats.dead, 'dead letter')}"
    )


def _oldest_priority(stats: QueueStats) -> str:
    ages = {p.priority: p.oldest_ready_age or 0.0 for p in stats.by_priority}
    return f"priority {max(ages, key=lambda p: ages[p])}"


@click.command(short_help="Exit 0 if a queue answers and is sound, else 1 (for probes).")
@url_argument()
@seconds_option(
    "--max-oldest-ready",
    "Also fail when the oldest ready message has waited longer than this many seconds.",
    None,
)
def check(url: str, max_oldest_ready: float | None) -> None:
    """Check that the queue at URL answers, with a current schema and sound server
    settings (whatever its backend verifies on opening), and that its totals can be
    read. Prints one line: ok and the totals (exit 0), or the reason (exit 1).

    With --max-oldest-ready S, also fail when the oldest ready message has waited
    longer than S seconds (since it was published, came due, or was requeued).

    \b
    Example:
      transports check sqlite:///queue.db
      TRANSPORTS_URL=postgresql://app@db/app transports check --max-oldest-ready 300
    """
    with open_admin(url) as admin:
        stats = admin.stats()
    shown = redact_url(url)
    if max_oldest_ready is not None and stats.ready:
        age = stats.oldest_ready_age
        if age is None:
            raise click.ClickException(
                f"{shown}: this backend does not report the age of the oldest ready message, "
                f"so --max-oldest-ready cannot be checked ({plural(stats.ready, 'message')} "
                "ready)"
            )
        if age > max_oldest_ready:
            raise click.ClickException(
                f"{shown}: the oldest ready message has waited {age:.1f} s "
                f"({_oldest_priority(stats)}), more than {max_oldest_ready:g} s"
            )
    click.echo(f"ok: {shown} answers; {_totals(stats)}")
