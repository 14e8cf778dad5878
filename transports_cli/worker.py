"""``transports worker MODULE:FUNCTION URL``: run a handler on the worker runtime.

The handler is imported (the current directory first on the path, as other Python
worker commands do) and checked before anything is opened or claimed: a module that
does not import, a missing function or class, or a handler with the wrong signature is
a one-line usage error, exit 2. Exit codes are the runtime's: 0 when everything drained,
75 when leases were handed back at shutdown (see docs/worker.md). With
``--metrics-port``, the worker serves its metrics and the queue's backlog in the
Prometheus text format (see docs/metrics.md); that needs the ``metrics`` extra, and
without it the option is refused before anything is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from transports_core import Event, open_transport, redact_url

from ._output import FC, URL_VARIABLE, count_option, scrub, url_argument
from .admin import refuse_private

if TYPE_CHECKING:
    from transports_worker import AsyncWorker, Hooks, PrometheusHooks, Worker

__all__ = ["seconds_option", "worker"]

HEALTH_EVERY = 5.0
# How long a read of the queue's backlog serves scrapes before the next read.
BACKLOG_CACHE = 5.0


def _load(target: str, what: str, hint: str) -> object:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(f"expected {what}, got {target!r}", param_hint=hint)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except Exception as exc:  # any failure while importing user code is the user's to fix
        raise click.BadParameter(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}", param_hint=hint
        ) from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise click.BadParameter(
                f"module {module_name!r} has no {attribute!r}", param_hint=hint
            ) from None
    return found


class _Health:
    """Touches ``path`` every few seconds while the worker runs; removes it at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="health-file", daemon=True)

    def _beat(self) -> None:
        while True:
            self.path.touch()
            if self._done.wait(HEALTH_EVERY):
                return

    def __enter__(self) -> _Health:
        self.path.touch()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)


def seconds_option(
    name: str, help: str, default: float | None, *, low: float = 0, zero: bool = False
) -> Callable[[FC], FC]:
    """An option taking seconds, at least ``low`` (0 itself only if ``zero``); a default,
    if there is one, is shown in the help."""
    return click.option(
        name,
        type=click.FloatRange(min=low, min_open=not zero and low == 0),
        default=default,
        show_default=default is not None,
        help=help,
    )


@click.command(short_help="Run a handler on every message of a queue.")
@click.argument("handler_target", metavar="MODULE:FUNCTION")
@url_argument()
@count_option(
    "--concurrency",
    1,
    None,
    "Handlers running at once (threads, or tasks for an async handler).",
    default=1,
)
@seconds_option("--visibility", "Lease length in seconds; renewed at a third of it.", 30.0)
@seconds_option(
    "--timeout", "Cancel a handler after this many seconds; it counts as a failure.", None
)
@seconds_option("--grace", "Seconds running handlers get to finish after SIGTERM.", 25.0, zero=True)
@click.option(
    "--event-type",
    metavar="MODULE:CLASS",
    default=None,
    help="The pydantic model events decode as (default: any fields).",
)
@count_option("--min-priority", 0, 4, "Only claim groups of at least this priority.", default=0)
@count_option(
    "--max-attempts", 1, None, "Deliveries of a failing message before it is buried.", default=10
)
@click.option("--worker-id", default=None, help="The id leases are taken under.")
@click.option(
    "--health-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Touch this file every {HEALTH_EVERY:g}s while running (a liveness probe).",
)
@click.option("--quiet", is_flag=True, help="Do not log each settled delivery.")
@click.option(
    "--batch/--no-batch",
    default=True,
    show_default=True,
    help="With --concurrency above 1, claim for the free slots and settle in batches.",
)
@count_option(
    "--processes",
    1,
    64,
    "Worker processes, under one supervisor that starts another when one dies.",
    default=1,
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (0: any free one, logged); with --processes "
    "N, process n serves on the port plus n. Needs the metrics extra.",
)
@click.option(
    "--metrics-host",
    default="0.0.0.0",
    show_default=True,
    help="The address the metrics are served on.",
)
@count_option(
    "--metrics-groups", 0, 1000, "How many of the deepest groups the metrics list.", default=10
)
def worker(
    handler_target: str,
    url: str,
    concurrency: int,
    visibility: float,
    timeout: float | None,
    grace: float,
    event_type: str | None,
    min_priority: int,
    max_attempts: int,
    worker_id: str | None,
    health_file: Path | None,
    quiet: bool,
    batch: bool,
    processes: int,
    metrics_port: int | None,
    metrics_host: str,
    metrics_groups: int,
) -> int:
    """Run MODULE:FUNCTION as the handler of every message of the queue at URL.

    The handler is called as handler(event, ctx); an async def runs on AsyncWorker.
    Returning acks; raising Retry(delay) retries; raising Bury(reason) dead-letters;
    other exceptions retry with backoff until the last attempt. The first SIGTERM or
    SIGINT drains within --grace, a second hands leases back, a third exits at once.

    \b
    Exit codes:
      0   stopped with every running handler finished
      75  stopped with leases handed back for another worker
      2   the handler, event type or an option is wrong (nothing was claimed)

    With --processes N, a supervisor runs N worker processes (each with
    --concurrency handlers), starts another when one dies, and passes SIGTERM and
    SIGINT on to all of them; its exit code is 0 when every one drained, 75 when
    some handed leases back, 1 otherwise.

    \b
    Example:
      transports worker jobs:handle sqlite:///jobs.db --concurrency 8
      TRANSPORTS_URL=sqlite:///jobs.db transports worker jobs:handle --processes 4
      transports worker jobs:handle sqlite:///jobs.db --metrics-port 9464
    """
    # Imported here, so that the other commands never depend on the runtime's import.
    from transports_worker import LoggingHooks, RetryPolicy

    if metrics_port is not None:
        _need_metrics()
        if metrics_port and metrics_port + processes - 1 > 65535:
            raise click.BadParameter(
                f"{metrics_port} leaves no port for each of {processes} processes",
                param_hint="'--metrics-port'",
            )

    # Any: the user's code, checked here (callable, signature, async or not) before
    # anything is opened.
    handler: Any = _load(handler_target, "MODULE:FUNCTION", "MODULE:FUNCTION")
    runtime = _runtime(handler)
    model: type[Any] | None = None
    if event_type is not None:
        found = _load(event_type, "MODULE:CLASS", "'--event-type'")
        if not isinstance(found, type):
            raise click.BadParameter(f"{event_type} is not a class", param_hint="'--event-type'")
        model = found
    refuse_private(url, "a worker would wait forever on a queue nothing else can publish to")
    # Open the queue once before anything says it started: a wrong URL, a missing
    # driver or a server that is down ends here, with one line.
    with open_transport(url, event_type=Event if model is None else model):
        pass
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if processes > 1:
        return _supervised(url, processes, handler_target, locals())
    runner: AsyncWorker[Any] | Worker[Any]
    hooks: list[Hooks] = [LoggingHooks()]
    with contextlib.ExitStack() as stack:
        if metrics_port is not None:
            hooks.append(_metrics(stack, url, metrics_port, metrics_host, metrics_groups))
        try:
            runner = runtime(
                url,
                handler,
                event_type=model,
                worker_id=worker_id,
                retry=RetryPolicy(max_attempts=max_attempts),
                concurrency=concurrency,
                visibility=visibility,
                timeout=timeout,
                grace=grace,
                min_priority=min_priority,
                hooks=hooks,
                batch=batch,
            )
        except (TypeError, ValueError) as exc:
            raise click.UsageError(scrub(str(exc))) from exc
        logging.getLogger("transports_worker").info("%r started", runner)
        if health_file is not None:
            stack.enter_context(_Health(health_file))
        return _run(runner)


