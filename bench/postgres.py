"""``python -m bench.postgres``: the PostgreSQL backend against raw psycopg on the same
server, medians of a few rounds and the ratios the issue sets as targets.

    python -m bench.postgres                  # short (about a minute)
    python -m bench.postgres --big            # 1,000,000-message backlog, 200,000-cycle soak
    TRANSPORTS_POSTGRES_URL=postgresql://... python -m bench.postgres

Every case works in a schema of its own, dropped at the end. The server on the shared
machines runs with autovacuum off: the soak runs VACUUM itself.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from transports_core import Event, open_transport

from ._scratch import scratch

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/test"
Conn = psycopg.Connection[Any]


# libpq session options for every connection of the run (``--no-flush`` sets one).
SESSION: list[str] = []
# --verbose: every round's figures, not only the medians.
VERBOSE = False


def server() -> str:
    base = os.environ.get("TRANSPORTS_POSTGRES_URL") or LOCAL_URL
    return base + (f"?{SESSION[0]}" if SESSION else "")


def _drop_schema(name: str) -> None:
    with psycopg.connect(server(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def schema(prefix: str) -> AbstractContextManager[str]:
    return scratch(f"bench_{prefix}_", _drop_schema)


def queue_url(name: str, **query: object) -> str:
    extra = "".join(f"&{key}={value}" for key, value in query.items())
    joiner = "&" if SESSION else "?"
    return f"{server()}{joiner}schema={name}&pool_min_size=1&pool_max_size=2{extra}"


def rate(n: int, run: Callable[[], None], rounds: int) -> float:
    """Median per-second rate of ``run``, which does ``n`` things, over ``rounds``."""
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        rates.append(n / (time.perf_counter() - started))
    return statistics.median(rates)


# --- the floor: raw psycopg, the same commits per message -------------------------------------


def _raw_table(conn: Conn, name: str, n: int, groups: bool = False) -> None:
    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{name}"')
    conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{name}".jobs (id bigserial PRIMARY KEY, payload text, '
        "leased_by text, expiry float8)"
    )
    conn.execute(
        f'CREATE INDEX IF NOT EXISTS jobs_free ON "{name}".jobs (id) WHERE leased_by IS NULL'
    )
    conn.execute(
        f'INSERT INTO "{name}".jobs (payload) SELECT \'{{"n":1}}\' FROM generate_series(1, %s)',
        (n,),
    )


def skip_locked_worker(start: Any, url: str, name: str, n: int) -> None:
    """What people write by hand: a plain SKIP LOCKED jobs table, no groups."""
    with psycopg.connect(url, autocommit=True) as conn:
        start.wait(120)
        for _ in range(n):
            row = conn.execute(
                f'UPDATE "{name}".jobs SET leased_by = %s, expiry = 1 WHERE id = ('
                f'SELECT id FROM "{name}".jobs WHERE leased_by IS NULL ORDER BY id LIMIT 1 '
                "FOR UPDATE SKIP LOCKED) RETURNING id, payload",
                ("w",),
            ).fetchone()
            if row is None:
                return
            conn.execute(f'DELETE FROM "{name}".jobs WHERE id = %s', (row[0],))


def transport_worker(start: Any, url: str, worker: str, n: int) -> None:
    with open_transport(url) as transport:
        transport.claim(worker, 60, 4)  # connected (nothing is published at priority 4)
        start.wait(120)
        for _ in range(n):
            lease = transport.claim(worker, 60)
            if lease is None:
                return
            transport.ack(lease)


def _processes(target: Callable[..., None], args: list[tuple[Any, ...]]) -> float:
    """Seconds from the moment every child has connected (they wait at a barrier, so
    that starting Python and importing is not measured) until the last one is done."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(len(args) + 1)
    children = [spawn.Process(target=target, args=(barrier, *a)) for a in args]
    for child in children:
        child.start()
    barrier.wait(120)
    started = time.perf_counter()
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"a benchmark process failed ({child.exitcode})")
    return time.perf_counter() - started


def floor(n: int, connections: int, rounds: int) -> float:
    def once() -> float:
        with schema("floor") as name:
            with psycopg.connect(server(), autocommit=True) as conn:
                _raw_table(conn, name, n * connections)
            # Each connection works its own slice of the ids: the floor chooses nothing.
            return _processes(
                _floor_slice, [(server(), name, n, i, connections) for i in range(connections)]
            )

    return statistics.median((n * connections) / once() for _ in range(rounds))


