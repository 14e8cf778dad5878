"""``transports group``: one group's controls, through the admin protocol: pause and
resume its deliveries, peek at its next messages, purge it."""

from __future__ import annotations

import time
from dataclasses import asdict

import click

from transports_cli._output import (
    SuppliesUrl,
    count_option,
    emit_json,
    print_table,
    url_argument,
)
from transports_cli.admin._access import open_admin, relative
from transports_cli.admin._purge import purge_group

__all__ = ["group"]

# How much of a message's event a table shows.
EVENT_WIDTH = 40


@click.group(cls=SuppliesUrl, short_help="Pause, resume, peek at or purge one group.")
def group() -> None:
    """Control one group (one execution's messages): stop its deliveries and let them go
    on, look at what it will deliver next, or delete it.

    \b
    Example:
      transports group pause sqlite:///queue.db order-17
      transports group peek sqlite:///queue.db order-17 --limit 5
      transports group resume sqlite:///queue.db order-17
    """


def _toggle(url: str, group_id: str, paused: bool, as_json: bool) -> None:
    with open_admin(url) as admin:
        call = admin.pause_group if paused else admin.resume_group
        changed = call(group_id)
    if as_json:
        emit_json({"group_id": group_id, "paused": paused, "changed": changed})
        return
    verb = "Paused" if paused else "Resumed"
    if changed:
        click.echo(f"{verb} group {group_id!r}.")
    else:
        click.echo(f"Group {group_id!r} was {'paused' if paused else 'not paused'} already.")


@group.command(short_help="Stop a group's deliveries until it is resumed.")
@url_argument()
@click.argument("group_id", metavar="GROUP")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def pause(url: str, group_id: str, as_json: bool) -> None:
    """Deliver nothing more from GROUP until 'transports group resume'. A message in
    flight finishes normally; the pause is stored in the queue, so it holds for every
    worker, across restarts and while the group has no messages."""
    _toggle(url, group_id, True, as_json)


@group.command(short_help="Let a paused group deliver again.")
@url_argument()
@click.argument("group_id", metavar="GROUP")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def resume(url: str, group_id: str, as_json: bool) -> None:
    """Let GROUP deliver again after 'transports group pause'."""
    _toggle(url, group_id, False, as_json)


@group.command(short_help="Show a group's next messages without claiming them.")
@url_argument()
@click.argument("group_id", metavar="GROUP")
@count_option("--limit", 1, 10_000, "How many messages to show.", default=10)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def peek(url: str, group_id: str, limit: int, as_json: bool) -> None:
    """Show GROUP's next messages in the order it will deliver them: its queue from the
    head, then its delayed messages that wait outside it, by due time. Takes no lease
    and changes nothing."""
    with open_admin(url) as admin:
        shown = admin.peek(group_id, limit)
    if as_json:
        emit_json([asdict(m) for m in shown])
        return
    if not shown:
        click.echo(f"Group {group_id!r} has no messages.")
        return
    now = time.time()
    print_table(
        ["seq", "state", "attempts", "due", "priority", "event"],
        [
            [
                str(m.seq),
                m.state.replace("_", " "),
                str(m.attempts),
                relative(m.due_at, now),
                str(m.priority),
                m.event if len(m.event) <= EVENT_WIDTH else m.event[: EVENT_WIDTH - 1] + "…",
            ]
            for m in shown
        ],
    )


@group.command(name="purge", short_help="Delete every message and dead letter of a group.")
@url_argument()
@click.argument("group_id", metavar="GROUP")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def purge_command(url: str, group_id: str, yes: bool, as_json: bool) -> None:
    """Delete every message of GROUP (delayed and leased ones included) and its dead
    letters, as 'transports purge URL --group GROUP' does. Asks first; --yes skips the
    question."""
    purge_group(url, group_id, yes, as_json)
