"""``transports bench``: the transport-level benchmark against any URL, with a progress
bar, a table of medians and a JSON report.

The cases themselves, and the sizes, are in `transports_cli.bench.cases` (shared with
the repository's ``python -m bench``). This module picks sizes, keeps the queue as it
found it (empty), and reports.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from transports_cli._output import count_option, emit_json, print_table, url_argument
from transports_cli.admin import refuse_busy
from transports_core import (
    AsyncTransport,
    Event,
    Transport,
    TransportAdmin,
    UnknownBackend,
    open_async_transport,
    open_transport,
    redact_url,
)

from . import cases

__all__ = ["bench"]


def _clear(transport: Transport[Event], prefix: str) -> None:
    """Remove what a case left in the bench's own groups (nothing, after a claim case)."""
    if isinstance(transport, TransportAdmin):
        stats = transport.stats()
        bound = max(1, stats.ready + stats.in_flight + stats.parked + stats.dead)
        for group in transport.groups(limit=bound):
            if group.group_id.startswith(prefix):
                transport.purge_group(group.group_id)
        return
    while (lease := transport.claim("transports-bench-cleanup", visibility=30)) is not None:
        if not lease.group_id.startswith(prefix):  # someone else's, published meanwhile
            transport.nack(lease)
            return
        transport.ack(lease)


def _shared(transport: Transport[Event], url: str, prefix: str) -> bool:
    """Whether another connection sees what this one publishes (worker processes need it;
    an in-memory database, for one, is private to its connection)."""
    transport.publish(f"{prefix}probe", cases.EVENT)
    with open_transport(url) as second:
        lease = second.claim("transports-bench-probe", visibility=30)
        if lease is not None:
            second.ack(lease)
    _clear(transport, prefix)
    return lease is not None


