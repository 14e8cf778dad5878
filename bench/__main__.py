"""``python -m bench``: run every case, print medians, ratios and targets, write JSON.

    python -m bench                       # the full run (a few minutes)
    python -m bench --quick               # small sizes, seconds: checks the command works
    python -m bench --out r.json --plot docs/claim-latency.png

Peers are measured when installed (``pip install -e '.[bench]'``) and reported as
missing otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transports_cli.bench import cases as shared

from . import _cases as cases
from . import batch
from ._cases import summary
from ._report import plot, table, targets


@dataclass(frozen=True)
class Sizes:
    """The transport cases' own sizes at each setting, and the lab's cases beside them."""

    full: shared.Sizes  # n claim+ack cycles and publishes; total drained by processes
    normal: shared.Sizes
    backlog: tuple[int, ...]
    groups: tuple[int, ...]
    backlog_n: int  # measured cycles per backlog size
    seed_backlog: tuple[int, ...]
    procs_rounds: int  # rounds of 1 and of 4 processes, taken in turn
    peers: int  # messages per round, peer and ours taken in turn
    peer_rounds: int


FULL = Sizes(
    # each round a fraction of a second: more of them steady the medians; a process
    # case runs a second or more, or it measures start and finish
    full=shared.Sizes(n=300, rounds=9, batches=10, total=2400),
    normal=shared.Sizes(n=3000, rounds=9, batches=10, total=20_000),
    backlog=(1_000, 10_000, 100_000, 1_000_000),
    groups=(10, 10_000),
    backlog_n=2000,
    seed_backlog=(1_000, 10_000, 100_000, 1_000_000),
    procs_rounds=3,
    peers=1000,
    peer_rounds=7,
)
QUICK = Sizes(
    full=shared.Sizes(n=20, rounds=2, batches=1, total=40),
    normal=shared.Sizes(n=200, rounds=2, batches=1, total=300),
    backlog=(200, 2_000),
    groups=(10, 100),
    backlog_n=100,
    seed_backlog=(200, 2_000),
    procs_rounds=1,
    peers=50,
    peer_rounds=1,
)
SEED_CYCLES = {1_000: 200, 10_000: 50, 100_000: 10, 1_000_000: 3}


def plan(s: Sizes, work: cases.Workdir) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    """(label, thunk) for each step, in the order they run; a thunk returns its cases."""
    for sync, at in (("full", s.full), ("normal", s.normal)):
        n = at.n
        yield (
            f"claim+ack, {sync}",
            partial(
                cases.interleaved,
                at.rounds,
                n,
                {
                    f"floor.{sync}": cases.floor(work, sync, n, at.rounds),
                    f"sync.{sync}": cases.transport_sync(work, sync, n, at.rounds),
                    f"async.{sync}": cases.transport_async(work, sync, n, at.rounds),
                },
            ),
        )
        yield (
            f"publish, {sync}",
            partial(
                cases.interleaved,
                at.rounds,
                n,
                {
                    f"publish_raw.{sync}": cases.publish_raw(work, sync, n),
                    f"publish.{sync}": cases.publish_transport(work, sync, n),
                },
            ),
        )
        yield (
            f"publish_many, {sync}",
            partial(
                cases.interleaved,
                at.rounds,
                at.batches * shared.BATCH,
                {
                    f"publish_many_raw.{sync}": cases.publish_many_raw(work, sync, at.batches),
                    f"publish_many.{sync}": cases.publish_many_transport(work, sync, at.batches),
                    # the same batches spread over 1,000 groups (the raw case has no groups)
                    f"publish_many_spread.{sync}": cases.publish_many_transport(
                        work, sync, at.batches, groups=1000
                    ),
                },
            ),
        )
    for sync, at in (("normal", s.normal), ("full", s.full)):
        yield f"batch calls, {sync}", partial(_batch, work, sync, at.n, at.rounds)
    for groups in s.groups:
        yield f"backlog, {groups} groups", partial(_backlog, work, s, groups)
        for size in s.seed_backlog:
            n = min(SEED_CYCLES.get(size, 50), size // 2)
            yield f"seed query, {size}/{groups}", partial(_seed, work, size, groups, n)
    for sync, at in (("normal", s.normal), ("full", s.full)):
        yield f"1 and 4 processes, {sync}", partial(_procs, work, at.total, sync, s.procs_rounds)
    for name, peer in (
        ("persist_queue", cases.peer_persist_queue),
        ("litequeue", cases.peer_litequeue),
    ):
        yield name, partial(_peer, work, s.peers, s.peer_rounds, name, peer)


def _batch(work: cases.Workdir, sync: str, n: int, rounds: int) -> dict[str, Any]:
    """`bench.batch`'s SQLite cases (claim+ack, claim_many+ack_many, the ack_and_claim
    loop and its async twin, the two-commit floor) at ``sync``, in the same rounds."""
    with work.db(f"batch-{sync}") as path:
        found = batch.measure_queue(f"sqlite:///{path}", rounds, n, batch.LIMIT, synchronous=sync)
    return {f"batch.{sync}.{name}": result for name, result in found.items()}


def _backlog(work: cases.Workdir, s: Sizes, groups: int) -> dict[str, Any]:
    found = cases.backlog(work, s.backlog, groups, s.backlog_n, "normal")
    return {f"backlog.{groups}.{size}": result for size, result in found.items()}


def _seed(work: cases.Workdir, size: int, groups: int, n: int) -> dict[str, Any]:
    return {f"seed.{groups}.{size}": cases.backlog_seed(work, size, groups, n, "normal")}


def _procs(work: cases.Workdir, total: int, sync: str, rounds: int) -> dict[str, Any]:
    """1 and 4 processes draining ``total`` messages, ``rounds`` times each, taken in turn
    (so that a burst of load on the machine hits both alike): the median rate of each."""
    runs: dict[int, list[dict[str, Any]]] = {1: [], 4: []}
    for r in range(rounds):
        for workers in (1, 4) if r % 2 == 0 else (4, 1):
            runs[workers].append(cases.processes(work, workers, total, sync))
    return {
        f"processes.{sync}.{workers}": summary(
            "msg/s",
            [run["median"] for run in done],
            workers=workers,
            done=sum(run["done"] for run in done),
            errors=[e for run in done for e in run["errors"]],
            drained=all(run["drained"] for run in done),
        )
        for workers, done in runs.items()
    }


def _peer(
    work: cases.Workdir,
    n: int,
    rounds: int,
    name: str,
    measure: Callable[[cases.Workdir, int], dict[str, Any] | None],
) -> dict[str, Any]:
    """A peer queue and this transport (at the peer's own ``synchronous``) doing the same
    ``n`` puts then ``n`` gets+acks, ``rounds`` times each, taken in turn: medians."""
    first = measure(work, n)
    if first is None:  # not installed
        return {f"peers.{name}": None}
    sync = first["synchronous"]
    theirs, ours = [first], []
    for r in range(rounds):
        ours.append(cases.ours_like_peer(work, n, sync))
        if r < rounds - 1:
            again = measure(work, n)
            assert again is not None
            theirs.append(again)

    def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "put": statistics.median(run["put"] for run in runs),
            "get_ack": statistics.median(run["get_ack"] for run in runs),
            "put_rounds": [run["put"] for run in runs],
            "get_ack_rounds": [run["get_ack"] for run in runs],
            "synchronous": sync,
        }

    return {f"peers.{name}": medians(theirs), f"peers.ours.{sync}": medians(ours)}


def machine() -> dict[str, Any]:
    return {**shared.machine(), "sqlite": sqlite3.sqlite_version}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; runs in seconds")
    parser.add_argument("--out", type=Path, help="JSON file (default: bench/results/<time>.json)")
    parser.add_argument("--plot", type=Path, help="also draw claim latency vs backlog (PNG)")
    parser.add_argument("--dir", type=Path, help="where to put the databases (default: a temp dir)")
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    out = args.out or Path(__file__).parent / "results" / time.strftime("%Y%m%d-%H%M%S.json")
    started = time.time()
    meta = {"quick": args.quick, "started": started, "machine": machine()}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-", dir=args.dir) as tmp:
        work = cases.Workdir(Path(tmp))
        steps = list(plan(sizes, work))
        with shared.progress(sys.stderr.isatty(), len(steps), width=28) as done:
            for label, run in steps:
                results.update(run())
                done(label)
    meta["seconds"] = time.time() - started
    meta["loadavg_after"] = list(os.getloadavg())
    checked = targets(results)
    report = {"meta": meta, "cases": results, "targets": checked}

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(table(results, checked, meta))
    print(f"\nwrote {out}")
    if args.plot:
        if plot(results, args.plot):
            print(f"wrote {args.plot}")
        else:
            print("no plot: matplotlib is not installed (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
