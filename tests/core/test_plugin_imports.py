"""Installing the library must never break a user's own pytest: the pytest11 plugin loads
in every run, so loading it imports pytest and nothing of the suite, and the suite itself
needs hypothesis for one scenario only. Each check runs a fresh interpreter in which
hypothesis cannot be imported (a meta-path blocker installed by ``sitecustomize``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKER = """
import sys

class _NoHypothesis:
    def find_spec(self, name, path=None, target=None):
        if name == "hypothesis" or name.startswith("hypothesis."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoHypothesis())
"""

# A run of pytest on the given file that reports, as JSON on its last line, its exit code
# and which modules of the suite were imported by the end of the run.
RUN_PYTEST = """
import json, sys
import pytest
# hypothesis's own pytest plugin is installed here, as it would not be on such a machine.
code = pytest.main(["-p", "no:hypothesispytest", *sys.argv[1:]])
suite = sorted(m for m in sys.modules if m.startswith("transports_core.conformance"))
print(json.dumps({"code": int(code), "suite": suite, "hypothesis": "hypothesis" in sys.modules}))
"""


def run_without_hypothesis(
    tmp_path: Path, code: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(blocker), str(root)]),
        "PYTEST_ADDOPTS": "",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    return done, json.loads(last) if last.startswith("{") else {}


def test_blocker_really_hides_hypothesis(tmp_path: Path) -> None:
    done, _ = run_without_hypothesis(tmp_path, "import hypothesis")
    assert done.returncode != 0
    assert "No module named 'hypothesis'" in done.stderr


def test_users_pytest_passes_without_hypothesis_and_imports_no_suite_module(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_mine.py").write_text("def test_mine():\n    assert 1 + 1 == 2\n")
    done, seen = run_without_hypothesis(
        tmp_path,
        RUN_PYTEST,
        "-p",
        "transports_core.conformance.plugin",
        "-p",
        "no:cacheprovider",
        "test_mine.py",
    )
    assert seen.get("code") == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    # The package and its plugin module, and nothing else of the suite.
    assert seen["suite"] == [
        "transports_core.conformance",
        "transports_core.conformance.plugin",
    ], seen
    assert seen["hypothesis"] is False


def test_contention_worker_module_imports_neither_pytest_nor_hypothesis_nor_suite(
    tmp_path: Path,
) -> None:
    probe = (
        "import json, sys\n"
        "import transports_core.conformance._workers\n"
        "import transports_core.conformance.journal\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pytest', '_pytest', 'hypothesis') or m.startswith('transports_core.conformance'))))\n"
    )
    done, _ = run_without_hypothesis(tmp_path, probe)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "transports_core.conformance",
        "transports_core.conformance._workers",
        "transports_core.conformance.journal",
    ]


SUITE_WITHOUT_HYPOTHESIS = """
import pytest

from tests.core.broken_backends import Defects, MemoryStore
from transports_core.conformance import CLOCK, DURABLE, MULTI_HANDLE, TransportSuite


class TestMemory(TransportSuite):
    capabilities = frozenset({CLOCK, DURABLE, MULTI_HANDLE})

    @pytest.fixture
    def make_transport(self, clock):
        return MemoryStore(clock, Defects()).opener()
"""


@pytest.mark.slow
def test_suite_runs_without_hypothesis_and_only_the_model_scenario_skips(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE_WITHOUT_HYPOTHESIS)
    done, seen = run_without_hypothesis(
        tmp_path,
        RUN_PYTEST,
        "-p",
        "no:cacheprovider",
        "-rs",
        "-k",
        "model_agreement or fifo_per_group or fencing_settled",
        "test_suite.py",
    )
    assert seen.get("code") == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout, done.stdout
    assert "pip install 'durable-transports[conformance]'" in done.stdout, done.stdout
    assert seen["hypothesis"] is False