def _runtime(handler: object) -> type[Worker[Any]] | type[AsyncWorker[Any]]:
    """The worker that runs ``handler``: `Worker`, unless it refuses an async handler
    that `AsyncWorker` takes; else a usage error naming what is wrong."""
    from transports_worker import AsyncWorker, Worker

    try:
        Worker.check_handler(handler)
    except TypeError as refused:
        try:
            AsyncWorker.check_handler(handler)
        except TypeError:
            raise click.UsageError(scrub(str(refused))) from refused
        return AsyncWorker
    return Worker


def _need_metrics() -> None:
    """Refuse --metrics-port, naming the extra, where prometheus_client is missing."""
    try:
        from transports_worker import PrometheusHooks  # noqa: F401
    except ImportError as exc:
        raise click.BadParameter(str(exc), param_hint="'--metrics-port'") from exc


def _metrics(
    stack: contextlib.ExitStack, url: str, port: int, host: str, groups: int
) -> PrometheusHooks:
    """The exporter of the runtime's metrics and the queue's backlog, serving until
    ``stack`` closes."""
    from prometheus_client import disable_created_metrics

    from transports_worker import PrometheusHooks, QueueBacklog

    # The ``_created`` series (when each counter began) say nothing a scraper can use.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream
    backlog = QueueBacklog(url, groups=groups, cache=BACKLOG_CACHE)
    stack.callback(backlog.close)
    exporter = PrometheusHooks(backlog=backlog)
    try:
        bound = exporter.serve(port, host)
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    stack.callback(exporter.close)
    logging.getLogger("transports_worker").info(
        "serving metrics on http://%s:%d/metrics", host, bound
    )
    return exporter


def _supervised(url: str, processes: int, target: str, given: dict[str, Any]) -> int:
    from ._supervisor import supervise

    options: list[str] = []
    for name in ("concurrency", "visibility", "timeout", "grace", "event_type"):
        if given[name] is not None:
            options += [f"--{name.replace('_', '-')}", str(given[name])]
    for name in ("min_priority", "max_attempts"):
        options += [f"--{name.replace('_', '-')}", str(given[name])]
    if given["quiet"]:
        options.append("--quiet")
    if not given["batch"]:
        options.append("--no-batch")
    command = [sys.executable, "-m", "transports_cli", "worker", target, *options]
    environ = {**os.environ, URL_VARIABLE: url}
    worker_id = given["worker_id"]
    port = given["metrics_port"]

    def own(n: int) -> list[str]:
        # Each child gets an id of its own: the given one with its number, else its
        # default; and a metrics port of its own, the given one plus its number.
        extra = [] if worker_id is None else ["--worker-id", f"{worker_id}-{n}"]
        if port is not None:
            extra += ["--metrics-port", str(port + n if port else 0)]
            extra += ["--metrics-host", given["metrics_host"]]
            extra += ["--metrics-groups", str(given["metrics_groups"])]
        return [*command, *extra]

    commands = [own(n) for n in range(processes)]

    def run_all() -> int:
        return supervise(commands, environ)

    logging.getLogger("transports_cli.supervisor").info(
        "supervising %d worker processes of %s on %s", processes, target, redact_url(url)
    )
    health: Path | None = given["health_file"]
    if health is None:
        return run_all()
    with _Health(health):
        return run_all()


def _run(runner: AsyncWorker[Any] | Worker[Any]) -> int:
    from transports_worker import AsyncWorker

    if isinstance(runner, AsyncWorker):
        return asyncio.run(runner.run())
    return runner.run()
