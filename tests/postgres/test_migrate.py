"""``transports migrate`` on PostgreSQL: it creates a queue's schema, upgrades one at the
version before, and is a no-op on a current one; ``--sql`` prints DDL that a DBA can run
as it is; and a role that may only use the tables (no CREATE anywhere) works a queue so
made, and is told to run ``transports migrate`` where a queue is missing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.cli._command import transports
from transports_core import (
    Event,
    Transport,
    TransportAdmin,
    TransportError,
    migrate,
    open_async_transport,
    open_transport,
)
from transports_core.conformance import ManualClock
from transports_postgres import _sql as sql

from .server import drop_schema, with_schema
from .test_timers import _make_version_3, _shape

Conn = psycopg.Connection[Any]


def _version(raw: Conn, schema: str) -> str:
    row = raw.execute(f"SELECT value FROM \"{schema}\".meta WHERE key = 'version'").fetchone()
    assert row is not None
    return str(row[0])


def _run_script(url: str, script: str) -> None:
    """Run ``script`` as a DBA would: with psql, stopping at the first error, where psql
    is installed; else in one go through psycopg (a query without parameters may hold
    several statements)."""
    psql = shutil.which("psql")
    if psql is None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(script.encode())
        return
    done = subprocess.run(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_migrate_creates_a_schema_then_finds_it_current(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    target = with_schema(url, schema)
    made = transports("migrate", target)
    assert made.returncode == 0, made.stderr
    assert f"created the queue's schema at version {sql.SCHEMA_VERSION}" in made.stdout
    assert _version(raw, schema) == str(sql.SCHEMA_VERSION)
    again = transports("migrate", target)
    assert again.returncode == 0, again.stderr
    assert "nothing to migrate" in again.stdout
    as_sql = transports("migrate", "--sql", target)
    assert as_sql.returncode == 0, as_sql.stderr
    assert as_sql.stdout.startswith("-- ")
    assert "nothing to migrate" in as_sql.stdout
    assert "CREATE" not in as_sql.stdout
    # Opening it changes nothing, and may not: migrate=never.
    with open_transport(with_schema(url, schema, migrate="never")) as queue:
        assert queue.publish("g", Event(n=1)) == 1


def test_migrate_upgrades_a_version_3_schema_in_place(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    _make_version_3(raw, schema)
    done = transports("migrate", with_schema(url, schema))
    assert done.returncode == 0, done.stderr
    assert f"from version 3 to {sql.SCHEMA_VERSION}" in done.stdout
    assert _version(raw, schema) == str(sql.SCHEMA_VERSION)
    with open_transport(with_schema(url, schema, migrate="never")) as queue:
        assert isinstance(queue, TransportAdmin)
        stats = queue.stats()
        assert (stats.ready, stats.parked) == (2, 1)


def test_the_printed_upgrade_runs_as_it_is_and_leaves_a_new_schemas_shape(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    _make_version_3(raw, schema)
    printed = transports("migrate", "--sql", with_schema(url, schema))
    assert printed.returncode == 0, printed.stderr
    assert _version(raw, schema) == "3"  # --sql changed nothing
    assert f"from version 3 to {sql.SCHEMA_VERSION}" in printed.stdout
    _run_script(url, printed.stdout)
    upgraded = _shape(raw, schema)
    raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert migrate(with_schema(url, schema)) is not None
    assert upgraded == _shape(raw, schema)


def test_the_printed_ddl_creates_a_schema_that_opens_without_creating_anything(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    target = with_schema(url, schema)
    printed = transports("migrate", "--sql", target)
    assert printed.returncode == 0, printed.stderr
    text = printed.stdout
    blocks = [block for block in text.split("\n\n") if not block.startswith("--")]
    assert blocks[0] == "BEGIN;"
    assert blocks[-1] == "COMMIT;\n"
    assert all(block.rstrip().endswith(";") for block in blocks)
    assert f'CREATE TABLE "{schema}".meta' in text
    # The values are literals in the text, not placeholders.
    assert f"('version', '{sql.SCHEMA_VERSION}')" in text
    assert "%(" not in text
    assert (
        raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None
    )
    _run_script(url, text)
    printed_shape = _shape(raw, schema)
    with open_transport(with_schema(url, schema, migrate="never")) as queue:
        assert queue.publish("g", Event(n=1)) == 1
    # The same shape as a schema that migrate itself (or an opener) creates.
    drop_schema(url, schema)
    transports("migrate", target)
    assert printed_shape == _shape(raw, schema)


def test_migrate_never_prints_the_password(schema_url: tuple[str, str]) -> None:
    url, schema = schema_url
    parts = urlsplit(url)
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:Pw0rdS3cret@{host}" + (f":{parts.port}" if parts.port else "")
    secret_url = with_schema(urlunsplit(parts._replace(netloc=netloc)), schema)
    for args in (["migrate", "--sql"], ["migrate"], ["migrate"], ["migrate", "--sql"]):
        done = transports(*args, secret_url)
        assert "Pw0rdS3cret" not in done.stdout + done.stderr
        assert ":***@" in done.stdout + done.stderr
    # Through TRANSPORTS_URL too.
    done = transports("migrate", env={"TRANSPORTS_URL": secret_url})
    assert done.returncode == 0, done.stderr
    assert "Pw0rdS3cret" not in done.stdout + done.stderr


# --- a role that may only use the tables ---------------------------------------------------


@pytest.fixture
def app_role(schema_url: tuple[str, str], raw: Conn) -> Iterator[tuple[str, str]]:
    """A login role with no CREATE anywhere (the server's defaults give it none), and its
    URL on the server; dropped, with every privilege it was granted, at the end."""
    url, _ = schema_url
    role = f"tp_app_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    raw.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
    parts = urlsplit(url)
    netloc = f"{role}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    try:
        yield role, urlunsplit(parts._replace(netloc=netloc))
    finally:
        raw.execute(f'DROP OWNED BY "{role}"')
        raw.execute(f'DROP ROLE "{role}"')


def _grant_use(raw: Conn, schema: str, role: str) -> None:
    """What a DBA grants an application: use of the schema, and of its tables and
    sequences, and nothing that creates or alters."""
    s, r = f'"{schema}"', f'"{role}"'
    raw.execute(f"GRANT USAGE ON SCHEMA {s} TO {r}")
    raw.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}")
    raw.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {r}")


def test_a_role_with_only_table_rights_works_a_migrated_queue(
    schema_url: tuple[str, str], raw: Conn, app_role: tuple[str, str]
) -> None:
    url, schema = schema_url
    role, role_server = app_role
    made = transports("migrate", with_schema(url, schema))
    assert made.returncode == 0, made.stderr
    _grant_use(raw, schema, role)
    can_create = raw.execute(
        "SELECT has_database_privilege(%s, current_database(), 'CREATE'), "
        "has_schema_privilege(%s, %s, 'CREATE')",
        (role, role, schema),
    ).fetchone()
    assert can_create == (False, False)
    role_url = with_schema(role_server, schema, pool_min_size=0, pool_max_size=2)
    with open_transport(role_url) as queue:
        assert isinstance(queue, TransportAdmin)
        assert queue.publish("g", Event(n=1)) == 1
        assert queue.publish("g", Event(n=2), key="k") == 2
        assert queue.publish("h", Event(n=3), delay=3600) == 3
        lease = queue.claim("w", 30)
        assert lease is not None
        assert lease.event == Event(n=1)
        queue.ack(lease)
        stats = queue.stats()
        assert (stats.ready, stats.in_flight, stats.delayed) == (1, 0, 1)

    async def async_twin() -> int:
        async with open_async_transport(role_url) as queue:
            lease = await queue.claim("w", 30)
            assert lease is not None
            await queue.ack(lease)
            return await queue.publish("g", Event(n=4))

    assert asyncio.run(async_twin()) == 4
    # The role's session never got to create or alter anything.
    assert _version(raw, schema) == str(sql.SCHEMA_VERSION)


def test_a_role_without_create_is_told_to_migrate_a_missing_queue(
    schema_url: tuple[str, str], raw: Conn, app_role: tuple[str, str]
) -> None:
    _, schema = schema_url
    _, role_server = app_role
    with pytest.raises(TransportError) as caught:
        open_transport(with_schema(role_server, schema, pool_min_size=0))
    message = str(caught.value)
    assert repr(schema) in message
    assert "transports migrate" in message
    assert "CREATE privilege" in message
    assert not isinstance(caught.value.__cause__, psycopg.Error)
    assert "***" in message  # the URL to migrate, its password blanked
    assert app_role[1].split("@")[0].split(":")[-1] not in message
    assert (
        raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None
    )


def test_a_role_given_an_empty_schema_without_create_on_it_is_told_to_migrate(
    schema_url: tuple[str, str], raw: Conn, app_role: tuple[str, str]
) -> None:
    _, schema = schema_url
    role, role_server = app_role
    raw.execute(f'CREATE SCHEMA "{schema}"')
    raw.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
    with pytest.raises(TransportError, match=r"(?s)has no queue yet.*transports migrate"):
        open_transport(with_schema(role_server, schema, pool_min_size=0))


def test_an_empty_schema_is_filled_by_a_role_with_create_on_it_only(
    schema_url: tuple[str, str], raw: Conn, app_role: tuple[str, str]
) -> None:
    # CREATE SCHEMA IF NOT EXISTS would ask for the database's CREATE privilege.
    _, schema = schema_url
    role, role_server = app_role
    raw.execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION "{role}"')
    with open_transport(with_schema(role_server, schema, pool_min_size=0)) as queue:
        assert queue.publish("g", Event(n=1)) == 1


def test_migrate_never_refuses_a_missing_queue_and_creates_nothing(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    with pytest.raises(TransportError, match=r"migrate=never.*transports migrate"):
        open_transport(with_schema(url, schema, migrate="never"))
    assert (
        raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None
    )


# --- version 4: before each message kept when it became ready -------------------------------


def _make_version_4(raw: Conn, schema: str) -> None:
    """A store as version 4 made it: today's DDL but for what version 5 added, holding
    group g with two messages, group p whose head is parked for an hour with one behind,
    group h whose head is a held dead letter with one behind, group x (priority 2) whose
    head was published with hold=True and is due in an hour, and a delayed message."""
    raw.execute(sql.CREATE_SCHEMA.render(schema))
    values = {"owner": sql.OWNER, "version": "4"}
    for statement in sql.SCHEMA:
        if statement not in sql.READY_SCHEMA:
            raw.execute(statement.render(schema), {n: values[n] for n in statement.names})
    s = f'"{schema}"'
    events = [Event(n=n).model_dump_json() for n in range(1, 9)]
    raw.execute(
        f"INSERT INTO {s}.messages (group_id, seq, priority, event, not_before) "
        "SELECT g, n, p, e, CASE WHEN g = 'x' THEN date_part('epoch', now()) + 3600 END "
        "FROM unnest(%s::text[], %s::int[], %s::int[], %s::text[]) AS v (g, n, p, e)",
        (
            ["g", "g", "p", "p", "h", "h", "x"],
            [1, 2, 3, 4, 5, 6, 7],
            [0, 0, 0, 0, 0, 0, 2],
            events[:7],
        ),
    )
    raw.execute(f"SELECT setval('{s}.seqs', 8)")
    hour = "date_part('epoch', now()) + 3600"
    raw.execute(
        f"INSERT INTO {s}.groups (group_id, priority, head_seq, depth, attempt, locked_by, "
        "lock_expiry, busy_until) VALUES "
        "('g', 0, 1, 2, 0, NULL, NULL, NULL), "
        f"('p', 0, 3, 2, 1, %(parked)s, {hour}, {hour}), "
        "('h', 0, 5, 2, 1, %(parked)s, 'Infinity', 'Infinity'), "
        f"('x', 2, 7, 1, 0, %(delayed)s, {hour}, {hour})",
        {"parked": sql.PARKED, "delayed": sql.DELAYED},
    )
    raw.execute(
        f"INSERT INTO {s}.dead_letters (seq, group_id, priority, event, attempts, reason, "
        "dead_at) VALUES (5, 'h', 0, %s, 1, 'buried: bad', date_part('epoch', now()))",
        (events[4],),
    )
    raw.execute(
        f"INSERT INTO {s}.timers (seq, group_id, priority, event, due) "
        f"VALUES (8, 't', 1, %s, {hour})",
        (events[7],),
    )


def test_a_version_4_store_is_refused_on_opening_naming_transports_migrate(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    _make_version_4(raw, schema)
    with pytest.raises(TransportError, match=r"version 4.*migrate=auto.*`transports migrate "):
        open_transport(with_schema(url, schema))
    assert _version(raw, schema) == "4"


def test_migrate_upgrades_a_version_4_store_its_ready_messages_aged_from_the_upgrade(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    _make_version_4(raw, schema)
    before = time.time()
    done = transports("migrate", with_schema(url, schema))
    assert done.returncode == 0, done.stderr
    assert f"from version 4 to {sql.SCHEMA_VERSION}" in done.stdout
    assert _version(raw, schema) == str(sql.SCHEMA_VERSION)
    with open_transport(with_schema(url, schema, migrate="never")) as queue:
        assert isinstance(queue, TransportAdmin)
        stats = queue.stats()
        after = time.time()
        # Ready: g's two, the one behind p's parked head, the one behind h's dead letter.
        assert (stats.ready, stats.parked, stats.dead, stats.delayed) == (4, 1, 1, 2)
        assert stats.oldest_ready_age is not None
        assert 0 <= stats.oldest_ready_age <= after - before + 0.01
        assert (stats.ready_groups, stats.busy_groups) == (1, 3)
        (x,) = [p for p in stats.by_priority if p.priority == 2]
        assert (x.ready, x.oldest_ready_age, x.ready_groups, x.busy_groups) == (0, None, 0, 1)
        assert [(m.seq, m.event.n) for m in _drain(queue)] == [(1, 1), (2, 2)]


def test_a_version_4_store_opened_with_migrate_auto_ages_from_the_openers_clock(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    _make_version_4(raw, schema)
    clock = ManualClock(time.time() + 1000)  # well after the server's clock
    with open_transport(with_schema(url, schema, migrate="auto"), clock=clock) as queue:
        assert isinstance(queue, TransportAdmin)
        assert _version(raw, schema) == str(sql.SCHEMA_VERSION)
        clock.advance(30)
        stats = queue.stats()
        assert stats.oldest_ready_age == pytest.approx(30, abs=1e-3)
        # The held dead letter requeued is ready again, from now; the upgrade made its
        # group's priority and time for it as for the others.
        clock.advance(5)
        assert queue.requeue(5) is True
        stats = queue.stats()
        assert stats.ready == 5
        assert stats.oldest_ready_age == pytest.approx(35, abs=1e-3)


def test_the_printed_upgrade_from_4_runs_as_it_is_and_leaves_a_new_schemas_shape(
    schema_url: tuple[str, str], raw: Conn
) -> None:
    url, schema = schema_url
    _make_version_4(raw, schema)
    printed = transports("migrate", "--sql", with_schema(url, schema))
    assert printed.returncode == 0, printed.stderr
    assert _version(raw, schema) == "4"  # --sql changed nothing
    assert f"from version 4 to {sql.SCHEMA_VERSION}" in printed.stdout
    _run_script(url, printed.stdout)
    assert _version(raw, schema) == str(sql.SCHEMA_VERSION)
    upgraded = _shape(raw, schema)
    raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert migrate(with_schema(url, schema)) is not None
    assert upgraded == _shape(raw, schema)


def _drain(queue: Transport[Event]) -> list[Any]:
    leases = []
    while (lease := queue.claim("drain", 30)) is not None:
        leases.append(lease)
        queue.ack(lease)
    return leases
