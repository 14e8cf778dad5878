"""``transports worker`` as a real process: SIGTERM drains, SIGKILL loses nothing, and a
handler that cannot be loaded is refused before anything is claimed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from transports_core import Event, Transport, open_transport

REPO = Path(__file__).resolve().parents[2]
PATIENCE = 60.0

HANDLERS = """
import functools, os, pathlib, signal, time

MARKS = pathlib.Path(os.environ["MARKS"])

def slow(event, ctx):
    (MARKS / f"start-{event.n}-{ctx.attempt}").touch()
    ctx.sleep(float(os.environ.get("HOLD", "2")))
    (MARKS / f"done-{event.n}-{ctx.attempt}").touch()

async def aslow(event, ctx):
    (MARKS / f"start-{event.n}-{ctx.attempt}").touch()
    await ctx.sleep(float(os.environ.get("HOLD", "2")))
    (MARKS / f"done-{event.n}-{ctx.attempt}").touch()

def stuck(event, ctx):  # deaf to cancellation
    (MARKS / f"start-{event.n}-{ctx.attempt}").touch()
    time.sleep(float(os.environ.get("HOLD", "2")))

def masks(event, ctx):  # notes whether this handler's thread takes SIGTERM
    blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    (MARKS / ("blocked" if blocked else "taken")).touch()

def one_argument(event):
    pass

def traced(fn):  # a plain decorator, as tracing middleware is
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper

@traced
async def traced_aslow(event, ctx):
    await aslow(event, ctx)

class AsyncCallable:
    async def __call__(self, event, ctx):
        await aslow(event, ctx)

async_callable = AsyncCallable()

not_callable = 3
"""


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    (tmp_path / "jobs.py").write_text(textwrap.dedent(HANDLERS))
    return path


@pytest.fixture
def url(queue_url: str) -> str:
    return queue_url


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[tuple[str, Transport[Event]]]:
    """The refusals happen before any backend is touched: one backend shows it."""
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    with open_transport(url) as handle:
        yield url, handle


@pytest.fixture
def store(url: str) -> Iterator[Transport[Event]]:
    with open_transport(url) as handle:
        yield handle


def start(cwd: Path, marks: Path, *args: str, hold: float = 2.0) -> subprocess.Popen[str]:
    # The repository on the path too: the runtime need not be installed for this to run.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "MARKS": str(marks), "HOLD": str(hold), "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, "-m", "transports_cli", "worker", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    """Wait until the handler in ``process`` leaves the mark ``path``."""
    deadline = time.monotonic() + PATIENCE
    while not path.exists():
        if process.poll() is not None:
            pytest.fail(f"the worker exited {process.returncode}: {process.communicate()}")
        assert time.monotonic() < deadline, f"no {path.name} after {PATIENCE}s"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("handler", ["jobs:slow", "jobs:aslow"])
def test_sigterm_during_a_long_handler_drains_and_exits_0(
    tmp_path: Path, marks: Path, url: str, store: Transport[Event], handler: str
) -> None:
    store.publish("g", Event(n=1))
    process = start(tmp_path, marks, handler, url, "--visibility", "1", "--grace", "30")
    wait_for(marks / "start-1-1", process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0, err
    assert (marks / "done-1-1").exists(), "the running handler did not finish"
    assert "acked group=g seq=1 attempt=1" in err
    assert store.claim("check", 1.0) is None, "the drained message was not acked"


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["--batch", "--no-batch"])
def test_batches_are_on_unless_no_batch_is_given(
    tmp_path: Path, marks: Path, url: str, store: Transport[Event], batch: str
) -> None:
    store.publish_many([(f"g{n}", Event(n=n), 0) for n in range(4)])
    process = start(tmp_path, marks, "jobs:slow", url, "--concurrency", "2", batch, hold=0.1)
    for n in range(4):
        wait_for(marks / f"done-{n}-1", process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0, err
    (started,) = [line for line in err.splitlines() if line.endswith(" started")]
    assert ("no batches" in started) == (batch == "--no-batch"), started


@pytest.mark.slow
def test_the_health_file_lives_while_the_worker_runs_and_quiet_logs_no_deliveries(
    tmp_path: Path, marks: Path, url: str, store: Transport[Event]
) -> None:
    store.publish("g", Event(n=1))
    health = tmp_path / "healthy"
    args = ("jobs:slow", url, "--visibility", "1", "--health-file", str(health), "--quiet")
    process = start(tmp_path, marks, *args, hold=0.1)
    wait_for(marks / "done-1-1", process)
    assert health.exists(), "no health file while the worker runs"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0, err
    assert not health.exists(), "the health file outlived the worker"
    assert "acked" not in err


@pytest.mark.slow
def test_a_second_sigterm_hands_the_lease_back_and_exits_75(
    tmp_path: Path, marks: Path, url: str, store: Transport[Event]
) -> None:
    store.publish("g", Event(n=1))
    # A grace far longer than the test waits: only the second signal can end the drain.
    args = ("jobs:slow", url, "--visibility", "1", "--grace", str(10 * PATIENCE))
    process = start(tmp_path, marks, *args, hold=PATIENCE)
    wait_for(marks / "start-1-1", process)
    process.send_signal(signal.SIGTERM)
    # Two signals sent back to back may reach the process as one: the second goes once
    # the first is taken.
    read_until(process, "SIGTERM: draining")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 75, err
    assert "SIGTERM: cancelling running handlers" in err
    again = store.claim("other", 1.0, wait=1.0)
    assert again is not None, "the handed-back message was not claimable at once"
    assert again.attempt == 2


def test_a_third_sigterm_exits_130_at_once_when_a_handler_does_not_stop(
    tmp_path: Path, marks: Path, sqlite_store: tuple[str, Transport[Event]]
) -> None:
    url, store = sqlite_store
    store.publish("g", Event(n=1))
    process = start(tmp_path, marks, "jobs:stuck", url, "--visibility", "1", hold=PATIENCE)
    wait_for(marks / "start-1-1", process)
    process.send_signal(signal.SIGTERM)
    read_until(process, "SIGTERM: draining")
    process.send_signal(signal.SIGTERM)
    read_until(process, "handed_back group=g seq=1")
    # The lease is handed back, but the handler's thread still runs: the process stays.
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=1)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=PATIENCE)
    assert process.returncode == 130
    again = store.claim("other", 1.0)
    assert again is not None
    assert again.attempt == 2


def test_the_worker_s_threads_leave_sigterm_to_the_one_that_handles_it(
    tmp_path: Path, marks: Path, sqlite_store: tuple[str, Transport[Event]]
) -> None:
    """A signal sent to the process goes to any thread that does not block it, and one
    taken by a slot's thread would wait for the main thread to run Python again before
    its handler ran (up to the grace, or the end of a join): the worker's threads block
    SIGTERM and SIGINT."""
    url, store = sqlite_store
    store.publish("g", Event(n=1))
    process = start(tmp_path, marks, "jobs:masks", url, "--no-batch")
    deadline = time.monotonic() + PATIENCE
    while not any(marks.iterdir()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the handler did not run"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0, err
    assert [mark.name for mark in marks.iterdir()] == ["blocked"]


def read_until(process: subprocess.Popen[str], text: str) -> None:
    """Read the worker's log until a line holding ``text``."""
    assert process.stderr is not None
    for line in process.stderr:
        if text in line:
            return
    pytest.fail(f"the worker exited {process.wait()} without logging {text!r}")


