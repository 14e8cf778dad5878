"""``transports conformance URL`` runs the shipped suite and reports one line per property.

Only fast properties are selected (``-- -k``): the whole suite over a URL runs on real
time and is exercised by the conformance self-test."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from transports_core import Event, QueueStats, TransportAdmin, open_transport
from transports_core.conformance import PROPERTIES

from ._command import COMMAND, transports


def in_directory(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command run with ``cwd`` as its current directory."""
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        check=False,
    )


def test_a_conforming_store_passes_each_selected_property(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'check.db'}"
    result = transports("conformance", url, "--", "-k", "fifo or test_priority_floor")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"conformance of {url}:"
    assert _verdicts(result.stdout) == {"fifo-per-group": "PASS", "priority-floor": "PASS"}


def test_a_store_that_breaks_a_property_fails_on_that_property() -> None:
    # Each handle on sqlite:///:memory: is a database of its own: the suite's two-handle
    # scenarios fail on shared-store, and the command exits 1 with the reason.
    result = transports("conformance", "sqlite:///:memory:", "--", "-k", "fifo or shared")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines()[1:-1]}
    assert lines["fifo-per-group"].startswith("PASS")
    assert lines["shared-store"].startswith("FAIL")
    assert "published on one handle, claimed on another" in lines["shared-store"]


def test_an_unknown_scheme_is_a_usage_error_in_one_line() -> None:
    result = transports("conformance", "nats://user:secret@localhost:4222")
    assert result.returncode == 2
    known = (
        "known schemes: postgres, postgresql, redis, redis+cluster, redis+sentinel, rediss, "
        "rediss+cluster, sqlite, unix"
    )
    assert known in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "secret" not in result.stderr + result.stdout


def _verdicts(stdout: str) -> dict[str, str]:
    return {
        line.split()[1]: line.split()[0]
        for line in stdout.splitlines()
        if line[:4] in ("PASS", "FAIL", "SKIP")
    }


def test_admin_properties_run_leave_no_dead_letters_and_nothing_in_the_cwd(
    tmp_path: Path,
) -> None:
    cwd, store = tmp_path / "cwd", tmp_path / "store"
    cwd.mkdir()
    store.mkdir()
    url = f"sqlite:///{store / 'check.db'}"
    chosen = "admin_dead or admin_requeue or bury_on_dead or parallel_fairness or dead_letter"
    result = in_directory(cwd, "conformance", url, "--", "-k", chosen)
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = _verdicts(result.stdout)
    assert verdicts == {
        "bury-obeys-on-dead": "PASS",
        "dead-letter-reason": "PASS",
        "admin-dead-letters-by-policy": "PASS",
        "admin-requeue-to-head-in-order": "PASS",
        "admin-requeue-refused": "PASS",
        "admin-purge-group": "PASS",
        "parallel-fairness-bound": "PASS",
        "peek-shows-the-next-messages-and-changes-nothing": "PASS",  # a held dead letter
    }, result.stdout
    assert list(cwd.iterdir()) == [], "the command wrote into the current directory"
    with open_transport(url) as transport:
        assert isinstance(transport, TransportAdmin)
        assert transport.stats() == QueueStats(0, 0, 0, 0, ()), "the store was left not empty"
        assert transport.dead_letters() == []


def test_says_how_long_it_took(tmp_path: Path) -> None:
    result = transports("conformance", f"sqlite:///{tmp_path / 'q.db'}", "--", "-k", "fifo")
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.splitlines()[-1]
    assert re.fullmatch(r"1 properties: 1 passed, 0 failed, 0 skipped in \d+\.\d s", last), last


def test_a_store_that_is_not_empty_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    with open_transport(url) as transport:
        seq = transport.publish("orders", Event(n=1))
    result = transports("conformance", url, "--", "-k", "fifo")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is not empty (1 ready)" in result.stderr
    with open_transport(url) as transport:
        lease = transport.claim("w1", 60)
        assert (lease.seq, lease.attempt) == (seq, 1) if lease else False, lease


@pytest.mark.slow
def test_the_quick_profile_runs_every_property_on_sqlite_within_a_minute(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    result = in_directory(tmp_path, "conformance", "--quick", f"sqlite:///{tmp_path / 'q.db'}")
    took = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = _verdicts(result.stdout)
    skipped = sorted(name for name, verdict in verdicts.items() if verdict == "SKIP")
    # Only what a URL cannot give: the suite's manual clock, and a connection of the
    # caller's own for within.
    assert skipped == [
        "timing-from-the-right-moment",
        "within-commit-takes-effect",
        "within-fencing",
        "within-keys-follow-the-transaction",
        "within-rollback-leaves-nothing",
    ], result.stdout
    assert set(verdicts) == set(PROPERTIES), set(PROPERTIES) ^ set(verdicts)
    assert took < 60, f"the quick profile took {took:.1f} s"