def _floor_slice(start: Any, url: str, name: str, n: int, index: int, count: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                f'SELECT id FROM "{name}".jobs WHERE id %% %s = %s ORDER BY id LIMIT %s',
                (count, index, n),
            )
        ]
        start.wait(120)
        for job in ids:
            conn.execute(
                f'UPDATE "{name}".jobs SET leased_by = %s, expiry = 1 WHERE id = %s', ("w", job)
            )
            conn.execute(f'DELETE FROM "{name}".jobs WHERE id = %s', (job,))


def claim_ack(n: int, processes: int, groups: int, rounds: int, **options: object) -> float:
    """Claim+ack per second of ``processes`` workers draining ``n`` messages each, spread
    over ``groups`` groups; ``options`` go in the queue's URL."""

    def once() -> float:
        with schema("claim") as name:
            url = queue_url(name, **options)
            with open_transport(url) as transport:
                transport.publish_many(
                    [(f"g{i % groups}", Event(n=i), 0) for i in range(n * processes)]
                )
            return _processes(transport_worker, [(url, f"w{i}", n) for i in range(processes)])

    return statistics.median((n * processes) / once() for _ in range(rounds))


def skip_locked(n: int, rounds: int) -> float:
    def once() -> float:
        with schema("skip") as name:
            with psycopg.connect(server(), autocommit=True) as conn:
                _raw_table(conn, name, n)
            return _processes(skip_locked_worker, [(server(), name, n)])

    return statistics.median(n / once() for _ in range(rounds))


# --- procrastinate, the Python queue with per-key exclusivity ---------------------------------


def _procrastinate_app(url: str) -> Any:
    """A procrastinate app on ``url`` with one no-op task (imported here: a bench extra)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    def noop(n: int) -> None:
        """The same work as our worker's: nothing, then done."""

    app.task(name="noop", queue="bench")(noop)
    return app


def _procrastinate_url(name: str) -> str:
    # Its tables, types and functions in a schema of its own, dropped at the end.
    joiner = "&" if "?" in server() else "?"
    return f"{server()}{joiner}options=-csearch_path%3D{name}"


def procrastinate_worker(start: Any, url: str) -> None:
    app = _procrastinate_app(url)

    async def work() -> None:
        async with app.open_async():
            start.wait(120)
            await app.run_worker_async(
                queues=["bench"],
                wait=False,  # stop once the queue is drained
                concurrency=1,
                listen_notify=False,
                delete_jobs="always",  # a finished job goes, as an acked message does
                install_signal_handlers=False,
            )

    asyncio.run(work())


