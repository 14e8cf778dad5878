"""``python -m bench.batch``: what the batch calls buy on any backend, against the floor
each backend's targets are set by, with the medians and spreads of several rounds.

    python -m bench.batch                                        # SQLite files of its own
    python -m bench.batch --url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.batch --url redis://127.0.0.1:6379/0 --rounds 9 -n 5000
    python -m bench.batch --limit 100                            # batches of 100, not 50
    python -m bench.batch --quick                                # seconds: checks the command

On a server, the run gets a schema or queue of its own (removed at the end) unless the URL
names one. Without a URL, or with a SQLite URL that sets no ``synchronous``, SQLite is
measured twice, at ``synchronous=normal`` and at ``full``.

Each round publishes ``n`` messages over `GROUPS` groups (not timed) and then drains them,
once per case, the cases taken in a different order each round so that a noisy moment
hits them alike. The transport's cases, on every backend:

- ``single``: claim then ack, one message at a time;
- ``batch``: ``claim_many`` of ``--limit`` (50) then ``ack_many`` of those leases;
- ``chain``: a loop of ``ack_and_claim``, one call a message;
- ``chain_async``: the same loop through the async twin (SQLite: its target is there).

And the floors, done with the driver the backend uses, on a store of their own:

- PostgreSQL, ``floor_batch``: psycopg on a plain table, batches of ``--limit``: an
  ``UPDATE ... FOR UPDATE SKIP LOCKED ... RETURNING`` to lease, a ``DELETE ... = ANY``
  to ack, each statement autocommitted as the transport's are. ``floor_groups``: the
  same two statements a batch over a table of groups and one of messages, which keeps
  what the groups cost and nothing else: each group's messages in order, its head
  leased by one worker at a time, the free groups taken in round-robin order; no
  fencing, priorities, pauses, tenants, timers, lapsed leases or dead letters.
- Redis, ``floor``: the round trips of a claim+ack and nothing else, two EVALSHA of a
  script that does nothing per message, over one redis-py connection; ``floor_batch``:
  the same two per batch of ``--limit``.
- SQLite, ``floor``: bare sqlite3 in WAL mode, at the same ``synchronous``, in the same
  directory, on a plain table: an ``UPDATE`` that leases the oldest free row (its own
  commit), then a ``DELETE`` of it (its own commit), per message.

Printed per backend: each case's median rate over the rounds and their range, then each
ratio as the median of the rounds' own ratios (and their range), against the issue's
target where it sets one, with whether it is met.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transports_cli.bench import cases as shared
from transports_core import Event, Transport, open_async_transport, open_transport

from ._scratch import own_queue, scratch

if TYPE_CHECKING:
    import psycopg

EVENT = Event(kind="order.created", order=12345, amount=99.5)
GROUPS = 500
LIMIT = shared.LIMIT  # the batch size
VISIBILITY = shared.VISIBILITY
WORKER = shared.WORKER

# A round of a case: make its n messages ready (not timed), then drain them (timed).
Case = tuple[Callable[[], None], Callable[[], None]]
Result = dict[str, Any]


def _nothing() -> None:
    pass


# -- the floors ---------------------------------------------------------------------------

# PostgreSQL: a plain table, no groups, the same batches in bare SQL.
PG_TABLE = """
CREATE TABLE {t} (
    id          bigserial PRIMARY KEY,
    group_id    text   NOT NULL,
    event       text   NOT NULL,
    locked_by   text,
    lock_expiry float8
)"""
PG_FILL = "INSERT INTO {t} (group_id, event) SELECT g, %s FROM unnest(%s::text[]) AS g"
PG_CLAIM = """
WITH c AS (
    SELECT id FROM {t} WHERE locked_by IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE {t} j SET locked_by = %s, lock_expiry = date_part('epoch', now()) + %s
  FROM c WHERE j.id = c.id
RETURNING j.id, j.group_id, j.event"""
PG_ACK = "DELETE FROM {t} WHERE id = ANY (%s)"


# PostgreSQL: groups in round-robin order, each its messages in order, one leased at a
# time, in bare SQL (no fencing or anything else the transport keeps).
PG_GROUPS_TABLES = (
    """
CREATE TABLE {s}.groups (
    group_id        text    PRIMARY KEY,
    head_seq        bigint  NOT NULL,
    depth           integer NOT NULL,
    locked_by       text,
    busy            boolean NOT NULL DEFAULT false,
    last_claimed_at float8  NOT NULL DEFAULT 0
)""",
    "CREATE INDEX groups_ready ON {s}.groups (last_claimed_at, head_seq) WHERE NOT busy",
    """
CREATE TABLE {s}.messages (
    group_id text      NOT NULL,
    seq      bigserial NOT NULL,
    event    text      NOT NULL,
    PRIMARY KEY (group_id, seq)
)""",
)
PG_GROUPS_FILL = (
    "INSERT INTO {s}.messages (group_id, event) SELECT g, %s FROM unnest(%s::text[]) AS g",
    """
INSERT INTO {s}.groups (group_id, head_seq, depth)
SELECT group_id, min(seq), count(*) FROM {s}.messages GROUP BY group_id""",
)
# The first free groups in round-robin order, locked, leased, with their heads' events.
PG_GROUPS_CLAIM = """
WITH c AS MATERIALIZED (
    SELECT group_id FROM {s}.groups WHERE NOT busy ORDER BY last_claimed_at, head_seq
     LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE {s}.groups g SET busy = true, locked_by = %s, last_claimed_at = date_part('epoch', now())
  FROM c WHERE g.group_id = c.group_id
RETURNING g.group_id, g.head_seq,
          (SELECT event FROM {s}.messages m WHERE m.group_id = g.group_id AND m.seq = g.head_seq)"""
# The acked heads go; each group moves to its next message, free, or goes if it has none.
PG_GROUPS_ACK = """
WITH b AS MATERIALIZED (
    SELECT * FROM unnest(%s::text[], %s::bigint[]) AS b (group_id, seq)
), gone AS (
    DELETE FROM {s}.messages m USING b WHERE m.group_id = b.group_id AND m.seq = b.seq
), nxt AS MATERIALIZED (
    SELECT b.group_id, (SELECT m.seq FROM {s}.messages m
                         WHERE m.group_id = b.group_id AND m.seq > b.seq
                         ORDER BY m.seq LIMIT 1) AS seq
      FROM b
), moved AS (
    UPDATE {s}.groups g SET head_seq = nxt.seq, depth = g.depth - 1, busy = false,
           locked_by = NULL
      FROM nxt WHERE g.group_id = nxt.group_id AND nxt.seq IS NOT NULL
)
DELETE FROM {s}.groups WHERE group_id IN (SELECT group_id FROM nxt WHERE seq IS NULL)"""


@contextmanager
def pg_schema(url: str, prefix: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """An autocommit connection to ``url``'s server and a new schema there (quoted),
    dropped at the end."""
    import psycopg

    conn = psycopg.connect(url.partition("?")[0], autocommit=True)

    def drop(name: str) -> None:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    with conn, scratch(prefix, drop) as name:
        conn.execute(f'CREATE SCHEMA "{name}"')
        yield conn, f'"{name}"'


@contextmanager
def pg_floor(url: str, n: int, limit: int) -> Iterator[Case]:
    """The raw batched floor's round on a PostgreSQL server, in a schema of its own."""
    with pg_schema(url, "bench_batch_floor_") as (conn, schema):
        table = f"{schema}.jobs"
        conn.execute(PG_TABLE.format(t=table))
        groups = [f"g{i % GROUPS}" for i in range(n)]
        raw = EVENT.model_dump_json()
        claim, ack = PG_CLAIM.format(t=table), PG_ACK.format(t=table)

        def fill() -> None:
            conn.execute(PG_FILL.format(t=table), (raw, groups))

        def drain() -> None:
            left = n
            while left:
                rows = conn.execute(claim, (min(limit, left), WORKER, VISIBILITY)).fetchall()
                if not rows:
                    raise RuntimeError("floor: the rows ran out")
                conn.execute(ack, ([row[0] for row in rows],))
                left -= len(rows)

        yield fill, drain


@contextmanager
def pg_groups_floor(url: str, n: int, limit: int) -> Iterator[Case]:
    """The floor that keeps groups (`PG_GROUPS_CLAIM`, `PG_GROUPS_ACK`), in a schema of
    its own on a PostgreSQL server."""
    with pg_schema(url, "bench_batch_groups_") as (conn, schema):
        for table in PG_GROUPS_TABLES:
            conn.execute(table.format(s=schema))
        groups = [f"g{i % GROUPS}" for i in range(n)]
        raw = EVENT.model_dump_json()
        fills = [statement.format(s=schema) for statement in PG_GROUPS_FILL]
        claim, ack = PG_GROUPS_CLAIM.format(s=schema), PG_GROUPS_ACK.format(s=schema)

        def fill() -> None:
            conn.execute(fills[0], (raw, groups))
            conn.execute(fills[1])

        def drain() -> None:
            left = n
            while left:
                rows = conn.execute(claim, (min(limit, left), WORKER)).fetchall()
                if not rows:
                    raise RuntimeError("floor: the groups ran out")
                conn.execute(ack, ([row[0] for row in rows], [row[1] for row in rows]))
                left -= len(rows)

        yield fill, drain


@contextmanager
def redis_floors(url: str, n: int, limit: int) -> Iterator[tuple[Case, Case]]:
    """Round trips and nothing else, over one connection: two a message, as a claim and
    an ack take, then two a batch of ``limit``. Nothing to fill."""
    import redis

    from transports_redis._scripts import NOTHING

    scheme, _, rest = url.partition("://")
    client = redis.Redis.from_url(f"{scheme}://{rest.partition('?')[0]}")
    try:
        sha = client.script_load(NOTHING.source)

        def trips(count: int) -> None:
            for _ in range(count):
                client.evalsha(sha, 0)  # the claim's trip
                client.evalsha(sha, 0)  # the ack's

        batches = -(-n // limit)
        yield (_nothing, lambda: trips(n)), (_nothing, lambda: trips(batches))
    finally:
        client.close()


SQLITE_TABLE = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, group_id TEXT NOT NULL,"
    " event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL)"
)
SQLITE_FILL = "INSERT INTO messages (group_id, event) VALUES (?, ?)"
# Leases the oldest free row: a claim that finds its message, as the transport's must.
SQLITE_CLAIM = """
UPDATE messages SET locked_by = ?, lock_expiry = ?
 WHERE seq = (SELECT seq FROM messages WHERE locked_by IS NULL ORDER BY seq LIMIT 1)
RETURNING seq, group_id, event"""
SQLITE_ACK = "DELETE FROM messages WHERE seq = ?"


@contextmanager
def sqlite_floor(path: Path, synchronous: str, n: int) -> Iterator[Case]:
    """The two-commit floor in a file at ``path`` (removed at the end): each statement
    autocommitted, so a claim and an ack are a commit each."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(SQLITE_TABLE)
        rows = [(f"g{i % GROUPS}", EVENT.model_dump_json()) for i in range(n)]

        def fill() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(SQLITE_FILL, rows)
            conn.execute("COMMIT")

        def drain() -> None:
            for _ in range(n):
                row = conn.execute(SQLITE_CLAIM, (WORKER, time.time() + VISIBILITY)).fetchone()
                if row is None:
                    raise RuntimeError("floor: the rows ran out")
                conn.execute(SQLITE_ACK, (row[0],))

        yield fill, drain
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


# -- the transport's cases ------------------------------------------------------------------


class Run:
    """The transport's cases, on groups of this run's own: one fill, and a drain each."""

    def __init__(self, transport: Transport[Event], n: int, limit: int) -> None:
        self.transport, self.n, self.limit = transport, n, limit
        token = uuid.uuid4().hex[:8]
        self.items = [(f"bench-batch-{token}-{i % GROUPS}", EVENT, 0) for i in range(n)]

    def fill(self) -> None:
        self.transport.publish_many(self.items)

    def cases(self) -> dict[str, Case]:
        t, n = self.transport, self.n
        return {
            "single": (self.fill, lambda: shared.drain_claim_ack(t, n)),
            "batch": (self.fill, lambda: shared.drain_batches(t, n, self.limit)),
            "chain": (self.fill, lambda: shared.drain_ack_and_claim(t, n)),
        }

    @contextmanager
    def chain_async(self, url: str, **options: object) -> Iterator[Case]:
        """The ``ack_and_claim`` loop through the async twin, on a loop of its own."""
        loop = asyncio.new_event_loop()
        try:
            twin = open_async_transport(url, **options)
            try:
                n = self.n
                yield (
                    self.fill,
                    lambda: loop.run_until_complete(shared.drain_ack_and_claim_async(twin, n)),
                )
            finally:
                loop.run_until_complete(twin.close())
        finally:
            loop.close()


# -- rounds, ratios and targets --------------------------------------------------------------


def rounds_of(cases: dict[str, Case], rounds: int, n: int) -> dict[str, list[float]]:
    """Messages per second of each case, every round, the cases' order turned each round."""
    rates: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fill, drain = cases[name]
            fill()
            started = time.perf_counter()
            drain()
            rates[name].append(n / (time.perf_counter() - started))
    return rates


@dataclass(frozen=True)
class Ratio:
    """``top`` / ``bottom``, held to ``bound`` (at least) if the issue sets one; on SQLite
    only at the ``synchronous`` level named, when one is."""

    name: str
    top: str
    bottom: str
    bound: float | None = None
    level: str | None = None


RATIOS: dict[str, list[Ratio]] = {
    "postgresql": [
        Ratio("claim_many+ack_many / claim+ack", "batch", "single", 8.0),
        Ratio("claim_many+ack_many / raw SQL batches", "batch", "floor_batch", 0.7),
        Ratio("claim_many+ack_many / raw SQL with groups", "batch", "floor_groups"),
        Ratio("raw SQL with groups / raw SQL batches", "floor_groups", "floor_batch"),
        Ratio("ack_and_claim loop / claim+ack", "chain", "single"),
    ],
    "redis": [
        Ratio("claim_many+ack_many / claim+ack", "batch", "single", 5.0),
        Ratio("claim+ack / its round trips", "single", "floor", 0.8),
        Ratio("claim_many+ack_many / its round trips", "batch", "floor_batch"),
        Ratio("ack_and_claim loop / claim+ack", "chain", "single"),
    ],
    "sqlite": [
        Ratio("ack_and_claim loop / two-commit floor", "chain", "floor", 1.0, "normal"),
        Ratio("async ack_and_claim / sync twin", "chain_async", "chain", 0.8, "full"),
        Ratio("ack_and_claim loop / claim+ack", "chain", "single"),
        Ratio("claim_many+ack_many / claim+ack", "batch", "single"),
    ],
}
GENERIC = [
    Ratio("claim_many+ack_many / claim+ack", "batch", "single"),
    Ratio("ack_and_claim loop / claim+ack", "chain", "single"),
]
LABELS: dict[str, str | dict[str, str]] = {
    "single": "claim + ack, one at a time",
    "batch": "claim_many({limit}) + ack_many",
    "chain": "ack_and_claim loop",
    "chain_async": "ack_and_claim loop, async twin",
    "floor": {
        "redis": "floor: 2 empty EVALSHA a message",
        "sqlite": "floor: UPDATE commit + DELETE commit",
    },
    "floor_groups": "floor: raw SQL, groups, batches of {limit}",
    "floor_batch": {
        "postgresql": "floor: raw SQL batches of {limit}",
        "redis": "floor: 2 empty EVALSHA a batch of {limit}",
    },
}


def scheme_of(url: str) -> str:
    scheme = url.split("://")[0]
    return {"postgres": "postgresql", "rediss": "redis"}.get(scheme, scheme)


def label(case: str, scheme: str, limit: int) -> str:
    text = LABELS.get(case, case)
    if isinstance(text, dict):
        text = text.get(scheme, case)
    return text.format(limit=limit)


def check(
    results: dict[str, Result], scheme: str, level: str | None = None
) -> list[dict[str, Any]]:
    """Each ratio of ``scheme``'s cases that were measured: the median of the rounds' own
    ratios, their range, the target (where one holds) and whether it is met."""
    out = []
    for ratio in RATIOS.get(scheme, GENERIC):
        top, bottom = results.get(ratio.top), results.get(ratio.bottom)
        if top is None or bottom is None:
            continue
        each = [a / b for a, b in zip(top["rounds"], bottom["rounds"], strict=True)]
        bound = ratio.bound if ratio.level in (None, level) else None
        measured = statistics.median(each)
        out.append(
            {
                "name": ratio.name + (f", synchronous={level}" if level else ""),
                "measured": measured,
                "low": min(each),
                "high": max(each),
                "target": "-" if bound is None else f">= {bound:g}",
                "passed": None if bound is None else measured >= bound,
            }
        )
    return out


# -- one queue, and a run --------------------------------------------------------------------


def measure_queue(url: str, rounds: int, n: int, limit: int, **options: Any) -> dict[str, Result]:
    """Every case of ``url``'s backend (opened with ``options``), a warm-up round and then
    ``rounds`` rounds of ``n`` messages: each case's rates, as `shared.summary`."""
    scheme = scheme_of(url)
    with ExitStack() as stack:
        transport = stack.enter_context(open_transport(url, **options))
        run = Run(transport, n, limit)
        cases = run.cases()
        if scheme == "postgresql":
            cases["floor_batch"] = stack.enter_context(pg_floor(url, n, limit))
            cases["floor_groups"] = stack.enter_context(pg_groups_floor(url, n, limit))
        elif scheme == "redis":
            cases["floor"], cases["floor_batch"] = stack.enter_context(redis_floors(url, n, limit))
        elif scheme == "sqlite":
            from transports_sqlite._url import parse_url

            parsed = parse_url(url, options)
            cases["chain_async"] = stack.enter_context(run.chain_async(url, **options))
            if not parsed.memory:
                where = Path(parsed.path)
                floor_path = where.with_name(f"{where.stem}-floor-{uuid.uuid4().hex[:6]}.db")
                floor = sqlite_floor(floor_path, parsed.synchronous, n)
                cases["floor"] = stack.enter_context(floor)
        rounds_of(cases, 1, n)  # connect, warm the statements and the files up
        rates = rounds_of(cases, rounds, n)
    return {name: shared.summary("msg/s", each) for name, each in rates.items()}


@dataclass
class Section:
    """One backend (at one ``synchronous`` level, on SQLite): its cases and ratios."""

    scheme: str
    level: str | None
    results: dict[str, Result]
    checked: list[dict[str, Any]] = field(default_factory=list)


def measure(url: str | None, rounds: int, n: int, limit: int) -> tuple[str, list[Section]]:
    """The queue measured and a section per backend setting."""
    with own_queue(url, "bench-batch-") as queue:
        scheme = scheme_of(queue)
        # (level, options to open with) of each section
        settings: list[tuple[str | None, dict[str, str]]] = [(None, {})]
        if scheme == "sqlite" and "synchronous=" not in queue.partition("?")[2]:
            settings = [(level, {"synchronous": level}) for level in ("normal", "full")]
        elif scheme == "sqlite":
            from transports_sqlite._url import parse_url

            settings = [(parse_url(queue, {}).synchronous, {})]
        sections = []
        for level, options in settings:
            results = measure_queue(queue, rounds, n, limit, **options)
            sections.append(Section(scheme, level, results, check(results, scheme, level)))
        return queue, sections


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def report(section: Section, rounds: int, n: int, limit: int) -> list[str]:
    """The section's table: cases (median, range), then ratios against their targets."""
    title = section.scheme + (f", synchronous={section.level}" if section.level else "")
    lines = [
        f"{title}: {rounds} rounds of {n} messages over {GROUPS} groups, batches of {limit}",
        f"  {'case':<40} {'msg/s':>10}  {'min .. max of rounds':>22}",
    ]
    for name, result in section.results.items():
        each = result["rounds"]
        spread = f"{_rate(min(each))} .. {_rate(max(each))}"
        lines.append(
            f"  {label(name, section.scheme, limit):<40} {_rate(result['median']):>10}  "
            f"{spread:>22}"
        )
    lines.append(f"  {'ratio (median of the rounds)':<40} {'x':>10}  {'min .. max':>22}  target")
    for t in section.checked:
        verdict = {True: "met", False: "NOT MET", None: ""}[t["passed"]]
        spread = f"{t['low']:.2f} .. {t['high']:.2f}"
        target = "" if t["target"] == "-" else f"{t['target']}  {verdict}"
        name = t["name"].split(", synchronous=")[0]
        lines.append(f"  {name:<40} {t['measured']:>10.2f}  {spread:>22}  {target}".rstrip())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__)
    parser.add_argument("--url", help="the queue to measure (default: SQLite files of its own)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7)")
    parser.add_argument("-n", type=int, default=None, help="messages a round (default 3000)")
    parser.add_argument("--limit", type=int, default=LIMIT, help=f"batch size (default {LIMIT})")
    args = parser.parse_args(argv)
    if not 1 <= args.limit <= GROUPS:
        parser.error(f"--limit must be between 1 and {GROUPS} (the groups a round fills)")
    rounds = args.rounds or (1 if args.quick else 7)
    n = args.n or (200 if args.quick else 3000)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    _, sections = measure(args.url, rounds, n, args.limit)
    for i, section in enumerate(sections):
        if i:
            print()
        print("\n".join(report(section, rounds, n, args.limit)))
    print(
        f"\n{os.cpu_count()} cpus, load {load:.2f} before / {os.getloadavg()[0]:.2f} after, "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
