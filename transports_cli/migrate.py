"""``transports migrate URL``: create or upgrade a queue's schema, or, with ``--sql``,
print the DDL that would do it, for a DBA to review and run.

Backend-neutral: the backend says what its schema needs (`transports_core.migrate`); a
backend that keeps no schema (Redis) has nothing to migrate, which is no failure.
"""

from __future__ import annotations

import click

import transports_core

from ._output import url_argument
from .admin._access import refuse_private

__all__ = ["migrate"]


@click.command(short_help="Create or upgrade a queue's schema, or print its DDL (--sql).")
@url_argument()
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Print the DDL (one transaction) instead of running it; changes nothing.",
)
def migrate(url: str, as_sql: bool) -> None:
    """Bring the schema of the queue at URL to this version's: create it when there is
    none, upgrade it when it is older. Prints what it did; says so when the schema is
    current already (exit 0 either way).

    With --sql, only read, and print the statements instead, their values written in
    as SQL literals, in one transaction (BEGIN ... COMMIT), for a DBA to review and
    run with psql (PostgreSQL) or sqlite3. An application may then open the queue as a
    role that may only read and write its tables (see docs/postgres.md).

    Redis keeps no schema: there is nothing to migrate.

    \b
    Example:
      transports migrate postgresql://admin@db/app?schema=orders
      transports migrate --sql postgresql://admin@db/app?schema=orders > orders.sql
      TRANSPORTS_URL=sqlite:///queue.db transports migrate
    """
    refuse_private(url, "there is no schema to migrate that anyone else would see")
    shown = transports_core.redact_url(url)
    done = transports_core.migrate(url, apply=not as_sql)
    comment = "-- " if as_sql else ""
    if done is None:
        scheme = url.partition("://")[0]
        click.echo(f"{comment}{shown}: the {scheme!r} backend keeps no schema: nothing to migrate")
        return
    if done.found == "current":
        click.echo(
            f"{comment}{shown}: the queue's schema is at version {done.target}, this "
            "version's: nothing to migrate"
        )
        return
    what = (
        f"create the queue's schema at version {done.target}"
        if done.found == "missing"
        else f"upgrade the queue's schema from version {done.version} to {done.target}"
    )
    if as_sql:
        click.echo(f"-- {shown}: the statements that {what}\n")
        click.echo(done.script(), nl=False)
        return
    past = (
        f"created the queue's schema at version {done.target}"
        if done.found == "missing"
        else f"upgraded the queue's schema from version {done.version} to {done.target}"
    )
    click.echo(f"{shown}: {past}")