def procrastinate_claim_ack(n: int, groups: int) -> float:
    """Jobs per second of one procrastinate worker process running ``n`` no-op jobs,
    each deferred with ``lock=`` its group (of ``groups``): at most one job of a lock runs
    at a time, procrastinate's per-key exclusivity."""
    with schema("proc") as name:
        url = _procrastinate_url(name)
        with psycopg.connect(server(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        app = _procrastinate_app(url)
        with app.open():
            app.schema_manager.apply_schema()
            task = app.tasks["noop"]
            for i in range(n):
                task.configure(lock=f"g{i % groups}").defer(n=i)
        seconds = _processes(procrastinate_worker, [(url,)])
        with psycopg.connect(url, autocommit=True) as conn:
            (left,) = conn.execute("SELECT count(*) FROM procrastinate_jobs").fetchone() or (0,)
        if left:
            raise RuntimeError(f"procrastinate left {left} of {n} jobs")
        return n / seconds


# --- publish_many against a raw multi-row insert -------------------------------------------------


def publish_many(batch: int, batches: int, rounds: int) -> dict[str, list[float]]:
    """Messages per second of ``batches`` calls of publish_many with ``batch`` events in
    100 groups, and of a raw multi-row insert of the same rows (their JSON already made,
    arrays sent in binary), back to back in each round."""
    events = [Event(n=i) for i in range(batch)]
    items = [(f"g{i % 100}", e, 0) for i, e in enumerate(events)]
    groups = [f"g{i % 100}" for i in range(batch)]
    raws = [e.model_dump_json() for e in events]
    with (
        schema("pm") as name,
        open_transport(queue_url(name)) as transport,
        schema("pmraw") as raw_name,
        psycopg.connect(server(), autocommit=True) as conn,
    ):
        conn.execute(f'CREATE SCHEMA "{raw_name}"')
        conn.execute(
            f'CREATE TABLE "{raw_name}".m (seq bigserial PRIMARY KEY, group_id text, '
            "priority smallint, event text)"
        )

        def ours() -> None:
            for _ in range(batches):
                transport.publish_many(items)

        def raw(form: str) -> Callable[[], None]:
            def insert() -> None:
                for _ in range(batches):
                    conn.execute(
                        f'INSERT INTO "{raw_name}".m (group_id, priority, event) '
                        f"SELECT * FROM unnest(%{form}::text[], %{form}::smallint[], "
                        f"%{form}::text[])",
                        (groups, [0] * batch, raws),
                    )

            return insert

        n = batch * batches
        return side_by_side(
            {
                "ours": lambda: rate(n, ours, 1),
                # Arrays in binary (%b), the fastest raw insert: in text (%s), psycopg
                # quotes and escapes every element on the client.
                "raw": lambda: rate(n, raw("b"), 1),
                "raw text": lambda: rate(n, raw("s"), 1),
            },
            rounds,
        )


# --- claim latency against the backlog ------------------------------------------------------------


def _fill(name: str, size: int, groups: int) -> str:
    url = queue_url(name)
    with open_transport(url):
        pass  # the schema
    with psycopg.connect(server(), autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{name}".messages (group_id, seq, priority, event) '
            "SELECT 'g' || (s %% %s), s, 0, '{\"n\":1}' FROM generate_series(1, %s) s",
            (groups, size),
        )
        conn.execute(
            f'INSERT INTO "{name}".groups (group_id, priority, head_seq, depth) '
            f'SELECT group_id, 0, min(seq), count(*) FROM "{name}".messages GROUP BY group_id'
        )
        conn.execute(f"SELECT setval('\"{name}\".seqs', %s)", (size,))
        conn.execute(f'ANALYZE "{name}".groups')
        conn.execute(f'ANALYZE "{name}".messages')
    return url


def claim_latency(size: int, groups: int, n: int) -> float:
    """Median seconds of one claim+ack, with ``size`` messages queued in ``groups``."""
    with schema("lat") as name:
        url = _fill(name, size, groups)
        with open_transport(url) as transport:
            times = []
            for _ in range(n):
                started = time.perf_counter()
                lease = transport.claim("w", 60)
                assert lease is not None
                transport.ack(lease)
                times.append(time.perf_counter() - started)
                transport.publish(lease.group_id, Event(n=1))  # keep the backlog's size
        return statistics.median(times)


# --- soak ---------------------------------------------------------------------------------


# The soak's stand-in for autovacuum (off on the shared server): a VACUUM of both tables
# as often as the groups table's own threshold (1,000 dead rows, see _sql.py) would start
# one, at three dead group rows a cycle (claim, ack, publish).
SOAK_VACUUM_EVERY = 1000 // 3


def soak(
    cycles: int, groups: int = 100, vacuum_every: int = SOAK_VACUUM_EVERY
) -> tuple[list[dict[str, int]], tuple[int, int]]:
    """Claim+ack ``cycles`` times (each publishing one more), vacuuming every
    ``vacuum_every`` cycles as autovacuum would, then VACUUM: sizes in bytes of every table
    and index at the start, after a tenth of the cycles (and a VACUUM), and at the end;
    and at the end, how many pages of the groups table hold a live row, and the last
    such page (VACUUM gives back only the empty pages after it)."""
    query = (
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND c.relkind IN ('r', 'i') ORDER BY 1"
    )
    with schema("soak") as name:
        url = queue_url(name)
        with open_transport(url) as transport, psycopg.connect(server(), autocommit=True) as conn:

            def sizes() -> dict[str, int]:
                conn.execute(f'VACUUM "{name}".groups, "{name}".messages')
                return dict(conn.execute(query, (name,)).fetchall())

            transport.publish_many([(f"g{i}", Event(n=i), 0) for i in range(groups)] * 10)
            taken = [sizes()]
            for i in range(cycles):
                lease = transport.claim("w", 60)
                assert lease is not None
                transport.ack(lease)
                transport.publish(lease.group_id, Event(n=i))
                if i + 1 == cycles // 10:
                    taken.append(sizes())
                elif i % vacuum_every == vacuum_every - 1:
                    conn.execute(f'VACUUM "{name}".groups, "{name}".messages')
            taken.append(sizes())
            pages = f'SELECT DISTINCT (ctid::text::point)[0] FROM "{name}".groups'
            live = [int(page) for (page,) in conn.execute(pages).fetchall()]
    return taken, (len(live), max(live))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__)
    parser.add_argument("--big", action="store_true", help="1M backlog, 200k soak")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=["one", "scaling", "publish_many", "backlog", "soak"],
        help="run one case",
    )
    parser.add_argument(
        "--no-flush",
        action="store_true",
        help="synchronous_commit=off for every connection: shows what the CPU allows "
        "when commits do not wait for the disk (never how to run a queue)",
    )
    parser.add_argument("--verbose", action="store_true", help="print every round's figures")
    parser.add_argument(
        "--soak-groups", type=int, default=100, help="groups the soak cycles over (100)"
    )
    parser.add_argument(
        "--soak-cycles", type=int, help="claim+ack cycles of the soak (20,000; 200,000 --big)"
    )
    parser.add_argument(
        "--soak-vacuum-every",
        type=int,
        default=SOAK_VACUUM_EVERY,
        help=f"cycles between the soak's VACUUMs ({SOAK_VACUUM_EVERY:,})",
    )
    args = parser.parse_args(argv)
    global VERBOSE
    VERBOSE = args.verbose
    # A terminated run still drops its schemas (the `schema` context managers' finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rounds = args.rounds
    n = 2000
    out = print
    if args.no_flush:
        SESSION.append("options=-csynchronous_commit%3Doff")
    out(f"server: {psycopg.connect(server()).info.parameter_status('server_version')}")
    if args.only == "one":
        _report_one_connection(n, rounds, out)
        return 0
    if args.only == "publish_many":
        _report_publish_many(rounds, out)
        return 0
    cycles = args.soak_cycles or (200_000 if args.big else 20_000)
    if args.only == "soak":
        _report_soak(cycles, args.soak_groups, args.soak_vacuum_every, out)
        return 0
    if args.only == "scaling":
        _report_scaling(n, rounds, out)
        return 0
    if args.only == "backlog":
        _report_backlog(1_000_000 if args.big else 100_000, out)
        return 0

    _report_one_connection(n, rounds, out)
    _report_scaling(n, rounds, out)
    _report_publish_many(rounds, out)
    _report_backlog(1_000_000 if args.big else 100_000, out)
    _report_soak(cycles, args.soak_groups, args.soak_vacuum_every, out)
    return 0


