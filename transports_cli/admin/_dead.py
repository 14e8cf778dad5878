"""``transports dead``: list, requeue and purge dead letters, through the admin protocol."""

from __future__ import annotations

import time
from dataclasses import asdict

import click

from transports_cli._output import count_option, emit_json, print_table, url_argument
from transports_cli.admin._access import confirm, open_admin, plural, relative
from transports_core import RequeueRefused, TransportAdmin, TransportError, redact_url

__all__ = ["NOT_ALL_REQUEUED", "dead"]

# `requeue`'s exit code when it did what it could but some seqs were refused or not
# found; a failing store exits 1, as every command's errors do.
NOT_ALL_REQUEUED = 3

_EVENT_WIDTH = 60  # characters of the stored event shown in the table (--json: all of it)


@click.command(short_help="List, requeue or purge a queue's dead letters.")
@url_argument()
@click.argument(
    "action", type=click.Choice(["list", "requeue", "purge"]), default="list", required=False
)
@click.argument("seqs", nargs=-1, type=click.IntRange(min=1), metavar="[SEQ]...")
@count_option(
    "--limit", 1, None, "list: show at most this many (lowest seq first).  [default: all]"
)
@click.option("--yes", "-y", is_flag=True, help="purge: do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_context
def dead(
    ctx: click.Context,
    url: str,
    action: str,
    seqs: tuple[int, ...],
    limit: int | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Work with dead letters: messages taken out of delivery, buried by a handler or
    out of attempts after max_attempts deliveries without an ack (the reason says which).

    \b
    list            show them, lowest seq first (the default action)
    requeue SEQ...  put each back at the head of its group, in its original
                    place, with a fresh allowance of deliveries; says which
                    seqs were requeued and which were not: not found, or
                    refused while their group is held (exit 3 if any was
                    not); a store that fails (locked, read-only, full) stops
                    it with an error (exit 1)
    purge           discard every dead letter listed at that moment, for good,
                    after asking (--yes: without asking)

    \b
    Example:
      transports dead sqlite:///queue.db
      transports dead sqlite:///queue.db list --json
      transports dead sqlite:///queue.db requeue 17 42
      transports dead sqlite:///queue.db purge --yes
    """
    if seqs and action != "requeue":
        raise click.UsageError(f"'{action}' takes no SEQ (got {seqs[0]})", ctx)
    if action == "requeue" and not seqs:
        raise click.UsageError("'requeue' needs at least one SEQ", ctx)
    with open_admin(url) as admin:
        if action == "list":
            _list(admin, limit, as_json)
        elif action == "requeue":
            _requeue(admin, seqs, as_json)
        else:
            _purge(admin, url, yes, as_json)


def _list(admin: TransportAdmin, limit: int | None, as_json: bool) -> None:
    letters = admin.dead_letters(limit)
    if as_json:
        emit_json([asdict(letter) for letter in letters])
        return
    now = time.time()
    print_table(
        ["seq", "group", "priority", "attempts", "died", "held", "reason", "event"],
        [
            [
                str(d.seq),
                d.group_id,
                str(d.priority),
                str(d.attempts),
                relative(d.dead_at, now),
                "yes" if d.held else "no",
                d.reason,
                d.event if len(d.event) <= _EVENT_WIDTH else d.event[: _EVENT_WIDTH - 3] + "...",
            ]
            for d in letters
        ],
        empty="No dead letters.",
    )


class _NotAllRequeued(click.ClickException):
    """Some dead letters were refused or not found; the queue itself is fine."""

    exit_code = NOT_ALL_REQUEUED


def _requeue(admin: TransportAdmin, seqs: tuple[int, ...], as_json: bool) -> None:
    requeued: list[int] = []
    not_found: list[int] = []
    refused: list[dict[str, object]] = []
    not_tried: list[int] = []
    failure: TransportError | None = None
    wanted = list(dict.fromkeys(seqs))  # each once, in the order given
    for index, seq in enumerate(wanted):
        try:
            (requeued if admin.requeue(seq) else not_found).append(seq)
        except RequeueRefused as exc:  # its group is held: nothing changed, try later
            refused.append({"seq": seq, "reason": str(exc)})
        except TransportError as exc:
            # The store failed (locked, read-only, full, damaged, connection lost): the
            # next ones would fail alike, so stop and say which were not tried.
            failure = exc
            not_tried = wanted[index:]
            break
    if as_json:
        document: dict[str, object] = {
            "requeued": requeued,
            "not_found": not_found,
            "refused": refused,
        }
        if failure is not None:
            document.update(not_tried=not_tried, error=str(failure))
        emit_json(document)
    else:
        if requeued:
            click.echo(f"Requeued: {', '.join(map(str, requeued))}")
        if not_found:
            click.echo(
                f"Not found (no dead letter with that seq): {', '.join(map(str, not_found))}"
            )
        for item in refused:
            click.echo(f"Refused {item['seq']}: {item['reason']}")
    if failure is not None:
        raise click.ClickException(f"{failure}; not requeued: {', '.join(map(str, not_tried))}")
    failed = len(not_found) + len(refused)
    if failed:
        raise _NotAllRequeued(
            f"{failed} of {len(requeued) + failed} dead letters were not requeued"
        )


def _purge(admin: TransportAdmin, url: str, yes: bool, as_json: bool) -> None:
    letters = admin.dead_letters()
    if not letters:
        if as_json:
            emit_json({"discarded": [], "already_gone": []})
        else:
            click.echo("No dead letters; nothing to purge.")
        return
    shown = ", ".join(str(d.seq) for d in letters[:10]) + (", ..." if len(letters) > 10 else "")
    held = sum(d.held for d in letters)
    freed = f"; {plural(held, 'held group')} will go on" if held else ""
    confirm(
        f"Discard {plural(len(letters), 'dead letter')} (seq {shown}) from "
        f"{redact_url(url)} for good{freed}?",
        yes,
    )
    discarded: list[int] = []
    already_gone: list[int] = []
    for letter in letters:  # exactly those counted in the question, none that died since
        (discarded if admin.discard(letter.seq) else already_gone).append(letter.seq)
    if as_json:
        emit_json({"discarded": discarded, "already_gone": already_gone})
        return
    click.echo(f"Discarded {plural(len(discarded), 'dead letter')}.")
    if already_gone:
        click.echo(
            f"Already gone (requeued or discarded meanwhile): {', '.join(map(str, already_gone))}"
        )
