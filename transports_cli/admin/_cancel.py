"""``transports cancel``: delete one message that no worker holds."""

from __future__ import annotations

import click

from transports_cli._output import emit_json, url_argument
from transports_cli.admin._access import confirm, open_admin
from transports_core import redact_url

__all__ = ["cancel"]


@click.command(short_help="Delete one message that is not in flight (delayed or queued).")
@url_argument()
@click.argument("seq", type=click.IntRange(min=1), metavar="SEQ")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def cancel(url: str, seq: int, yes: bool, as_json: bool) -> None:
    """Delete message SEQ for good if no worker holds it: a delayed message, one queued
    behind its group's head, or a parked one. A message leased to a worker is left alone.
    Exits 1 when nothing was deleted (no such message, or it is in flight).

    \b
    Example:
      transports cancel sqlite:///queue.db 42 --yes
    """
    with open_admin(url) as admin:
        confirm(f"Delete message {seq} from {redact_url(url)} for good?", yes)
        removed = admin.cancel(seq)
    if as_json:
        emit_json({"seq": seq, "cancelled": removed})
    if not removed:
        raise click.ClickException(f"message {seq} was not cancelled: it is in flight or gone")
    if not as_json:
        click.echo(f"Cancelled message {seq}.")
