"""The conformance suite is itself tested: run through pytester against an in-memory
backend with one defect at a time, it must fail on the property that defect breaks, and
say so; without defects, it must pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from transports_core.conformance import PROPERTIES

pytest_plugins = ["pytester"]

SUITE_FILE = """
import pytest

from tests.core.broken_backends import Defects, MemoryStore
from transports_core.conformance import CLOCK, DURABLE, MULTI_HANDLE, TransportSuite


class TestMemory(TransportSuite):
    capabilities = frozenset({{CLOCK, DURABLE, MULTI_HANDLE}})
    model_shrink = False  # a shrunk example would only cost time here

    @pytest.fixture
    def make_transport(self, clock):
        return MemoryStore(clock, Defects({defects})).open
"""

# defect -> (property it breaks, test names of which at least one must fail)
BREAKS = {
    "lifo=True": ("fifo-per-group", "test_fifo_per_group"),
    "no_exclusivity=True": ("one-in-flight-per-group", "test_one_in_flight_per_group"),
    "eternal_leases=True": ("lease-recovery", "test_lease_recovery"),
    "ignore_park=True": ("park", "test_park_"),
    "fixed_order=True": ("round-robin", "test_round_robin"),
    "ignore_floor=True": ("priority-floor", "test_priority_floor"),
    "no_fencing=True": ("fencing", "test_fencing"),
    "drop_every=7": ("no-loss", "test_no_loss"),
}


def run_suite(pytester: pytest.Pytester, defects: str) -> pytest.HookRecorder:
    pytester.makepyfile(test_suite=SUITE_FILE.format(defects=defects))
    return pytester.inline_run("-p", "no:cacheprovider", "-W", "error", "--strict-markers")


def test_memory_backend_without_defects_passes_and_skips_only_for_capabilities(
    pytester: pytest.Pytester,
) -> None:
    passed, skipped, failed = run_suite(pytester, "").listoutcomes()
    assert not failed, [report.nodeid for report in failed]
    assert len(passed) > 60
    reasons = {str(report.longrepr) for report in skipped}
    assert len(skipped) == 1
    assert all("does not declare the 'multiprocess' capability" in r for r in reasons), reasons


@pytest.mark.parametrize(("defect", "breaks"), BREAKS.items(), ids=list(BREAKS))
def test_broken_backend_fails_on_the_property_it_breaks(
    pytester: pytest.Pytester, defect: str, breaks: tuple[str, str]
) -> None:
    prop, test_name = breaks
    assert prop in PROPERTIES
    _, _, failed = run_suite(pytester, defect).listoutcomes()
    hits = [report for report in failed if f"::{test_name}" in report.nodeid]
    assert hits, f"with {defect}, no {test_name}* failed; failures: {[r.nodeid for r in failed]}"
    for report in hits:
        assert prop in report.longreprtext, (
            f"the failure of {report.nodeid} does not name {prop!r}:\n{report.longreprtext}"
        )
    # The model-based test catches every one of these defects too.
    assert any("test_model_agreement" in report.nodeid for report in failed), (
        f"with {defect}, the model-based test passed"
    )


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transports_core.conformance", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_passes_a_sqlite_file_and_prints_one_line_per_property(tmp_path: Path) -> None:
    chosen = "fifo_per_group or priority_floor or lease_recovery or contention_processes"
    done = run_cli(tmp_path, "sqlite:///queue.db", "--", "-k", chosen)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [
        ["PASS", "fifo-per-group"],
        ["PASS", "lease-recovery"],
        ["PASS", "priority-floor"],
        ["PASS", "contention-processes"],
    ], done.stdout
    # The store is left, and nothing else: no pytest cache, no hypothesis database.
    assert [p.name for p in tmp_path.iterdir()] == ["queue.db"]


def test_cli_fails_with_the_reason_when_a_url_names_no_shared_store(tmp_path: Path) -> None:
    # Every open of sqlite:///:memory: is a new, empty database, so a message published
    # on one handle is not there for the next: the CLI must say so and exit 1.
    done = run_cli(tmp_path, "sqlite:///:memory:", "--", "-k", "shared_store or fifo")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines()[1:]}
    assert lines["fifo-per-group"].startswith("PASS"), done.stdout
    assert lines["shared-store"].startswith("FAIL"), done.stdout
    assert "shared-store: a message published on one handle" in lines["shared-store"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("nosuch:///x",), "no backend for scheme 'nosuch'; known schemes: postgres, postgresql, redis, rediss, sqlite, unix"),
        (("queue.db",), "is not a transport URL"),
        ((), "the following arguments are required: url"),
    ],
    ids=["unknown-scheme", "not-a-url", "no-url"],
)
def test_cli_usage_errors_exit_2(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    done = run_cli(tmp_path, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
