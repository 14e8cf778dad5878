"""``transports worker --metrics-port``: a real worker process on a SQLite file, scraped
over HTTP after known work; and docs/metrics.md, held to what that worker serves."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from transports_core import Event, open_transport
from transports_worker._metrics import LOST_REASONS, METRICS, OUTCOMES

from ._served import PATIENCE, REPO, Scrape, ServingWorker

PAGE = REPO / "docs" / "metrics.md"
# Priority 0 waits: the worker claims from priority 1 up.
WAITING = {"deep": 3, "mid": 2, "shallow": 1}
SINCE: list[float] = []  # before the waiting messages were published, and after the scrape


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServingWorker, Scrape]]:
    """A worker that acked 5 messages and buried 2, beside 6 it does not claim, scraped
    once everything it will do is done."""
    cwd = tmp_path_factory.mktemp("served")
    url = f"sqlite:///{cwd / 'queue.db'}"
    SINCE.append(time.time())
    with open_transport(url) as store:
        for n in range(5):
            store.publish(f"g{n}", Event(kind="ack"), priority=1)
        for _ in range(2):
            store.publish("b", Event(kind="bury"), priority=1)
        for group, depth in WAITING.items():
            for _ in range(depth):
                store.publish(group, Event(kind="wait"), priority=0)
    worker = ServingWorker(
        cwd, url, "--min-priority", "1", "--visibility", "2", "--metrics-groups", "2"
    )
    try:
        scrape = worker.scrape_until(
            lambda s: (
                s.value("transports_worker_deliveries_total", outcome="acked") == 5
                and s.value("transports_worker_deliveries_total", outcome="buried") == 2
                and s.value("transports_queue_messages", state="dead") == 2
                and (s.value("transports_worker_empty_claims_total") or 0) >= 1
            )
        )
        SINCE.append(time.time())
        yield worker, scrape
        assert worker.stop() == 0, worker.text
    finally:
        worker.kill()


def test_deliveries_by_outcome_after_5_acked_and_2_buried(
    served: tuple[ServingWorker, Scrape],
) -> None:
    _, scrape = served
    counted = {o: scrape.value("transports_worker_deliveries_total", outcome=o) for o in OUTCOMES}
    assert counted == {
        "acked": 5,
        "buried": 2,
        "retried": 0,
        "failed": 0,
        "lost": 0,
        "handed_back": 0,
    }
    duration = "transports_worker_handler_duration_seconds"
    assert scrape.value(f"{duration}_count", outcome="acked") == 5
    assert scrape.value(f"{duration}_count", outcome="buried") == 2
    assert scrape.value(f"{duration}_bucket", outcome="acked", le="+Inf") == 5
    assert scrape.value("transports_worker_claimed_total") == 7
    assert scrape.value("transports_worker_in_flight") == 0
    lost = {r: scrape.value("transports_worker_lost_leases_total", reason=r) for r in LOST_REASONS}
    assert lost == dict.fromkeys(LOST_REASONS, 0)  # every reason served from the start
    assert scrape.value("transports_worker_renewal_failures_total") == 0


def test_the_backlog_totals_per_priority_and_the_deepest_groups(
    served: tuple[ServingWorker, Scrape],
) -> None:
    _, scrape = served
    assert scrape.value("transports_queue_up") == 1
    totals = {
        state: scrape.value("transports_queue_messages", state=state)
        for state in ("ready", "in_flight", "parked", "dead")
    }
    assert totals == {"ready": 6, "in_flight": 0, "parked": 0, "dead": 2}
    by_priority = "transports_queue_priority_messages"
    assert scrape.value(by_priority, priority="0", state="ready") == 6
    assert scrape.value(by_priority, priority="1", state="dead") == 2
    assert scrape.value(by_priority, priority="1", state="ready") == 0
    assert scrape.value("transports_queue_keys") == 0
    assert scrape.value("transports_queue_held_groups") == 0
    depths = {
        dict(labels)["group_id"]: value
        for (name, labels), value in scrape.samples.items()
        if name == "transports_queue_group_depth"
    }
    assert depths == {"deep": 3, "mid": 2}, "not the 2 deepest groups, and only those"


def test_the_backlog_age_and_groups(served: tuple[ServingWorker, Scrape]) -> None:
    _, scrape = served
    published, scraped = SINCE
    age = scrape.value("transports_queue_oldest_ready_age_seconds")
    assert age is not None
    assert 0 < age <= scraped - published, (age, scraped - published)
    by_priority = "transports_queue_priority_oldest_ready_age_seconds"
    assert scrape.value(by_priority, priority="0") == age
    assert scrape.value(by_priority, priority="1") is None, "priority 1 has nothing ready"
    groups = {s: scrape.value("transports_queue_groups", state=s) for s in ("ready", "busy")}
    assert groups == {"ready": 3, "busy": 0}
    assert scrape.value("transports_queue_priority_groups", priority="0", state="ready") == 3


def test_the_page_lists_every_metric_served_with_its_type_and_labels(
    served: tuple[ServingWorker, Scrape],
) -> None:
    _, scrape = served
    rows = re.findall(r"^\| `(transports_\w+)` \| (\w+) \| ([^|]*) \| `([\w.]+)` \|", _page(), re.M)
    documented = {name: kind for name, kind, _, _ in rows}
    assert len(documented) == len(rows), "a metric is listed twice"
    assert documented == scrape.types
    for name, _, labels, otel in rows:
        listed = set(re.findall(r"`(\w+)`", labels))
        family = name.removesuffix("_total")
        assert listed == scrape.labels.get(family, set()), name
        spec = next(s for s in METRICS if s.name == name)
        assert (set(spec.labels), spec.otel) == (listed, otel), name


def test_no_created_series_are_served(served: tuple[ServingWorker, Scrape]) -> None:
    _, scrape = served
    assert not [name for name in scrape.types if name.endswith("_created")]


def _page() -> str:
    return PAGE.read_text()


def test_without_prometheus_client_the_option_fails_naming_the_extra(tmp_path: Path) -> None:
    # A prometheus_client that cannot be imported, first on the path.
    fake = tmp_path / "blocked" / "prometheus_client"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no prometheus_client here')\n")
    (tmp_path / "jobs.py").write_text("def handle(event, ctx):\n    pass\n")
    path = os.pathsep.join([str(fake.parent), str(REPO), os.environ.get("PYTHONPATH", "")])
    database = tmp_path / "queue.db"
    command = [sys.executable, "-m", "transports_cli", "worker", "jobs:handle"]
    result = subprocess.run(
        [*command, f"sqlite:///{database}", "--metrics-port", "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "--metrics-port" in line
    assert "pip install 'durable-transports[metrics]'" in line
    assert not database.exists(), "the queue was opened before the option was refused"


def test_a_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text("def handle(event, ctx):\n    pass\n")
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "transports_cli", "worker", "jobs:handle"]
        options = ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
        result = subprocess.run(
            [*command, f"sqlite:///{tmp_path / 'queue.db'}", *options],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=PATIENCE,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert f"cannot serve metrics on 127.0.0.1:{port}" in line
