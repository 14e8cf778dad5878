"""Delayed publishes, holds, pauses and tenants on the PostgreSQL backend: the in-place
upgrade of a version 3 store, publishes with options inside a caller's transaction, and
due messages joining their groups while several processes claim and publish."""

from __future__ import annotations

import multiprocessing
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from transports_core import Event, Transport, TransportAdmin, TransportError, open_transport
from transports_postgres import PostgresTransport
from transports_postgres import _sql as sql

from . import _workers
from .server import with_schema

Conn = psycopg.Connection[Any]

# --- the schema before timers --------------------------------------------------------------------


def _make_version_3(raw: Conn, schema: str) -> None:
    """A store as version 3 made it: today's DDL but for what version 4 added (with the
    ready index as it was then), holding what version 3 stored: group g with two messages,
    and group p whose head is parked for an hour."""
    raw.execute(sql.CREATE_SCHEMA.render(schema))
    values = {"owner": sql.OWNER, "version": "3"}
    for statement in sql.SCHEMA:
        if statement in sql.TIMERS_SCHEMA or statement in sql.READY_SCHEMA:
            continue
        raw.execute(statement.render(schema), {n: values[n] for n in statement.names})
    s = f'"{schema}"'
    raw.execute(f"CREATE INDEX groups_ready ON {s}.groups (last_claimed_at, head_seq) WHERE free")
    raw.execute(
        f"INSERT INTO {s}.messages (group_id, seq, priority, event) "
        f"SELECT g, nextval('{s}.seqs'), 0, e "
        "FROM (VALUES ('g', %s), ('g', %s), ('p', %s)) v (g, e)",
        [Event(n=n).model_dump_json() for n in (1, 2, 3)],
    )
    raw.execute(
        f"INSERT INTO {s}.groups (group_id, priority, head_seq, depth) VALUES ('g', 0, 1, 2)"
    )
    raw.execute(
        f"INSERT INTO {s}.groups (group_id, priority, head_seq, depth, attempt, locked_by, "
        "lock_expiry, busy_until) VALUES ('p', 0, 3, 1, 1, %s, "
        "date_part('epoch', now()) + 3600, date_part('epoch', now()) + 3600)",
        (sql.PARKED,),
    )


def _with(url: str, schema: str) -> str:
    return with_schema(url, schema, pool_min_size=0, pool_max_size=2, migrate="auto")


def _drain(transport: Transport[Event]) -> list[Any]:
    leases = []
    while (lease := transport.claim("drain", 30)) is not None:
        leases.append(lease)
        transport.ack(lease)
    return leases


def test_a_version_3_store_is_refused_on_opening_naming_transports_migrate(
    queue_url: str, raw: Conn, schema: str
) -> None:
    _make_version_3(raw, schema)
    with pytest.raises(TransportError, match=r"version 3.*migrate=auto.*`transports migrate "):
        open_transport(queue_url)
    version = raw.execute(f"SELECT value FROM \"{schema}\".meta WHERE key = 'version'")
    assert version.fetchone() == ("3",)


def test_a_version_3_store_is_upgraded_when_opened_with_migrate_auto_and_keeps_its_messages(
    queue_url: str, raw: Conn, schema: str
) -> None:
    _make_version_3(raw, schema)
    queue_url += "&migrate=auto"
    opened: list[Transport[Event]] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(open_transport(queue_url))
        except BaseException as exc:
            errors.append(exc)

    # Several openers at once: one upgrades, the others find it done.
    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        assert len(opened) == 4
        version = raw.execute(f"SELECT value FROM \"{schema}\".meta WHERE key = 'version'")
        assert version.fetchone() == (str(sql.SCHEMA_VERSION),)
        queue = opened[0]
        assert isinstance(queue, TransportAdmin)
        stats = queue.stats()
        assert (stats.ready, stats.parked, stats.delayed, stats.paused) == (2, 1, 0, 0)
        assert queue.publish("g", Event(n=4), delay=3600) == 4
        assert queue.pause_group("p") is True
        assert [(m.seq, m.event.n) for m in _drain(queue)] == [(1, 1), (2, 2)]
        assert [(m.seq, m.state) for m in queue.peek("g")] == [(4, "delayed")]
        assert [(m.seq, m.state) for m in queue.peek("p")] == [(3, "parked")]
    finally:
        for transport in opened:
            transport.close()


