"""``transports purge``: delete one group's messages and dead letters, after asking."""

from __future__ import annotations

import click

from transports_cli._output import emit_json, url_argument
from transports_cli.admin._access import all_groups, confirm, open_admin, plural
from transports_core import redact_url

__all__ = ["purge"]


@click.command(short_help="Delete every message and dead letter of one group.")
@url_argument()
@click.option("--group", "group_id", required=True, help="The group to delete.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def purge(url: str, group_id: str, yes: bool, as_json: bool) -> None:
    """Delete every message of a group, leased ones included (their workers get
    LeaseLost when they settle), and its dead letters. Asks first, saying how many
    messages and dead letters it will delete; --yes skips the question. Exits 1 if
    the group has neither.

    \b
    Example:
      transports purge sqlite:///queue.db --group order-17
      transports purge sqlite:///queue.db --group order-17 --yes --json
    """
    purge_group(url, group_id, yes, as_json)


def purge_group(url: str, group_id: str, yes: bool, as_json: bool) -> None:
    """What ``transports purge`` and ``transports group purge`` do."""
    with open_admin(url) as admin:
        stats = admin.stats()
        group = next((g for g in all_groups(admin, stats) if g.group_id == group_id), None)
        letters = sum(d.group_id == group_id for d in admin.dead_letters())
        messages = group.depth if group is not None else 0
        if not messages and not letters:
            raise click.ClickException(f"group {group_id!r} has no messages and no dead letters")
        if group is not None and group.state == "in_flight" and not yes:
            click.echo(
                f"A worker holds a lease on the head of {group_id!r}; it will get LeaseLost.",
                err=True,
            )
        confirm(
            f"Delete {plural(messages, 'message')} and {plural(letters, 'dead letter')} of "
            f"group {group_id!r} from {redact_url(url)} for good?",
            yes,
        )
        removed = admin.purge_group(group_id)
    if as_json:
        emit_json(
            {
                "group_id": group_id,
                "removed": removed,
                "messages": messages,
                "dead_letters": letters,
            }
        )
        return
    if removed == messages + letters:
        what = f"{plural(messages, 'message')} and {plural(letters, 'dead letter')}"
    else:  # the group changed between the count and the purge
        what = f"{removed} messages and dead letters (counted {messages + letters} before)"
    click.echo(f"Purged group {group_id!r}: removed {what}.")