def side_by_side(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each case's rate in every round, the cases of a round run back to back: a ratio of
    two cases from one round saw the same load on the machine."""
    rates: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(rounds):
        for label, case in cases.items():
            rates[label].append(case())
    return rates


def _ratio(rates: dict[str, list[float]], label: str, base: str) -> float:
    """The median over rounds of ``label``'s rate over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(rates[label], rates[base], strict=True))


def _report_one_connection(n: int, rounds: int, out: Callable[..., None]) -> None:
    rates = side_by_side(
        {
            "floor": lambda: floor(n, 1, 1),
            "flush": lambda: claim_ack(n, 1, 50, 1),
            "async": lambda: claim_ack(n, 1, 50, 1, lease_commit="async"),
            "plain": lambda: skip_locked(n, 1),
            "procrastinate": lambda: procrastinate_claim_ack(n, 50),
        },
        rounds,
    )
    median = {label: statistics.median(values) for label, values in rates.items()}
    if VERBOSE:
        for label, values in rates.items():
            out(f"  {label:6s} by round: {' '.join(f'{v:.0f}' for v in values)}")
    out(f"floor (UPDATE commit + DELETE commit), 1 connection: {median['floor']:8.0f} msg/s")
    out(
        f"claim+ack, 1 connection (lease_commit=flush):        {median['flush']:8.0f} msg/s "
        f"= {_ratio(rates, 'flush', 'floor'):.2f}x the floor (target >= 0.7)"
    )
    out(
        f"claim+ack, 1 connection (lease_commit=async):        {median['async']:8.0f} msg/s "
        f"= {_ratio(rates, 'async', 'floor'):.2f}x the floor (a claim not flushed on its own)"
    )
    out(
        f"plain SKIP LOCKED table, no groups, 1 connection:    {median['plain']:8.0f} msg/s "
        f"= {_ratio(rates, 'plain', 'floor'):.2f}x the floor"
    )
    out(
        f"procrastinate, lock= per group, 1 worker process:    "
        f"{median['procrastinate']:8.0f} jobs/s = {_ratio(rates, 'procrastinate', 'floor'):.2f}x "
        f"the floor; ours (flush) = {_ratio(rates, 'flush', 'procrastinate'):.2f}x procrastinate"
    )


def _report_scaling(n: int, rounds: int, out: Callable[..., None]) -> None:
    """1, 4, 8 and 16 worker processes draining 64 groups, with both lease_commit
    settings at 1 and 4, and the raw floor at 1 and 4 connections, all in every round."""
    cases: dict[str, Callable[[], float]] = {
        "floor 1": lambda: floor(n, 1, 1),
        "floor 4": lambda: floor(n // 4, 4, 1),
    }
    for procs in (1, 4, 8, 16):
        cases[f"{procs}"] = functools.partial(claim_ack, max(n // procs, 200), procs, 64, 1)
    for procs in (1, 4):
        cases[f"{procs} async"] = functools.partial(
            claim_ack, max(n // procs, 200), procs, 64, 1, lease_commit="async"
        )
    rates = side_by_side(cases, rounds)
    if VERBOSE:
        for label, values in rates.items():
            out(f"  {label:8s} by round: {' '.join(f'{v:.0f}' for v in values)}")
    for procs in (1, 4, 8, 16):
        out(
            f"claim+ack, {procs:2d} processes, distinct groups:         "
            f"{statistics.median(rates[str(procs)]):8.0f} msg/s = "
            f"{_ratio(rates, str(procs), '1'):.2f}x one process"
            + (" (target >= 2.5)" if procs == 4 else "")
        )
    out(
        f"  the same, lease_commit=async, 1 and 4 processes: "
        f"{statistics.median(rates['1 async']):.0f} and {statistics.median(rates['4 async']):.0f}"
        f" msg/s = {_ratio(rates, '4 async', '1 async'):.2f}x"
    )
    out(
        f"  the raw floor at 1 and 4 connections: {statistics.median(rates['floor 1']):.0f} and "
        f"{statistics.median(rates['floor 4']):.0f} msg/s = "
        f"{_ratio(rates, 'floor 4', 'floor 1'):.2f}x; ours at 4 processes = "
        f"{_ratio(rates, '4', 'floor 4'):.2f}x the floor at 4"
    )


def _report_publish_many(rounds: int, out: Callable[..., None]) -> None:
    rates = publish_many(500, 40, max(rounds, 5))
    out(
        f"publish_many (500 a batch, 100 groups):            "
        f"{statistics.median(rates['ours']):8.0f} msg/s = {_ratio(rates, 'ours', 'raw'):.2f}x "
        f"a raw multi-row insert, arrays in binary ({statistics.median(rates['raw']):.0f}/s; "
        f"target >= 0.5)"
    )
    out(
        f"  = {_ratio(rates, 'ours', 'raw text'):.2f}x the same insert with its arrays in text "
        f"({statistics.median(rates['raw text']):.0f}/s)"
    )


def _report_backlog(big: int, out: Callable[..., None]) -> None:
    for groups in (10, 10_000):
        small_lat = claim_latency(1000, groups if groups < 1000 else 1000, 300)
        big_lat = claim_latency(big, groups, 300)
        out(
            f"claim+ack latency, {groups:5d} groups: {small_lat * 1e3:.3f} ms at 1,000 queued, "
            f"{big_lat * 1e3:.3f} ms at {big:,} = {big_lat / small_lat:.2f}x (target <= 1.3)"
        )


def _report_soak(cycles: int, groups: int, vacuum_every: int, out: Callable[..., None]) -> None:
    (start, tenth, end), (live_pages, last_page) = soak(cycles, groups, vacuum_every)
    out(
        f"soak: {cycles:,} claim+ack cycles over {groups:,} groups, VACUUM every "
        f"{vacuum_every:,} cycles, then VACUUM (bytes: start, after {cycles // 10:,}, end):"
    )
    for rel in sorted(start):
        ratio = end.get(rel, 0) / start[rel] if start[rel] else float("nan")
        out(
            f"  {rel:22s} {start[rel]:10,d} {tenth.get(rel, 0):10,d} {end.get(rel, 0):10,d}"
            f"  ({ratio:.2f}x; target <= 2)"
        )
    out(f"  groups: live rows on {live_pages} pages at the end, the last on page {last_page}")


if __name__ == "__main__":
    sys.exit(main())
