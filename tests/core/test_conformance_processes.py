"""The process-contention scenario catches what only shows across processes: run in a
subprocess on a store in a file (`FileTransport`, found by entry point from a real
distribution, as spawned workers find it), it passes a claim that is atomic, fails one
atomic only among one process's threads, and fails one not atomic at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

SUITE_FILE = """
import pytest

from transports_core import open_transport
from transports_core.conformance import DURABLE, MULTI_HANDLE, MULTIPROCESS, TransportSuite


class TestFile(TransportSuite):
    capabilities = frozenset({{DURABLE, MULTI_HANDLE, MULTIPROCESS}})

    @pytest.fixture
    def transport_url(self, tmp_path):
        return f"brokenfile://{{tmp_path}}/queue.json?defect={defect}"

    @pytest.fixture
    def make_transport(self, transport_url):
        return lambda **options: open_transport(transport_url, **options)
"""


def run(
    pytester: pytest.Pytester, tmp_path: Path, defect: str, monkeypatch: pytest.MonkeyPatch
) -> pytest.RunResult:
    dist = tmp_path / "dist"
    info = dist / "dt_broken_file-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dt-broken-file\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[durable_transports.backends]\nbrokenfile = tests.core.broken_backends:file_backend\n"
    )
    pytester.makepyfile(test_suite=SUITE_FILE.format(defect=defect))
    paths = [str(dist), str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-k", "contention_processes or contention_threads", "-rf"
    )


@pytest.mark.slow
def test_atomic_file_store_passes_both_contention_scenarios(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, tmp_path, "", monkeypatch)
    result.assert_outcomes(passed=2)


@pytest.mark.slow
def test_claim_atomic_only_within_a_process_fails_process_contention(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, tmp_path, "process-lock", monkeypatch)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*Error: contention-processes: *"])
    result.stdout.fnmatch_lines(["FAILED test_suite.py::TestFile::test_contention_processes*"])


@pytest.mark.slow
def test_claim_not_atomic_at_all_fails_both_contention_scenarios(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, tmp_path, "unlocked", monkeypatch)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*Error: contention-threads: *"])
    result.stdout.fnmatch_lines(["*Error: contention-processes: *"])