def run_bench(
    url: str, sizes: cases.Sizes, workers: int, show_progress: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every case against ``url``; returns the results and the cases skipped, with why."""
    prefix = f"bench-{secrets.token_hex(3)}-"
    n, rounds = sizes.n, sizes.rounds
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    with ExitStack() as stack:
        t = stack.enter_context(open_transport(url))
        refuse_busy(t, url, "the benchmark")
        timed: list[tuple[str, int, AbstractContextManager[cases.Round]]] = [
            ("publish", n, cases.publish(t, n, prefix)),
            (
                "publish_many",
                sizes.batches * cases.BATCH,
                cases.publish_many(t, sizes.batches, prefix),
            ),
            ("claim_ack", n, cases.claim_ack(t, n, rounds, prefix)),
            ("claim_many", n, cases.claim_many(t, n, rounds, prefix)),
            ("ack_and_claim", n, cases.ack_and_claim(t, n, rounds, prefix)),
        ]
        try:
            twin = open_async_transport(url)
        except UnknownBackend as exc:
            skipped["claim_ack_async"] = skipped["ack_and_claim_async"] = str(exc)
        else:
            # Each async case closes its twin when done: the first gets the one opened here.
            unused = [twin]

            def open_twin() -> AsyncTransport[Event]:
                return unused.pop() if unused else open_async_transport(url)

            timed += [
                ("claim_ack_async", n, cases.claim_ack_async(open_twin, n, rounds, prefix)),
                ("ack_and_claim_async", n, cases.ack_and_claim_async(open_twin, n, rounds, prefix)),
            ]
        counts: list[int] = []
        if workers == 0:
            skipped["processes"] = "--workers 0"
        elif not _shared(t, url, prefix):
            skipped["processes"] = "another connection cannot see this store's messages"
        else:
            counts = sorted({1, workers})
        steps = rounds * len(timed) + len(counts)
        advance = stack.enter_context(cases.progress(show_progress, steps))
        # Each case on its own, the queue emptied after it: cases that left messages
        # behind would feed the claim cases (no baseline here to interleave with).
        for name, per_round, case in timed:
            try:
                results.update(cases.interleaved(rounds, per_round, {name: case}, advance))
            finally:
                _clear(t, prefix)
        for count in counts:
            advance(f"{count} processes")
            try:
                results[f"processes.{count}"] = cases.processes(url, {}, count, sizes.total, prefix)
            finally:
                _clear(t, prefix)
    return results, skipped


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _print_table(results: dict[str, Any], skipped: dict[str, str], sizes: cases.Sizes) -> None:
    rows = []
    for name, case in results.items():
        if name.startswith("processes."):
            workers = case["workers"]
            what = f"{case['done']} messages, {workers} process{'es' if workers > 1 else ''}"
            if case["errors"] or not case["drained"]:
                what += f"; NOT DRAINED, {len(case['errors'])} errors"
        elif name == "publish_many":
            what = f"{sizes.rounds} rounds of {sizes.batches} x {cases.BATCH} messages"
        elif name == "claim_many":
            what = f"{sizes.rounds} rounds of {sizes.n}, claim_many({cases.LIMIT}) + ack_many"
        else:
            what = f"{sizes.rounds} rounds of {sizes.n}"
        low, high = (
            min(case.get("rounds", [case["median"]])),
            max(case.get("rounds", [case["median"]])),
        )
        spread = "-" if low == high else f"{_rate(low)} .. {_rate(high)}"
        rows.append([name, _rate(case["median"]), spread, what])
    print_table(["case", "median", "range of rounds", "measured"], rows)
    for name, why in skipped.items():
        click.echo(f"skipped {name}: {why}")


@click.command(short_help="Measure publish, claim+ack and worker processes on a queue.")
@url_argument(required=False)
@count_option(
    "--workers",
    0,
    64,
    "Worker processes of the multi-process case (measured against 1 process; 0 skips it).",
    default=4,
)
@click.option("--quick", is_flag=True, help="Small sizes: finishes in seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Also write the report, every round included, to this JSON file.",
)
def bench(url: str | None, workers: int, quick: bool, as_json: bool, out: Path | None) -> None:
    """Measure a queue: publish (one message per call), publish_many (1,000 per call),
    claim+ack, claim_many of 50 then ack_many, a loop of ack_and_claim (each call acks
    a lease and leases the next), the claim+ack and ack_and_claim loops through the
    asyncio twin, and 1 and N worker processes draining the queue together. Prints the
    median of several rounds, in messages per second.

    URL defaults to a new SQLite file in a temporary directory; its options apply
    (sqlite:///q.db?synchronous=normal). Another URL must name a queue with no message
    waiting, because the claim cases claim and ack whatever is queued; the benchmark
    uses groups of its own (bench-<run id>-...) and removes them after each case.

    \b
    Example:
      transports bench
      transports bench --quick
      transports bench 'sqlite:///bench.db?synchronous=normal' --workers 2
      transports bench --json --out report.json | jq .cases.claim_ack.median
    """
    sizes = cases.QUICK if quick else cases.FULL
    started = time.time()
    meta = {"machine": cases.machine()}
    with ExitStack() as stack:
        if url is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            target = f"sqlite:///{workdir.resolve() / 'bench.db'}"
        else:
            target = url
        show = Console(stderr=True).is_terminal
        results, skipped = run_bench(target, sizes, workers, show)
    report = {
        "url": redact_url(target),
        "quick": quick,
        "sizes": asdict(sizes),
        "cases": results,
        "skipped": skipped,
        "seconds": round(time.time() - started, 3),
        "loadavg_after": list(os.getloadavg()),
        **meta,
    }
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    if as_json:
        emit_json(report)
    else:
        _print_report(report, sizes, out)
    failed = [
        name
        for name, case in results.items()
        if name.startswith("processes.") and (case["errors"] or not case["drained"])
    ]
    if failed:  # a benchmark that lost or duplicated work measured nothing worth having
        first = next((e for n in failed for e in results[n]["errors"]), "messages left over")
        raise click.ClickException(f"{', '.join(failed)} did not drain the queue: {first}")


def _print_report(report: dict[str, Any], sizes: cases.Sizes, out: Path | None) -> None:
    machine = report["machine"]
    click.echo(
        f"Benchmark of {report['url']}: python {machine['python']}, "
        f"{machine['cpus']} cpus, a thread trip {machine['thread_trip_us']:.0f} us, "
        f"load {machine['loadavg'][0]:.2f}, "
        f"{report['seconds']:.1f} s"
    )
    _print_table(report["cases"], report["skipped"], sizes)
    if out is not None:
        click.echo(f"Wrote {out}")
