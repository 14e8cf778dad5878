"""``transports demo``: publish a workload, work it off with real processes, verify it.

The main process publishes the events of many executions, starts worker processes
(`_worker`), follows their progress for the live view (`_live`), then reads
their journals and checks them (`_journal`). The verdict rests on the journals
alone, never on the progress messages.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import secrets
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from multiprocessing.context import ForkServerContext, SpawnContext
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from transports_cli._output import count_option, emit_json, url_argument
from transports_cli.admin import refuse_busy
from transports_cli.worker import seconds_option
from transports_core import Event, open_transport, redact_url
from transports_core.conformance.journal import read

from . import _worker
from ._journal import Plan, Verdict, verify
from ._live import DemoView
from ._worker import WorkerSpec, work

__all__ = ["demo"]

URGENT = 3  # worker-0's priority floor when there are enough workers to spare one


@dataclass(frozen=True)
class Settings:
    executions: int
    events: int
    workers: int
    seed: int
    timeout: float
    debug: bool


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    wall_seconds: float
    journals: list[Path]


def make_items(settings: Settings, prefix: str) -> list[tuple[str, Event, int]]:
    """The events to publish, with their groups' priorities, step by step across groups
    (so every group exists, with its priority, after the first round)."""
    rng = random.Random(settings.seed)
    groups = [f"{prefix}{n:04d}" for n in range(settings.executions)]
    priorities = {group: rng.randrange(5) for group in groups}
    return [
        (group, Event(step=step), priorities[group])
        for step in range(settings.events)
        for group in groups
    ]


def make_plan(settings: Settings, items: list[tuple[str, Event, int]], seqs: list[int]) -> Plan:
    """What was published (by seq, as ``publish_many`` returned them) and who has a floor."""
    floors = {"worker-0": URGENT} if settings.workers >= 3 else {}
    return Plan(
        published={seq: group for seq, (group, _, _) in zip(seqs, items, strict=True)},
        events=dict.fromkeys([group for group, _, _ in items], settings.events),
        priorities={group: priority for group, _, priority in items},
        floors=floors,
    )


def run_demo(
    settings: Settings,
    url: str,
    workdir: Path,
    on_progress: Callable[[tuple[str, ...]], None],
    on_published: Callable[[Plan], None],
) -> Outcome:
    started = time.monotonic()
    run_id = secrets.token_hex(3)
    items = make_items(settings, prefix=f"demo-{run_id}-")
    with open_transport(url) as transport:
        refuse_busy(transport, url, "the demo")
        plan = make_plan(settings, items, transport.publish_many(items))
    with open_transport(url) as second:
        # The workers are other processes: a store that another connection cannot see
        # (an in-memory database) would leave them idle until the timeout.
        lease = second.claim("transports-demo-probe", visibility=5)
        if lease is None:
            raise click.ClickException(
                f"a second connection to {redact_url(url)} sees none of the events just "
                "published; the demo's workers are separate processes and need a shared "
                "store (not an in-memory database)"
            )
        second.nack(lease)
    on_published(plan)

    specs = [
        WorkerSpec(
            url=url,
            worker_id=f"worker-{n}",
            journal=workdir / f"demo-{run_id}-worker-{n}.journal",
            prefix=f"demo-{run_id}-",
            seed=settings.seed,
            min_priority=plan.floors.get(f"worker-{n}", 0),
            debug=settings.debug,
        )
        for n in range(settings.workers)
    ]
    # Every worker without a priority floor handles a message before any handles a
    # second: each holds a group of its own, so there must be a group for each.
    meeting = [spec for spec in specs if spec.min_priority == 0]
    if 1 < len(meeting) <= settings.executions:
        specs = [replace(spec, meets=spec in meeting) for spec in specs]
    problems = _work_off(settings, plan, specs, on_progress)
    journals = [spec.journal for spec in specs]
    verdict = verify(plan, read(journals), problems)
    return Outcome(verdict, time.monotonic() - started, journals)


def _work_off(
    settings: Settings,
    plan: Plan,
    specs: list[WorkerSpec],
    on_progress: Callable[[tuple[str, ...]], None],
) -> list[str]:
    """Run the workers until every event is acked, a worker fails, or time runs out;
    return the problems seen."""
    context = _start_method()
    stop = context.Event()
    progress: multiprocessing.Queue[tuple[str, ...]] = context.Queue()
    meet = context.Barrier(max(sum(spec.meets for spec in specs), 1))
    processes = [
        context.Process(target=work, args=(spec, stop, progress, meet), name=spec.worker_id)
        for spec in specs
    ]
    problems: list[str] = []
    failed: set[str] = set()
    acked = 0
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + settings.timeout
        while acked < plan.total and not failed:
            if time.monotonic() > deadline:
                problems.append(
                    f"timed out after {settings.timeout:g} s with {acked} of "
                    f"{plan.total} events acked"
                )
                break
            try:
                message = progress.get(timeout=0.1)
            except queue.Empty:
                if not any(process.is_alive() for process in processes):
                    problems.append("every worker exited before the work was done")
                    break
                continue
            acked += message[0] == "ack"
            if message[0] == "error":
                failed.add(message[1])
                problems.append(f"{message[1]} failed: {message[2]}")
            on_progress(message)
    finally:
        stop.set()
        meet.abort()  # a worker still waiting for one that failed goes on
        _reap(processes, progress, on_progress, problems)
    for process in processes:
        if process.exitcode != 0 and process.name not in failed:
            problems.append(f"{process.name} exited with code {process.exitcode}")
    return problems


def _start_method() -> SpawnContext | ForkServerContext:
    """Workers that inherit no threads, locks or handles from this process. Where it
    exists, a fork server (one fresh interpreter, which imports the worker's code once)
    forks them, instead of each worker starting and importing a whole interpreter."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([_worker.__name__])
    return context


def _reap(
    processes: list[Any],
    progress: multiprocessing.Queue[tuple[str, ...]],
    on_progress: Callable[[tuple[str, ...]], None],
    problems: list[str],
) -> None:
    # A worker with progress messages still buffered cannot exit until they are read.
    deadline = time.monotonic() + 10
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        try:
            while True:
                message = progress.get_nowait()
                if message[0] == "error":
                    problems.append(f"{message[1]} failed: {message[2]}")
                on_progress(message)
        except queue.Empty:
            pass
        for process in processes:
            process.join(0.02)
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
            problems.append(f"{process.name} did not stop within 10 s and was terminated")
    progress.close()


def verdict_line(verdict: Verdict, workers: int) -> str:
    if verdict.ok:
        return (
            f"OK: {verdict.acked} events of {verdict.executions} executions handled in order, "
            f"one at a time, none lost or duplicated ({workers} workers, "
            f"{verdict.events_per_second:,.0f} events/s)"
        )
    count = len(verdict.problems)
    return (
        f"FAILED: {count} problem{'s' if count > 1 else ''} in {verdict.published} events of "
        f"{verdict.executions} executions; first: {verdict.problems[0]}"
    )


@click.command(short_help="Work off a demo workload with worker processes, then verify it.")
@url_argument(required=False)
@click.option(
    "--dir",
    "directory",
    type=click.Path(exists=True, file_okay=False, writable=True, path_type=Path),
    help="Keep the database (demo.db, unless URL is given) and the workers' journals in "
    "DIRECTORY instead of a temporary directory.",
)
@count_option(
    "--executions",
    1,
    100_000,
    "Executions (groups) to publish.  [default: 300, or 24 with --quick]",
)
@count_option("--events", 1, 1_000, "Events per execution.", default=8)
@count_option("--workers", 1, 64, "Worker processes.  [default: 4, or 2 with --quick]")
@click.option(
    "--seed",
    type=int,
    help="Seed for priorities, parks and retries.  [default: random, printed]",
)
@seconds_option("--timeout", "Give up, and fail, after this many seconds.", 60, low=1)
@click.option("--quick", is_flag=True, help="A small run for smoke tests.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the verdict line.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as one JSON object.")
@click.pass_context
def demo(
    ctx: click.Context,
    url: str | None,
    directory: Path | None,
    executions: int | None,
    events: int,
    workers: int | None,
    seed: int | None,
    timeout: float,
    quick: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Publish the events of many executions, work them off with several worker
    processes, and verify from their journals that each execution's events were
    handled in order, one at a time, none lost or duplicated.

    The workers run on the worker runtime (transports worker). Their handler
    sometimes parks a message (raises Retry with a delay) or fails it (raises, and it
    is retried at once). With three or more workers, worker-0 takes only groups of
    priority 3 and up. URL defaults to a new SQLite file; another URL must name an
    empty queue. Exits 1 if the verdict fails.

    \b
    Example:
      transports demo
      transports demo --quick --quiet
      transports demo sqlite:///demo.db --executions 1000 --workers 6 --seed 7
      transports demo --json | jq .events_per_second
    """
    if quiet and as_json:
        raise click.UsageError("--quiet and --json cannot be used together", ctx)
    settings = Settings(
        executions=executions or (24 if quick else 300),
        events=events,
        workers=workers or (2 if quick else 4),
        seed=seed if seed is not None else random.randrange(10**6),
        timeout=timeout,
        debug=bool(ctx.find_root().params.get("debug")),
    )
    console = Console(highlight=False)
    live_view = not (quiet or as_json) and console.is_terminal
    with ExitStack() as stack:
        workdir = directory or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        target = url or f"sqlite:///{workdir.resolve() / 'demo.db'}"
        view: DemoView | None = None

        def published(plan: Plan) -> None:
            nonlocal view
            if quiet or as_json:
                return
            floor = "; worker-0 takes priority >= 3 only" if plan.floors else ""
            click.echo(
                f"Published {plan.total} events of {settings.executions} executions "
                f"(priorities 0-4, seed {settings.seed}) to {redact_url(target)}\n"
                f"Working them off with {settings.workers} worker processes{floor}"
            )
            if live_view:
                view = DemoView(plan)
                stack.enter_context(Live(view, console=console, refresh_per_second=8))

        def progressed(message: tuple[str, ...]) -> None:
            if view is not None:
                view.apply(message)

        outcome = run_demo(settings, target, workdir, progressed, published)
        if view is not None:
            view.finish(outcome.verdict.events_per_second)
        stack.close()  # stop the live view before the verdict is printed
    verdict = outcome.verdict
    line = verdict_line(verdict, settings.workers)
    if as_json:
        emit_json(
            {
                "ok": verdict.ok,
                "verdict": line,
                "problems": list(verdict.problems),
                "url": redact_url(target),
                "executions": verdict.executions,
                "events": verdict.published,
                "workers": settings.workers,
                "seed": settings.seed,
                "acked": verdict.acked,
                "parked": verdict.parked,
                "retried": verdict.retried,
                "seconds": round(verdict.span_ns / 1e9, 3),
                "events_per_second": round(verdict.events_per_second, 1),
                "wall_seconds": round(outcome.wall_seconds, 3),
            }
        )
    elif quiet:
        click.echo(line)
    else:
        click.echo(line)
        for problem in verdict.problems[:20]:
            click.echo(f"  - {problem}")
        if len(verdict.problems) > 20:
            click.echo(f"  ... and {len(verdict.problems) - 20} more")
        click.echo(
            f"{verdict.acked} acks in {verdict.span_ns / 1e9:.2f} s from first claim to last "
            f"release ({verdict.events_per_second:,.0f} events/s); {verdict.parked} parks, "
            f"{verdict.retried} retries; "
            f"{outcome.wall_seconds:.2f} s in all"
        )
        if directory is not None:
            click.echo("Journals: " + ", ".join(str(path) for path in outcome.journals))
    if not verdict.ok:
        ctx.exit(1)