def _shape(raw: Conn, schema: str) -> list[tuple[str, ...]]:
    """Relations, columns and index definitions of ``schema``, with its name taken out."""
    relations = raw.execute(
        "SELECT c.relname, c.relkind::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
        (schema,),
    ).fetchall()
    columns = raw.execute(
        "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '') "
        "FROM information_schema.columns WHERE table_schema = %s",
        (schema,),
    ).fetchall()
    indexes = raw.execute(
        "SELECT indexname, replace(indexdef, %s, '') FROM pg_indexes WHERE schemaname = %s",
        (schema, schema),
    ).fetchall()
    return sorted(tuple(map(str, row)) for row in [*relations, *columns, *indexes])


def test_an_upgraded_store_has_what_a_new_one_has(schema_url: tuple[str, str], raw: Conn) -> None:
    url, schema = schema_url
    _make_version_3(raw, schema)
    open_transport(_with(url, schema)).close()
    upgraded = _shape(raw, schema)
    raw.execute(f'DROP SCHEMA "{schema}" CASCADE')
    open_transport(_with(url, schema)).close()
    assert upgraded == _shape(raw, schema)


# --- within: a caller's transaction ---------------------------------------------------------


def test_publishes_with_options_inside_a_callers_transaction(queue_url: str, raw: Conn) -> None:
    with open_transport(queue_url) as queue:
        assert isinstance(queue, PostgresTransport)
        server = queue_url.partition("?")[0]
        with psycopg.connect(server) as conn:
            within = queue.within(conn)
            within.publish("g", Event(n=1), delay=3600)
            within.publish("h", Event(n=2), tenant="t", key="k")
            within.publish_many([("g", Event(n=3), 0)])
            conn.rollback()
            stats = queue.stats()
            assert (stats.ready, stats.delayed, stats.keys) == (0, 0, 0)
            assert queue.tenants() == []
            within = queue.within(conn)
            later = within.publish("g", Event(n=1), delay=3600)
            held = within.publish("g", Event(n=2), delay=3600, hold=True)
            within.publish("h", Event(n=3), tenant="t")
            conn.commit()
        assert [(m.seq, m.state) for m in queue.peek("g")] == [
            (held, "delayed"),
            (later, "delayed"),
        ]
        assert [(t.tenant, t.groups) for t in queue.tenants()] == [(None, 1), ("t", 1)]
        lease = queue.claim("w", 30)
        assert lease is not None
        assert (lease.group_id, lease.event.n) == ("h", 3)
        queue.ack(lease)
        assert queue.claim("w", 30) is None


# --- due messages while processes claim and publish ------------------------------------------

GROUPS = [f"g{i}" for i in range(8)]
DELAYED = 400
PLAIN = 400


def test_due_messages_join_their_groups_once_in_due_order_under_concurrent_claims(
    queue_url: str, raw: Conn, schema: str, tmp_path: Path
) -> None:
    # Delayed messages due over a second and a half, each group's due times rising with
    # its seqs, published before four processes drain the queue while a fifth publishes
    # plain messages to the same groups. Every message must come exactly once, each
    # group's delayed messages in seq order, and its plain ones too.
    with open_transport(queue_url) as queue:
        delayed = queue.publish_many([_delayed(GROUPS[i % len(GROUPS)], i) for i in range(DELAYED)])
    spawn = multiprocessing.get_context("spawn")
    journals = [tmp_path / f"w{i}.txt" for i in range(4)]
    workers = [
        spawn.Process(target=_workers.drain, args=(queue_url, f"w{i}", str(j), 3.0))
        for i, j in enumerate(journals)
    ]
    publisher = spawn.Process(
        target=_workers.publish_plain, args=(queue_url, GROUPS, PLAIN, DELAYED)
    )
    for process in (*workers, publisher):
        process.start()
    for process in (publisher, *workers):
        process.join(120)
        assert process.exitcode == 0
    delivered: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    seqs: list[int] = []
    for journal in journals:
        for line in journal.read_text().splitlines():
            seq, group, n, _, claimed_at, _ = line.split()
            delivered[group].append((float(claimed_at), int(n), int(seq)))
            seqs.append(int(seq))
    assert len(seqs) == len(set(seqs)) == DELAYED + PLAIN, "each message exactly once"
    assert set(delayed) <= set(seqs)
    for group, got in delivered.items():
        order = [n for _, n, _ in sorted(got)]
        timed = [n for n in order if n < DELAYED]
        plain = [n for n in order if n >= DELAYED]
        assert timed == sorted(timed), f"{group}: delayed messages out of due order"
        assert plain == sorted(plain), f"{group}: plain messages out of order"
    left = raw.execute(f'SELECT count(*) FROM "{schema}".timers').fetchone()
    assert left == (0,)


def _delayed(group: str, i: int) -> Any:
    from transports_core import Message

    return Message(group, Event(n=i), delay=0.2 + 1.5 * i / DELAYED)