@pytest.mark.slow
def test_sigkill_loses_nothing_the_lease_lapses_and_another_worker_finishes(
    tmp_path: Path, marks: Path, url: str, store: Transport[Event]
) -> None:
    store.publish("g", Event(n=1))
    store.publish("g", Event(n=2))
    first = start(tmp_path, marks, "jobs:slow", url, "--visibility", "1", hold=PATIENCE)
    wait_for(marks / "start-1-1", first)
    first.kill()
    first.communicate(timeout=PATIENCE)
    second = start(tmp_path, marks, "jobs:slow", url, "--visibility", "1", hold=0.1)
    wait_for(marks / "done-2-1", second)
    second.send_signal(signal.SIGTERM)
    _, err = second.communicate(timeout=PATIENCE)
    assert second.returncode == 0, err
    assert (marks / "done-1-2").exists(), "the killed worker's message was not redone"
    assert not (marks / "done-1-1").exists()
    assert store.claim("check", 1.0) is None, "a message was left behind"


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("no_such_module:handle", "cannot import 'no_such_module'"),
        ("jobs:missing", "module 'jobs' has no 'missing'"),
        ("jobs", "expected MODULE:FUNCTION"),
        ("jobs:one_argument", "must take two arguments"),
        ("jobs:not_callable", "must be callable"),
    ],
)
def test_a_handler_that_cannot_load_exits_2_before_claiming(
    tmp_path: Path,
    marks: Path,
    sqlite_store: tuple[str, Transport[Event]],
    target: str,
    said: str,
) -> None:
    url, store = sqlite_store
    store.publish("g", Event(n=1))
    process = start(tmp_path, marks, target, url)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 2, err
    [line] = err.splitlines()
    assert line.startswith("Error: ")
    assert said in line
    lease = store.claim("check", 1.0)
    assert lease is not None
    assert lease.attempt == 1, "the refused worker claimed the message"


@pytest.mark.parametrize(
    ("target", "said"),
    [("jobs:one_argument", "must take two arguments"), ("jobs:not_callable", "must be callable")],
)
@pytest.mark.parametrize("where", ["a new SQLite file", "a server that is down"])
def test_a_refused_handler_exits_2_before_anything_is_opened(
    tmp_path: Path, marks: Path, target: str, said: str, where: str
) -> None:
    database = tmp_path / "new.db"
    if where == "a new SQLite file":
        url = f"sqlite:///{database}"
    else:
        url = "postgresql://postgres@127.0.0.1:1/jobs"  # nothing listens on port 1
    process = start(tmp_path, marks, target, url)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 2, err
    [line] = err.splitlines()
    assert said in line
    assert not database.exists(), "the queue was opened"


@pytest.mark.parametrize("handler", ["jobs:traced_aslow", "jobs:async_callable"])
def test_an_async_handler_behind_a_decorator_or_as_an_object_runs_on_async_worker(
    tmp_path: Path, marks: Path, sqlite_store: tuple[str, Transport[Event]], handler: str
) -> None:
    url, store = sqlite_store
    store.publish("g", Event(n=1))
    process = start(tmp_path, marks, handler, url, hold=0.0)
    try:
        wait_for(marks / "done-1-1", process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=PATIENCE)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert "AsyncWorker" in err  # its "started" line


def test_a_bad_event_type_exits_2(
    tmp_path: Path, marks: Path, sqlite_store: tuple[str, Transport[Event]]
) -> None:
    url, _ = sqlite_store
    process = start(tmp_path, marks, "jobs:slow", url, "--event-type", "jobs:not_callable")
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 2
    [line] = err.splitlines()
    assert "--event-type" in line
