"""The process scenarios catch what only shows across processes: run in a subprocess on a
store in a file (`FileTransport`, found by entry point from a real distribution, as
spawned workers find it), they pass a claim and a keyed publish that are atomic, fail ones
atomic only among one process's threads, and fail ones not atomic at all."""

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
        "-p",
        "no:cacheprovider",
        "-k",
        "contention_processes or contention_threads or key_processes",
        "-rf",
    )


# defect -> which of the two scenarios must fail (the others must pass)
OUTCOMES = {
    "": [],  # a claim and a keyed publish atomic across processes: all pass
    # atomic only among one process's threads
    "process-lock": ["contention-processes", "key-processes-store-once"],
    # not atomic at all
    "unlocked": ["contention-threads", "contention-processes", "key-processes-store-once"],
}


@pytest.mark.slow
@pytest.mark.parametrize("defect", list(OUTCOMES), ids=lambda d: d or "atomic")
def test_contention_scenarios_fail_exactly_where_the_claim_is_not_atomic(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defect: str
) -> None:
    result = run(pytester, tmp_path, defect, monkeypatch)
    failing = OUTCOMES[defect]
    result.assert_outcomes(passed=3 - len(failing), failed=len(failing))
    for prop in failing:
        test = prop.replace("-", "_")
        result.stdout.fnmatch_lines([f"*Error: {prop}: *"])
        result.stdout.fnmatch_lines([f"FAILED test_suite.py::TestFile::test_{test}*"])
