"""``python -m bench.peers``: one workload through this library and through the queues
people compare it with, side by side, each run checked before its figures count.

    python -m bench.peers                                  # 10,000 messages, 1,000 groups
    python -m bench.peers --messages 200 --groups 20 --rounds 1 --concurrency 4
    python -m bench.peers --only ours-runtime-postgresql --only procrastinate
    python -m bench.peers --out peers.json

The workload: message ``i`` (of ``--messages``) goes to group ``i % --groups`` with the
payload ``{"g": group, "n": i}``, so each group's messages are numbered in the order they
were published. A round publishes them all (in batches of 500 where the system takes a
batch; timed on its own), then drains them with a no-op handler at ``--concurrency``
(timed from the start of the drain until every message is settled in the store). The
rounds take the systems in turn, so a burst of load on the machine hits them alike.

Every drain is checked, and a broken one stops the run instead of printing a figure:
each message handled exactly once, nothing left in the store, and for the systems that
promise one message at a time per group, no two of a group's handlers overlapping and
each group's messages handled in the order they were published. A system that does not
promise that order is reported with what was seen (how many groups went out of order).

Each system works in a store of its own (a temporary SQLite file, a PostgreSQL schema,
a Redis queue), removed at the end. The servers come from ``--postgres`` and ``--redis``
(or ``TRANSPORTS_POSTGRES_URL`` and ``TRANSPORTS_REDIS_URL``); a case whose server does
not answer, or whose package is not installed (``pip install -e '.[bench]'``), is
reported as not run, with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transports_core import Event, Transport, open_transport
from transports_worker import Context, Worker

from ._scratch import own_queue, scratch
from .worker import _Count

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
PUBLISH_BATCH = 500
# Long enough that no lease runs out during a round: a redelivery would be a failure.
VISIBILITY = 60.0
# The most any drain may take before the run is declared broken.
DRAIN_LIMIT = 600.0


class Broken(RuntimeError):
    """A drain that did not do what the system promises: its figures do not count."""


class NotRun(Exception):
    """A case that cannot run here (a package or a server missing), and why."""


@dataclass(frozen=True)
class Size:
    messages: int
    groups: int
    concurrency: int
    budget: float = DRAIN_LIMIT  # seconds a peer's drain may take before it is stopped

    def items(self) -> Iterator[tuple[int, int]]:
        """(group, n) of every message, in publish order."""
        return ((i % self.groups, i) for i in range(self.messages))


@dataclass
class Record:
    """What the handlers saw: each start in order, and how often one started while
    another of its group was still running. The lock costs every system the same."""

    started: list[tuple[int, int]] = field(default_factory=list)
    overlaps: int = 0
    running: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, group: int, n: int) -> None:
        with self.lock:
            busy = self.running.get(group, 0)
            if busy:
                self.overlaps += 1
            self.running[group] = busy + 1
            self.started.append((group, n))

    def end(self, group: int) -> None:
        with self.lock:
            self.running[group] -= 1

    def handle(self, group: int, n: int) -> None:
        """The no-op handler: nothing but being counted."""
        self.begin(group, n)
        self.end(group)

    def check(self, size: Size, ordered: bool, partial: bool = False) -> dict[str, int]:
        """Raise `Broken` unless every message was handled exactly once (none twice, and
        some not at all when ``partial``: a drain stopped at its time limit) and, when
        ``ordered``, each group's one at a time and in publish order; what was seen."""
        counts = [0] * size.messages
        for _, n in self.started:
            counts[n] += 1
        missing = 0 if partial else counts.count(0)
        repeated = sum(1 for c in counts if c > 1)
        if missing or repeated:
            raise Broken(f"{missing} messages never handled, {repeated} handled more than once")
        last: dict[int, int] = {}
        out_of_order: set[int] = set()
        for group, n in self.started:
            if n < last.get(group, -1):
                out_of_order.add(group)
            last[group] = max(n, last.get(group, -1))
        if ordered and (out_of_order or self.overlaps):
            raise Broken(
                f"{len(out_of_order)} groups handled out of publish order, "
                f"{self.overlaps} handlers started while another of their group ran"
            )
        return {"groups_out_of_order": len(out_of_order), "overlaps": self.overlaps}


