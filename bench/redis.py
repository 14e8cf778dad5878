"""``python -m bench.redis``: the Redis backend against raw redis-py on the same server,
medians of a few rounds and the ratios the issue sets as targets (the two cases of a
target in alternating rounds).

    python -m bench.redis                 # short (about a minute); backlog 1k vs 100k
    python -m bench.redis --big           # backlog 1k vs 1,000,000
    python -m bench.redis --admin 1000000 # the admin calls on a million groups
    TRANSPORTS_REDIS_URL=redis://... python -m bench.redis

Every case works on a queue (or stream) of its own, deleted at the end. The SQLite and,
when one answers, the PostgreSQL backend run the same claim+ack loop for the table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any

import redis

from transports_core import Event, Transport, TransportError, open_transport
from transports_redis._scripts import NOTHING

from ._scratch import scratch

LOCAL_URL = "redis://127.0.0.1:6379/0"
EVENT = Event(kind="order.created", order=12345, amount=99.5)


def server() -> str:
    return os.environ.get("TRANSPORTS_REDIS_URL") or LOCAL_URL


def client() -> redis.Redis:
    return redis.Redis.from_url(server())


def drop(prefix: str) -> None:
    raw = client()
    keys = list(raw.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 1000):
        raw.delete(*keys[i : i + 1000])
    raw.close()


def queue(prefix: str) -> AbstractContextManager[str]:
    return scratch(f"bench-{prefix}-", lambda name: drop(f"dt:{{{name}}}:"))


def url(name: str) -> str:
    return f"{server()}?queue={name}"


def median_rate(rounds: int, run: Callable[[], tuple[int, float]]) -> float:
    """Items a second, the median of ``rounds`` runs of ``run`` (items, seconds)."""
    rates = []
    for _ in range(rounds):
        items, seconds = run()
        rates.append(items / seconds)
    return statistics.median(rates)


def paired_rates(
    rounds: int, base: Callable[[], tuple[int, float]], case: Callable[[], tuple[int, float]]
) -> tuple[float, float, float]:
    """The medians of ``base``'s and ``case``'s rates, run in turn each round so that a
    noisy moment hits both, and the median of the rounds' ratios (case / base)."""
    bases: list[float] = []
    cases: list[float] = []
    for _ in range(rounds):
        for rates, run in ((bases, base), (cases, case)):
            items, seconds = run()
            rates.append(items / seconds)
    ratio = statistics.median(c / b for b, c in zip(bases, cases, strict=True))
    return statistics.median(bases), statistics.median(cases), ratio


# --- cases -------------------------------------------------------------------------------


def floor(n: int) -> tuple[int, float]:
    """Two trivial EVALSHA round trips per message: what a claim+ack cannot beat."""
    raw = client()
    sha = raw.script_load(NOTHING.source)
    started = time.perf_counter()
    for _ in range(n):
        raw.evalsha(sha, 0)
        raw.evalsha(sha, 0)
    elapsed = time.perf_counter() - started
    raw.close()
    return n, elapsed


def claim_ack(transport: Transport[Event], n: int) -> tuple[int, float]:
    started = time.perf_counter()
    done = 0
    while done < n:
        lease = transport.claim("bench", 60)
        if lease is None:
            break
        transport.ack(lease)
        done += 1
    return done, time.perf_counter() - started


def fill(transport: Transport[Event], total: int, groups: int, batch: int = 10_000) -> None:
    for start in range(0, total, batch):
        transport.publish_many(
            [(f"g{i % groups}", EVENT, 0) for i in range(start, min(total, start + batch))]
        )


def redis_claim_ack(n: int, groups: int = 100) -> tuple[int, float]:
    with queue("cycle") as name, open_transport(url(name)) as transport:
        fill(transport, n, groups)
        return claim_ack(transport, n)


def _worker(address: str, n: int, ready: Any, go: Any, out: Any) -> None:
    with open_transport(address) as transport:
        transport.claim("warm", 60, 4)  # connect and load the scripts before the start
        ready.release()
        go.wait()
        done, seconds = claim_ack(transport, n)
        out.put((done, seconds))


def processes(count: int, per_process: int) -> tuple[int, float]:
    """``count`` processes draining distinct groups of one queue; items over wall time."""
    ctx = multiprocessing.get_context("spawn")
    with queue("procs") as name:
        with open_transport(url(name)) as transport:
            fill(transport, count * per_process, count * 50)
        ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        children = [
            ctx.Process(target=_worker, args=(url(name), per_process, ready, go, out))
            for _ in range(count)
        ]
        for child in children:
            child.start()
        for _ in children:
            ready.acquire()
        started = time.perf_counter()
        go.set()
        results = [out.get(timeout=300) for _ in children]
        elapsed = time.perf_counter() - started
        for child in children:
            child.join()
    return sum(done for done, _ in results), elapsed


