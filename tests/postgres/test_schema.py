"""The schema: created once under the advisory lock by concurrent openers, adopted when
empty, and refused (untouched) when it belongs to someone else or to another version.
Also the fairness bound of parallel claims, staged with held group rows."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from transports_core import Event, Transport, TransportError, open_transport
from transports_postgres import _sql as sql

from .server import with_schema


def _tables(raw: psycopg.Connection[Any], schema: str) -> list[str]:
    rows = raw.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1",
        (schema,),
    ).fetchall()
    return [row[0] for row in rows]


def test_concurrent_first_opens_create_the_schema_once(
    queue_url: str, raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    errors: list[BaseException] = []
    opened: list[Transport[Event]] = []

    def open_one() -> None:
        try:
            opened.append(open_transport(queue_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for transport in opened:
        transport.close()
    assert errors == []
    assert len(opened) == 4
    assert _tables(raw, schema_url[1]) == [
        "dead_letters",
        "groups",
        "keys",
        "messages",
        "meta",
        "paused",
        "tenants",
        "timers",
        "vclock",
        "waiters",
    ]


def test_an_empty_schema_is_adopted(
    queue_url: str, raw: psycopg.Connection[Any], schema_url: tuple[str, str]
) -> None:
    raw.execute(f'CREATE SCHEMA "{schema_url[1]}"')
    with open_transport(queue_url) as queue:
        assert queue.publish("g", Event(n=1)) == 1


@pytest.mark.parametrize(
    ("found", "refusal", "tables"),
    [
        (["CREATE TABLE {s}.invoices (id int)"], "not a durable-transports queue", ["invoices"]),
        (
            [
                "CREATE TABLE {s}.meta (key text, value text)",
                "INSERT INTO {s}.meta VALUES ('owner', 'someone-else')",
            ],
            "belongs to something else",
            ["meta"],
        ),
    ],
    ids=["foreign-tables", "foreign-meta"],
)
def test_a_foreign_schema_is_refused_and_left_alone(
    queue_url: str,
    raw: psycopg.Connection[Any],
    schema: str,
    found: list[str],
    refusal: str,
    tables: list[str],
) -> None:
    raw.execute(f'CREATE SCHEMA "{schema}"')
    for statement in found:
        raw.execute(statement.format(s=f'"{schema}"'))
    with pytest.raises(TransportError, match=refusal):
        open_transport(queue_url)
    assert _tables(raw, schema) == tables


def test_another_schema_version_is_refused_naming_both(
    queue: Transport[Event],
    queue_url: str,
    raw: psycopg.Connection[Any],
    schema_url: tuple[str, str],
) -> None:
    raw.execute(f"UPDATE \"{schema_url[1]}\".meta SET value = '99' WHERE key = 'version'")
    with pytest.raises(TransportError, match=f"version 99.*version {sql.SCHEMA_VERSION}"):
        open_transport(queue_url)


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_an_older_version_is_upgraded_only_from_those_the_code_knows(
    queue: Transport[Event],
    queue_url: str,
    raw: psycopg.Connection[Any],
    schema_url: tuple[str, str],
    version: str,
) -> None:
    # 3 and 4 may be upgraded in place (with ?migrate=auto, or `transports migrate`);
    # anything older is refused naming both versions, even with ?migrate=auto.
    raw.execute(f"UPDATE \"{schema_url[1]}\".meta SET value = %s WHERE key = 'version'", (version,))
    if int(version) in sql.UPGRADES_FROM:
        refusal = f"version {version}, .* needs version {sql.SCHEMA_VERSION}.*transports migrate"
    else:
        refusal = f"version {version}; .* knows version {sql.SCHEMA_VERSION}"
    with pytest.raises(TransportError, match=refusal):
        open_transport(queue_url)
    if int(version) not in sql.UPGRADES_FROM:
        with pytest.raises(TransportError, match=refusal):
            open_transport(queue_url + "&migrate=auto")


def test_a_password_in_the_url_never_shows_in_an_error(schema_url: tuple[str, str]) -> None:
    url = with_schema("postgresql://nobody:s3cret@127.0.0.1:1/test", schema_url[1])
    with pytest.raises(TransportError) as caught:
        open_transport(url, pool_timeout=1)
    assert "s3cret" not in str(caught.value)
    assert "***" in str(caught.value)


@pytest.mark.parametrize("in_flight", [1, 3])
def test_a_claim_serves_one_of_the_oldest_ready_groups_past_those_held(
    queue: Transport[Event],
    raw: psycopg.Connection[Any],
    schema_url: tuple[str, str],
    in_flight: int,
) -> None:
    # With C other transactions holding group rows (claims, publishes, acks in flight), a
    # claim serves the oldest group nobody holds: one of the C + 1 oldest ready groups.
    url, schema = schema_url
    for g in range(6):
        queue.publish(f"g{g}", Event(n=g))
    holders = [psycopg.connect(url, autocommit=True) for _ in range(in_flight)]
    try:
        for index, holder in enumerate(holders):
            holder.execute("BEGIN")
            holder.execute(
                f'SELECT 1 FROM "{schema}".groups WHERE group_id = %s FOR UPDATE', (f"g{index}",)
            )
        lease = queue.claim("w", 60)
        assert lease is not None
        assert lease.group_id == f"g{in_flight}"
    finally:
        for holder in holders:
            holder.execute("ROLLBACK")  # the locks go now, not when the server notices
            holder.close()
    # Once the others let go, the overtaken groups come next, oldest first.
    order = []
    while (next_lease := queue.claim("w", 60)) is not None:
        order.append(next_lease.group_id)
    assert order[:in_flight] == [f"g{index}" for index in range(in_flight)]