@dataclass(frozen=True)
class Timed:
    """One round of one system: seconds to publish, seconds to drain, what was seen."""

    publish: float
    drain: float
    seen: dict[str, int]
    handled: int  # all of them, unless the drain was stopped at its time limit


@dataclass(frozen=True)
class Case:
    label: str
    guarantees: str
    ordered: bool  # promises one at a time per group, in publish order
    run: Callable[[Size, Servers], Timed]


@dataclass(frozen=True)
class Servers:
    postgres: str
    redis: str


def _clock(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _need(module: str, extra: str = "bench") -> None:
    if importlib.util.find_spec(module) is None:
        raise NotRun(f"{module} is not installed (pip install -e '.[{extra}]')")


def _answers_postgres(url: str) -> None:
    _need("psycopg", "postgres")
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise NotRun(f"no PostgreSQL server answers at {url}: {str(exc).strip()[:120]}") from exc


def _answers_redis(url: str) -> None:
    _need("redis", "redis")
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise NotRun(f"no Redis server answers at {url}: {str(exc)[:120]}") from exc
    finally:
        client.close()


def _with_query(url: str, **query: object) -> str:
    joiner = "&" if "?" in url else "?"
    return url + joiner + "&".join(f"{key}={value}" for key, value in query.items())


# --- ours ---------------------------------------------------------------------------------


def _publish_ours(url: str, size: Size) -> float:
    items = [(f"g{g}", Event(g=g, n=n), 0) for g, n in size.items()]
    with open_transport(url) as handle:

        def publish() -> None:
            for start in range(0, len(items), PUBLISH_BATCH):
                handle.publish_many(items[start : start + PUBLISH_BATCH])

        return _clock(publish)


def _left_ours(url: str) -> None:
    with open_transport(url) as handle:
        if handle.claim("check", VISIBILITY) is not None:
            raise Broken("a message was left in the queue after the drain")


@contextmanager
def _queue(scheme: str, servers: Servers) -> Iterator[str]:
    """A queue of the case's own, removed at the end. On PostgreSQL one handle, whose
    pool of up to 4 connections the worker's slots share (a handle per slot would take
    a pool each from a server that other work shares too)."""
    if scheme == "sqlite":
        with own_queue(None, "bench-peers-") as url:
            yield url
    elif scheme == "postgresql":
        _answers_postgres(servers.postgres)
        with own_queue(servers.postgres, "bench_peers_") as url:
            yield _with_query(url, pool_min_size=4, pool_max_size=4)
    else:
        _answers_redis(servers.redis)
        with own_queue(servers.redis, "bench-peers-") as url:
            yield url


def ours_runtime(scheme: str) -> Callable[[Size, Servers], Timed]:
    """The worker runtime, batches on, a no-op sync handler on ``concurrency`` threads."""

    def run(size: Size, servers: Servers) -> Timed:
        record = Record()

        def handler(event: Event, ctx: Context[Event]) -> None:
            record.handle(event.g, event.n)

        with _queue(scheme, servers) as url:
            publish = _publish_ours(url, size)
            # Opened before the clock starts: a handle per slot and three more (a
            # claimer, a settler, the renewer), or one shared handle on PostgreSQL.
            shared = scheme == "postgresql"
            handles = [open_transport(url) for _ in range(1 if shared else size.concurrency + 3)]
            count = _Count(size.messages)
            source: Transport[Event] | Callable[[], Transport[Event]] = (
                handles[0] if shared else handles.pop
            )
            worker = Worker(
                source,
                handler,
                concurrency=size.concurrency,
                handle_signals=False,
                hooks=[count],
                batch=True,
            )
            thread = threading.Thread(target=worker.run, daemon=True)

            def drain() -> None:
                thread.start()
                if not count.all.wait(DRAIN_LIMIT):
                    raise Broken(f"the worker settled only {count.done} of {size.messages}")

            try:
                seconds = _clock(drain)
            finally:
                worker.stop()
                if thread.ident is not None:
                    thread.join()
                for handle in handles:  # the shared one, or those the worker did not take
                    handle.close()
            seen = record.check(size, ordered=True)
            _left_ours(url)
        return Timed(publish, seconds, seen, size.messages)

    return run


def ours_loop(scheme: str) -> Callable[[Size, Servers], Timed]:
    """One thread: ``claim_many(limit=concurrency)``, the handler for each, ``ack_many``."""

    def run(size: Size, servers: Servers) -> Timed:
        record = Record()
        with _queue(scheme, servers) as url:
            publish = _publish_ours(url, size)
            with open_transport(url) as handle:
                handle.claim("loop", VISIBILITY, 4)  # connected (nothing is at priority 4)

                def drain() -> None:
                    while leases := handle.claim_many("loop", VISIBILITY, size.concurrency):
                        for lease in leases:
                            record.handle(lease.event.g, lease.event.n)
                        if lost := handle.ack_many(leases):
                            raise Broken(f"{len(lost)} acks found their lease lost")

                seconds = _clock(drain)
            seen = record.check(size, ordered=True)
            _left_ours(url)
        return Timed(publish, seconds, seen, size.messages)

    return run


# --- the PostgreSQL peers: each in a schema of its own --------------------------------------


@contextmanager
def _peer_schema(servers: Servers, prefix: str) -> Iterator[str]:
    """A new schema, dropped at the end; the URL yielded puts it first on the search path,
    where each peer creates its tables, types and functions."""
    import psycopg

    def drop(name: str) -> None:
        with psycopg.connect(servers.postgres, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    with scratch(prefix, drop) as name:
        with psycopg.connect(servers.postgres, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        yield _with_query(servers.postgres, options=f"-csearch_path%3D{name}")


def _rows_left(url: str, table: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def procrastinate_case(size: Size, servers: Servers) -> Timed:
    """procrastinate: each job deferred with ``lock=`` its group, which runs a lock's
    jobs one at a time, in the order deferred; an async no-op task; finished jobs
    deleted, as an acked message is."""
    _need("procrastinate")
    _answers_postgres(servers.postgres)
    import procrastinate

    # It warns when an app is made in ``__main__`` (its CLI could not import it by
    # name); this one is driven from here, never from that CLI.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    record = Record()
    with _peer_schema(servers, "bench_peers_proc_") as url:
        app: Any = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

        async def noop(g: int, n: int) -> None:
            record.handle(g, n)

        app.task(name="noop", queue="bench")(noop)
        task = app.tasks["noop"]

        async def publish() -> None:
            jobs = [task.configure(lock=f"g{g}").make_new_job(g=g, n=n) for g, n in size.items()]
            for start in range(0, len(jobs), PUBLISH_BATCH):
                await app.job_manager.batch_defer_jobs_async(jobs[start : start + PUBLISH_BATCH])

        async def drain() -> None:
            # With wait=False a worker stops when no job is free to take, which happens
            # too when every group left is busy: start it again until all are done.
            while len(record.started) < size.messages:
                await app.run_worker_async(
                    queues=["bench"],
                    wait=False,
                    concurrency=size.concurrency,
                    listen_notify=False,
                    delete_jobs="always",
                    install_signal_handlers=False,
                )

        async def both() -> tuple[float, float]:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                began = time.perf_counter()
                await publish()
                published = time.perf_counter()
                # Its fetch grows with the jobs queued: at the size it may not
                # finish in any useful time, so it is stopped, and its rate is the part done.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(drain(), size.budget)
                return published - began, time.perf_counter() - published

        publish_s, drain_s = asyncio.run(both())
        handled = len(record.started)
        seen = record.check(size, ordered=True, partial=handled < size.messages)
        # A job stopped mid-run goes back to todo with the worker; none may be lost.
        left = _rows_left(url, "procrastinate_jobs")
        if left != size.messages - handled:
            raise Broken(f"procrastinate handled {handled} and left {left} jobs")
    return Timed(publish_s, drain_s, seen, handled)


def pgqueuer_case(per_group: bool) -> Callable[[Size, Servers], Timed]:
    """PgQueuer over one asyncpg connection, its own driver. Per group: an entrypoint per
    group, each with ``concurrency_limit=1``, which PgQueuer enforces in its dequeue query
    across all workers, taking an entrypoint's jobs by id. Without: one entrypoint and no
    limit, so a group's jobs may run together and in any order."""

    def run(size: Size, servers: Servers) -> Timed:
        _need("pgqueuer")
        _need("asyncpg")
        _answers_postgres(servers.postgres)
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries, QueueManager
        from pgqueuer.types import QueueExecutionMode

        record = Record()
        entrypoints = [f"g{g}" for g in range(size.groups)] if per_group else ["noop"]

        async def noop(job: Any) -> None:
            g, n = json.loads(job.payload)
            record.handle(g, n)

        async def both(schema: str) -> tuple[float, float]:
            conn = await asyncpg.connect(
                servers.postgres.partition("?")[0], server_settings={"search_path": schema}
            )
            try:
                queries: Any = Queries(AsyncpgDriver(conn))
                await queries.install()
                manager: Any = QueueManager(queries)
                for name in entrypoints:
                    manager.entrypoint(name, concurrency_limit=1 if per_group else 0)(noop)
                names = [entrypoints[g % len(entrypoints)] for g, _ in size.items()]
                payloads = [json.dumps([g, n]).encode() for g, n in size.items()]
                began = time.perf_counter()
                for start in range(0, len(names), PUBLISH_BATCH):
                    end = start + PUBLISH_BATCH
                    await queries.enqueue(
                        names[start:end], payloads[start:end], [0] * len(names[start:end])
                    )
                published = time.perf_counter()
                # Its cap on jobs in hand must be at least twice its batch.
                batch = max(size.concurrency // 2, 1)
                await asyncio.wait_for(
                    manager.run(
                        mode=QueueExecutionMode.drain,
                        batch_size=batch,
                        max_concurrent_tasks=max(size.concurrency, 2 * batch),
                    ),
                    DRAIN_LIMIT,
                )
                return published - began, time.perf_counter() - published
            finally:
                await conn.close()

        with _peer_schema(servers, "bench_peers_pgq_") as url:
            schema = url.rpartition("%3D")[2]
            publish_s, drain_s = asyncio.run(both(schema))
            seen = record.check(size, ordered=per_group)
            if left := _rows_left(url, "pgqueuer"):
                raise Broken(f"PgQueuer left {left} jobs")
        return Timed(publish_s, drain_s, seen, size.messages)

    return run


def pgmq_case(size: Size, servers: Servers) -> Timed:
    """pgmq is a server extension: without it on the server there is nothing to run."""
    _answers_postgres(servers.postgres)
    import psycopg

    with psycopg.connect(servers.postgres, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'pgmq'"
        ).fetchone()
    if not row or not row[0]:
        raise NotRun("the pgmq extension is not installed on this PostgreSQL server")
    raise NotRun("the pgmq extension is on this server, but this bench has no pgmq case yet")


ORDERED = "one at a time per group, in publish order"
CASES: dict[str, Case] = {
    "ours-runtime-postgresql": Case(
        "ours, Worker, PostgreSQL", ORDERED, True, ours_runtime("postgresql")
    ),
    "ours-runtime-redis": Case("ours, Worker, Redis", ORDERED, True, ours_runtime("redis")),
    "ours-runtime-sqlite": Case("ours, Worker, SQLite", ORDERED, True, ours_runtime("sqlite")),
    "ours-loop-postgresql": Case(
        "ours, claim_many/ack_many loop, PostgreSQL", ORDERED, True, ours_loop("postgresql")
    ),
    "ours-loop-redis": Case(
        "ours, claim_many/ack_many loop, Redis", ORDERED, True, ours_loop("redis")
    ),
    "ours-loop-sqlite": Case(
        "ours, claim_many/ack_many loop, SQLite", ORDERED, True, ours_loop("sqlite")
    ),
    "procrastinate": Case("procrastinate, lock= per group", ORDERED, True, procrastinate_case),
    "pgqueuer": Case(
        "PgQueuer, an entrypoint per group, concurrency_limit=1",
        ORDERED,
        True,
        pgqueuer_case(per_group=True),
    ),
    "pgqueuer-unordered": Case(
        "PgQueuer, one entrypoint, no limit",
        "none per group: jobs by priority then id, any number at once",
        False,
        pgqueuer_case(per_group=False),
    ),
    "pgmq": Case("pgmq", "per queue, not per group (a visibility timeout)", False, pgmq_case),
}
# Each peer's drain against ours on the same server, in the same rounds.
AGAINST = {
    "procrastinate": "ours-runtime-postgresql",
    "pgqueuer": "ours-runtime-postgresql",
    "pgqueuer-unordered": "ours-runtime-postgresql",
}


def measure(
    names: list[str], size: Size, rounds: int, servers: Servers, out: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Every case ``rounds`` times, the cases of a round back to back; a case that cannot
    run here is tried once and reported with its reason."""
    results: dict[str, dict[str, Any]] = {
        name: {"label": CASES[name].label, "guarantees": CASES[name].guarantees} for name in names
    }
    timed: dict[str, list[Timed]] = {name: [] for name in names}
    for round_no in range(1, rounds + 1):
        for name in names:
            if "not_run" in results[name]:
                continue
            try:
                one = CASES[name].run(size, servers)
            except NotRun as reason:
                results[name]["not_run"] = str(reason)
                out(f"round {round_no}: {name}: not run: {reason}")
                continue
            timed[name].append(one)
            stopped = (
                f" ({one.handled:,} of {size.messages:,} handled, then stopped at the limit)"
                if one.handled < size.messages
                else ""
            )
            out(
                f"round {round_no}: {name}: publish {size.messages / one.publish:,.0f}/s, "
                f"drain {one.handled / one.drain:,.0f}/s{stopped}"
            )
    for name, runs in timed.items():
        if not runs:
            continue
        publish = [size.messages / r.publish for r in runs]
        drain = [r.handled / r.drain for r in runs]
        results[name].update(
            publish=publish,
            drain=drain,
            publish_median=statistics.median(publish),
            drain_median=statistics.median(drain),
            seen=[r.seen for r in runs],
            handled=[r.handled for r in runs],
        )
    for peer, ours in AGAINST.items():
        if "drain" in results.get(peer, {}) and "drain" in results.get(ours, {}):
            results[peer]["ours_over_it"] = statistics.median(
                a / b for a, b in zip(results[ours]["drain"], results[peer]["drain"], strict=True)
            )
    return results


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def table(results: dict[str, dict[str, Any]], messages: int) -> list[str]:
    lines = [
        f"{'system':56s} {'drain msg/s (range)':>24s} {'publish msg/s (range)':>26s}  guarantees"
    ]
    for result in results.values():
        if "not_run" in result:
            lines.append(f"{result['label']:56s} {'not run: ' + result['not_run']}")
            continue
        note = result["guarantees"]
        if "ours_over_it" in result:
            note += f"; ours (Worker, PostgreSQL) {result['ours_over_it']:.1f}x it"
        if min(result["handled"]) < messages:
            note += f"; stopped at the time limit, {min(result['handled']):,}+ of {messages:,} done"
        worst = max(seen["groups_out_of_order"] for seen in result["seen"])
        if worst:
            note += f"; seen: up to {worst} groups out of order"
        lines.append(
            f"{result['label']:56s} {_spread(result['drain']):>24s} "
            f"{_spread(result['publish']):>26s}  {note}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--limit",
        type=float,
        default=60.0,
        help="seconds procrastinate's drain may take; then its rate is of the part done (60)",
    )
    parser.add_argument(
        "--only", action="append", choices=list(CASES), help="run this case (repeat for more)"
    )
    parser.add_argument(
        "--postgres", default=os.environ.get("TRANSPORTS_POSTGRES_URL") or POSTGRES_URL
    )
    parser.add_argument("--redis", default=os.environ.get("TRANSPORTS_REDIS_URL") or REDIS_URL)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)
    if min(args.messages, args.groups, args.rounds, args.concurrency) < 1:
        parser.error("--messages, --groups, --rounds and --concurrency must be at least 1")
    # A terminated run still removes its stores (the context managers' finally).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = Size(args.messages, args.groups, args.concurrency, args.limit)
    names = args.only or list(CASES)
    print(
        f"{size.messages:,} messages over {size.groups:,} groups, concurrency "
        f"{size.concurrency}, {args.rounds} rounds; medians and the rounds' range"
    )
    results = measure(names, size, args.rounds, Servers(args.postgres, args.redis), print)
    for line in table(results, size.messages):
        print(line)
    if args.out is not None:
        meta = {
            "messages": size.messages,
            "groups": size.groups,
            "concurrency": size.concurrency,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
        }
        args.out.write_text(json.dumps({"meta": meta, "cases": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