def claim_latency(backlogs: tuple[int, int], groups: int, samples: int) -> tuple[float, float]:
    """Median seconds of one claim (acked outside the timing) on two queues of these
    backlogs, sampled in alternating blocks so that a noisy moment hits both alike."""
    with queue("small") as small, queue("large") as large:
        handles = [open_transport(url(small)), open_transport(url(large))]
        try:
            for transport, backlog in zip(handles, backlogs, strict=True):
                fill(transport, backlog, groups)
            times: list[list[float]] = [[], []]
            for block in range(2 * samples // 50):
                transport, out = handles[block % 2], times[block % 2]
                for _ in range(50):
                    started = time.perf_counter()
                    lease = transport.claim("bench", 60)
                    out.append(time.perf_counter() - started)
                    assert lease is not None
                    transport.ack(lease)
                    transport.publish(lease.group_id, EVENT)  # keep the backlog where it was
            return statistics.median(times[0]), statistics.median(times[1])
        finally:
            for transport in handles:
                transport.close()


def publish_many(batches: int, size: int) -> tuple[int, float]:
    with queue("many") as name, open_transport(url(name)) as transport:
        items = [(f"g{i % 100}", EVENT, 0) for i in range(size)]
        started = time.perf_counter()
        for _ in range(batches):
            transport.publish_many(items)
        return batches * size, time.perf_counter() - started


def raw_pipeline(batches: int, size: int) -> tuple[int, float]:
    """The same data written with a pipeline of plain HSETs and RPUSHes: no order, no groups."""
    name = f"bench-raw-{uuid.uuid4().hex[:8]}"
    raw = client()
    payload = EVENT.model_dump_json()
    try:
        started = time.perf_counter()
        seq = 0
        for _ in range(batches):
            pipe = raw.pipeline(transaction=False)
            for i in range(size):
                seq += 1
                pipe.hset(f"{name}:ev", str(seq), payload)
                pipe.rpush(f"{name}:g{i % 100}", seq)
            pipe.execute()
        return batches * size, time.perf_counter() - started
    finally:
        raw.close()
        drop(f"{name}:")


def streams(n: int) -> tuple[int, float]:
    """Redis Streams with a consumer group: XREADGROUP one, XACK it (no groups, no order
    across consumers, no exclusivity); filled with XADD outside the timing."""
    name = f"bench-stream-{uuid.uuid4().hex[:8]}"
    raw = client()
    payload = EVENT.model_dump_json()
    try:
        pipe = raw.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd(name, {"e": payload})
        pipe.execute()
        raw.xgroup_create(name, "workers", id="0")
        started = time.perf_counter()
        for _ in range(n):
            got: Any = raw.xreadgroup("workers", "c1", {name: ">"}, count=1)
            ((_, entries),) = got
            raw.xack(name, "workers", entries[0][0])
        return n, time.perf_counter() - started
    finally:
        raw.delete(name)
        raw.close()


def memory_per_message(n: int, groups: int) -> float:
    """Bytes of server memory per queued message (small event), from INFO used_memory."""
    raw = client()
    with queue("memory") as name, open_transport(url(name)) as transport:
        before = int(raw.info("memory")["used_memory"])
        fill(transport, n, groups)
        after = int(raw.info("memory")["used_memory"])
    raw.close()
    return (after - before) / n


def other_backend(address: str, n: int) -> float:
    with open_transport(address) as transport:
        fill(transport, n, 100)
        done, seconds = claim_ack(transport, n)
        return done / seconds


@contextmanager
def private_server() -> Iterator[redis.Redis]:
    """A redis-server of the benchmark's own (no persistence), for cases that change its
    settings or fill it with more than a shared server should hold."""
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as tmp:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        process = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
             "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        raw = redis.Redis(port=port)
        try:
            for _ in range(200):
                try:
                    raw.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            yield raw
        finally:
            raw.close()
            process.kill()
            process.wait()


def _worker_latency(address: str, ready: Any, stop: Any, out: Any) -> None:
    """A worker process on another queue of the same server: claim+ack (and a publish to
    keep the queue full) until ``stop``; puts the 99th percentile and the slowest of its
    cycles (seconds) and how many were refused on ``out``."""
    cycles, refused = [], 0
    with open_transport(address) as transport:
        transport.publish_many([(f"w{i}", EVENT, 0) for i in range(100)])
        ready.set()
        while not stop.is_set():
            started = time.perf_counter()
            try:
                lease = transport.claim("bench", 60)
                assert lease is not None
                transport.ack(lease)
                transport.publish(lease.group_id, EVENT)
            except TransportError:  # BUSY: a script has run past lua-time-limit
                refused += 1
                time.sleep(0.01)
            cycles.append(time.perf_counter() - started)
    cycles.sort()
    out.put((cycles[int(len(cycles) * 0.99)], cycles[-1], refused))


def _scripts_of(raw: redis.Redis, call: Callable[[], object]) -> tuple[float, list[float]]:
    """Run ``call`` alone with every command logged (SLOWLOG, which in Redis 7 logs the
    commands inside scripts too): its wall seconds, and the seconds of each script call
    (FCALL, or EVALSHA where the server refused the library)."""
    raw.config_set("slowlog-log-slower-than", 0)
    raw.slowlog_reset()
    started = time.perf_counter()
    call()
    elapsed = time.perf_counter() - started
    log: Any = raw.slowlog_get(1_000_000)
    raw.config_set("slowlog-log-slower-than", 10_000)
    return elapsed, sorted(
        e["duration"] / 1e6
        for e in log
        if e["command"].split()[0].upper() in (b"FCALL", b"EVALSHA")
    )


def _beside_a_worker(port: int, call: Callable[[], object]) -> tuple[float, float, int]:
    """Run ``call`` while a worker process claims and acks on another queue of the same
    server: the 99th percentile and slowest of its cycles, and how many were refused."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    address = f"redis://127.0.0.1:{port}/0?queue=worker"
    worker = ctx.Process(target=_worker_latency, args=(address, ready, stop, out))
    worker.start()
    ready.wait(60)
    time.sleep(0.2)
    call()
    stop.set()
    p99, slowest, refused = out.get(timeout=60)
    worker.join()
    return p99, slowest, refused


def admin_costs(
    groups: int,
) -> Iterator[tuple[str, float, int, float, float, float, float, int]]:
    """Per admin call on a private server's queue of ``groups`` one-message groups (3,000
    of them leased, parked or dead), run alone: wall seconds, scripts run, the median and
    longest script (seconds, from SLOWLOG); run again beside a worker on another queue of
    the same server: the 99th percentile and the slowest claim+ack of the worker, and how
    many of its calls the server refused."""
    with private_server() as raw:
        port = raw.connection_pool.connection_kwargs["port"]
        raw.config_set("slowlog-max-len", 1_000_000)
        address = f"redis://127.0.0.1:{port}/0?queue=admin&socket_timeout=600"
        with open_transport(address, max_attempts=1, on_dead="hold") as transport:
            fill(transport, groups, groups)
            for n in range(0, 3000):  # a few of every state
                lease = transport.claim("bench", 3600)
                assert lease is not None
                if n % 3 == 1:
                    transport.nack(lease, 3600)
                elif n % 3 == 2:
                    transport.bury(lease, "benchmark")
            for deep in ("deep-1", "deep-2"):
                transport.publish_many([(deep, EVENT, 0)] * 5000)
            admin: Any = transport
            calls: list[tuple[str, Callable[[int], object]]] = [
                ("(none: the worker alone)", lambda _: time.sleep(1)),
                ("stats()", lambda _: admin.stats()),
                ("groups(limit=10)", lambda _: admin.groups(limit=10)),
                ("dead_letters()", lambda _: admin.dead_letters()),
                ("held_groups()", lambda _: admin.held_groups()),
                ("purge_group() of 5,000", lambda i: admin.purge_group(f"deep-{i}")),
            ]
            with open_transport(address.replace("queue=admin", "queue=warm")) as warm:
                spare: Any = warm  # the library loaded, so that no load is counted
                spare.stats(), spare.groups(), spare.dead_letters(), spare.purge_group("g")
            for label, call in calls:
                elapsed, scripts = _scripts_of(raw, partial(call, 1))
                p99, slowest, refused = _beside_a_worker(port, partial(call, 2))
                typical = scripts[len(scripts) // 2] if scripts else 0.0
                longest = scripts[-1] if scripts else 0.0
                yield (label, elapsed, len(scripts), typical, longest, p99, slowest, refused)


# --- report ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis", description=__doc__)
    parser.add_argument("--big", action="store_true", help="1,000,000-message backlog")
    parser.add_argument(
        "--admin",
        type=int,
        metavar="GROUPS",
        help="only the admin calls' cost on a private server's queue of GROUPS groups",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=3000, help="claim+ack cycles a round")
    args = parser.parse_args(argv)
    n, rounds = args.n, args.rounds
    if args.admin:
        print(f"admin calls on a queue of {args.admin:,} groups (private server)")
        print("script ms: the call's scripts, median and longest (SLOWLOG); worker ms: a")
        print("worker's claim+ack on another queue meanwhile, 99th percentile and slowest,")
        print("and how many of its calls the server refused as BUSY running a script")
        head = ("call", "wall s", "scripts", "p50", "max", "p99", "max", "refused")
        print("{:<26}{:>7}{:>8}   script ms{:>8}{:>9}   worker ms{:>8}{:>9}{:>8}".format(*head))
        for label, wall, count, p50, most, p99, worst, refused in admin_costs(args.admin):
            print(
                f"{label:<26}{wall:>7.2f}{count:>8,}{p50 * 1e3:>20.1f}{most * 1e3:>9.1f}"
                f"{p99 * 1e3:>20.1f}{worst * 1e3:>9.1f}{refused:>8,}",
                flush=True,
            )
        return 0
    big = 1_000_000 if args.big else 100_000
    rows: list[tuple[str, str]] = []

    def show(label: str, value: str) -> None:
        rows.append((label, value))
        print(f"{label:<52} {value}", flush=True)

    print(f"server {redis.Redis.from_url(server()).info('server')['redis_version']}, n={n}")
    # Each target's two cases take their rounds in turn; the ratio is the median of the
    # rounds' own ratios.
    floor_rate, cycle, ratio = paired_rates(rounds, lambda: floor(n), lambda: redis_claim_ack(n))
    show("floor: 2 trivial EVALSHA a message (messages/s)", f"{floor_rate:,.0f}")
    show("claim+ack, one connection (messages/s)", f"{cycle:,.0f}")
    show("  claim+ack / floor (target >= 0.5)", f"{ratio:.2f}")
    one, four, ratio = paired_rates(rounds, lambda: processes(1, n), lambda: processes(4, n))
    show("1 process (messages/s)", f"{one:,.0f}")
    show("4 processes, distinct groups (messages/s)", f"{four:,.0f}")
    show(f"  4 / 1 (target >= 2; {os.cpu_count()} cores here)", f"{ratio:.2f}")
    for groups in (10, 10_000):
        small, large = claim_latency((1000, big), groups, 500)
        show(f"claim latency, {groups} groups, 1k queued (us)", f"{small * 1e6:,.0f}")
        show(f"claim latency, {groups} groups, {big:,} queued (us)", f"{large * 1e6:,.0f}")
        show("  large / small (target <= 1.3)", f"{large / small:.2f}")
    many = median_rate(rounds, lambda: publish_many(10, 1000))
    pipe = median_rate(rounds, lambda: raw_pipeline(10, 1000))
    show("publish_many, batches of 1,000 (messages/s)", f"{many:,.0f}")
    show("pipelined raw HSET+RPUSH, batches of 1,000 (messages/s)", f"{pipe:,.0f}")
    show("  publish_many / raw (target >= 0.5)", f"{many / pipe:.2f}")
    stream = median_rate(rounds, lambda: streams(n))
    show("Redis Streams XREADGROUP+XACK (messages/s)", f"{stream:,.0f}")
    show("  claim+ack / Streams", f"{cycle / stream:.2f}")
    for groups in (10, 10_000):
        per = memory_per_message(100_000, groups)
        show(f"memory per queued message, {groups} groups (bytes)", f"{per:,.0f}")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = median_rate(1, lambda: (n, n / other_backend(f"sqlite:///{tmp}/q.db", n)))
    show("SQLite claim+ack, same loop (messages/s)", f"{sqlite:,.0f}")
    pg = os.environ.get("TRANSPORTS_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
    schema = f"bench_redis_{uuid.uuid4().hex[:8]}"
    try:
        rate = other_backend(f"{pg}?schema={schema}", n)
        show("PostgreSQL claim+ack, same loop (messages/s)", f"{rate:,.0f}")
    except Exception as exc:  # the table is still useful without it
        show("PostgreSQL claim+ack", f"not measured ({type(exc).__name__})")
    finally:
        try:
            import psycopg

            with psycopg.connect(pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
