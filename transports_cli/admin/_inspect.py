"""``transports inspect``: what a queue holds, read through the admin protocol only.

Five reads: `stats` (the idempotency keys remembered, delayed messages, the oldest ready
message's age and the ready and busy groups too), `groups` for every group (the deepest
are listed; all are needed to find the first message in line, the lowest seq at a
head), `held_groups`, `paused_groups` and `tenants`. Never a claim, never a write.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import click

from transports_cli._output import count_option, emit_json, print_table, url_argument
from transports_cli.admin._access import all_groups, open_admin, plural, relative
from transports_core import GroupInfo, PriorityStats, QueueStats, TenantInfo, redact_url

__all__ = ["inspect"]

_STATE = {"ready": "ready", "in_flight": "in flight", "parked": "parked", "held": "held"}


def _oldest(groups: list[GroupInfo]) -> GroupInfo | None:
    """The group whose head is the oldest waiting message. A held group's head is its dead
    letter, not a waiting message, so held groups are left out (they are listed apart)."""
    waiting = [g for g in groups if g.state != "held"]
    return min(waiting, key=lambda g: g.head_seq, default=None)


def _oldest_json(group: GroupInfo | None) -> dict[str, Any] | None:
    if group is None:
        return None
    return {
        "seq": group.head_seq,
        "group_id": group.group_id,
        "priority": group.priority,
        "state": group.state,
    }


@click.command(short_help="Show what a queue holds: totals, deepest groups, oldest message.")
@url_argument()
@count_option("--limit", 1, 10_000, "How many of the deepest groups to list.", default=10)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def inspect(url: str, limit: int, as_json: bool) -> None:
    """Show how many messages a queue holds (ready, in flight, parked, delayed, dead), in
    total and per priority, with how long the oldest ready message has waited and how
    many groups are ready or busy; how many idempotency keys it remembers; the groups
    with the deepest backlog; the first message in line (the lowest seq at a group's
    head); groups held by a dead letter; paused groups; and tenants with their weights.

    Works with every backend that implements the admin interface
    (transports_core.TransportAdmin). It only reads: it takes no lease and changes
    nothing. A SQLite URL must name an existing file.

    \b
    Example:
      transports inspect sqlite:///queue.db
      transports inspect sqlite:///queue.db --limit 3
      transports inspect sqlite:///queue.db --json | jq .totals
    """
    with open_admin(url) as admin:
        stats = admin.stats()
        every = all_groups(admin, stats)
        held = admin.held_groups()
        paused = admin.paused_groups()
        tenants = admin.tenants()
    deepest = every[:limit]  # groups() lists the deepest first
    now = time.time()
    oldest = _oldest(every)
    oldest_by_priority = {
        p.priority: _oldest([g for g in every if g.priority == p.priority])
        for p in stats.by_priority
    }
    if as_json:
        emit_json(
            {
                "url": redact_url(url),
                "totals": {
                    "ready": stats.ready,
                    "in_flight": stats.in_flight,
                    "parked": stats.parked,
                    "delayed": stats.delayed,
                    "dead": stats.dead,
                },
                "oldest_ready_age": stats.oldest_ready_age,
                "ready_groups": stats.ready_groups,
                "busy_groups": stats.busy_groups,
                "keys": stats.keys,
                "by_priority": [
                    {**asdict(p), "oldest": _oldest_json(oldest_by_priority[p.priority])}
                    for p in stats.by_priority
                ],
                "oldest": _oldest_json(oldest),
                "groups_total": len(every),
                "groups": [asdict(g) for g in deepest],
                "held_groups": [asdict(h) for h in held],
                "paused_groups": paused,
                "tenants": [asdict(t) for t in tenants],
            }
        )
        return

    messages = stats.ready + stats.in_flight + stats.parked + stats.delayed
    click.echo(
        f"Queue {redact_url(url)}: {plural(messages, 'message')} in "
        f"{plural(len(every), 'group')}, {plural(stats.dead, 'dead letter')}, "
        f"{plural(stats.keys, 'idempotency key')}"
    )
    _paused_and_tenants(paused, tenants)
    if not stats.by_priority:
        return
    click.echo()
    rows: list[tuple[str, PriorityStats | QueueStats, GroupInfo | None]] = [
        (str(p.priority), p, oldest_by_priority[p.priority]) for p in stats.by_priority
    ]
    rows.append(("total", stats, oldest))
    print_table(
        [
            "priority",
            "ready",
            "in flight",
            "parked",
            "delayed",
            "dead",
            "groups ready/busy",
            "oldest ready",
            "first seq",
        ],
        [
            [
                label,
                *(str(n) for n in (c.ready, c.in_flight, c.parked, c.delayed, c.dead)),
                f"{c.ready_groups}/{c.busy_groups}",
                "-" if c.oldest_ready_age is None else f"{c.oldest_ready_age:.1f} s",
                str(head.head_seq) if head else "-",
            ]
            for label, c, head in rows
        ],
    )
    if oldest is not None:
        click.echo(
            f"\nFirst in line: seq {oldest.head_seq}, head of group "
            f"{oldest.group_id!r} (priority {oldest.priority}, {_STATE[oldest.state]})"
        )
    if deepest:
        shown = f"{len(deepest)} of {len(every)}" if len(every) > len(deepest) else "all"
        click.echo(f"\nDeepest groups ({shown}):")
        print_table(
            ["group", "priority", "depth", "head seq", "state", "busy until", "last claimed"],
            [
                [
                    g.group_id,
                    str(g.priority),
                    str(g.depth),
                    str(g.head_seq),
                    _STATE[g.state],
                    relative(g.busy_until, now),
                    "never" if g.last_claimed_at is None else relative(g.last_claimed_at, now),
                ]
                for g in deepest
            ],
        )
    if held:
        click.echo(f"\nHeld by a dead letter ({len(held)}; see 'transports dead'):")
        print_table(
            ["group", "dead seq", "waiting", "since"],
            [[h.group_id, str(h.seq), str(h.waiting), relative(h.since, now)] for h in held],
        )


def _paused_and_tenants(paused: list[str], tenants: list[TenantInfo]) -> None:
    """The paused groups, and the tenants when any group has one or a weight is set."""
    if paused:
        click.echo(f"Paused groups ({len(paused)}): {', '.join(paused)}")
    if any(t.tenant is not None for t in tenants):
        click.echo(
            "Tenants: "
            + ", ".join(
                f"{t.tenant or '(none)'} weight {t.weight}, {plural(t.groups, 'group')}"
                for t in tenants
            )
        )
