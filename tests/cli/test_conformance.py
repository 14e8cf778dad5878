"""``transports conformance URL`` runs the shipped suite and reports one line per property.

Only fast properties are selected (``-- -k``): the whole suite over a URL runs on real
time and is exercised by the conformance self-test."""

from __future__ import annotations

from pathlib import Path

from ._command import transports


def test_a_conforming_store_passes_each_selected_property(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'check.db'}"
    result = transports("conformance", url, "--", "-k", "fifo or priority_floor")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"conformance of {url}:"
    verdicts = {line.split()[1]: line.split()[0] for line in lines[1:]}
    assert verdicts == {"fifo-per-group": "PASS", "priority-floor": "PASS"}


def test_a_store_that_breaks_a_property_fails_on_that_property() -> None:
    # Each handle on sqlite:///:memory: is a database of its own: the suite's two-handle
    # scenarios fail on shared-store, and the command exits 1 with the reason.
    result = transports("conformance", "sqlite:///:memory:", "--", "-k", "fifo or shared")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines()[1:]}
    assert lines["fifo-per-group"].startswith("PASS")
    assert lines["shared-store"].startswith("FAIL")
    assert "published on one handle, claimed on another" in lines["shared-store"]


def test_an_unknown_scheme_is_a_usage_error_in_one_line() -> None:
    result = transports("conformance", "nats://user:secret@localhost:4222")
    assert result.returncode == 2
    assert "known schemes: postgres, postgresql, redis, rediss, sqlite, unix" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "secret" not in result.stderr + result.stdout
