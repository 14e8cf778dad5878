"""The service tests find their server in the documented order (`tests._services`), and a
missing one skips them, or fails them under CI=true. Checked against the real local servers
and a port where nothing listens. Starting a container is not tested here: no Docker
engine answers on these machines, so only the reason step 3 gives is."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _services
from tests.postgres import server as postgres
from tests.redis import server as redis

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"postgres": postgres.SERVICE, "redis": redis.SERVICE}
PASSWORD = "s3cret-pw"


def _dead_url(name: str) -> str:
    """A URL with a password, on a port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if name == "postgres":
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/test"
    return f"redis://:{PASSWORD}@127.0.0.1:{port}/0"


@pytest.fixture(params=sorted(SERVICES))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def service(name: str) -> _services.Service:
    """The service, whose local server these checks need (as under CI=true they have)."""
    service = SERVICES[name]
    problem = service.answers(service.local_url)
    if problem is not None:
        why = f"these checks need {service.name} at {service.local_url}: {problem}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return service


def test_the_variable_names_the_server(service: _services.Service) -> None:
    found = _services.look_up(service, {service.variable: service.local_url, "CI": "true"})
    assert found == _services.Found(service.local_url, service.variable)


def test_without_the_variable_the_local_server_answers(service: _services.Service) -> None:
    assert _services.look_up(service, {"CI": "true"}) == _services.Found(
        service.local_url, "local"
    )


@pytest.mark.parametrize("ci", [True, False])
def test_a_variable_naming_a_dead_address_is_not_replaced_by_the_local_server(
    service: _services.Service, name: str, ci: bool
) -> None:
    dead = _dead_url(name)
    found = _services.look_up(service, {service.variable: dead, **({"CI": "true"} if ci else {})})
    assert (found.url, found.source, found.fail) == (None, service.variable, ci)
    assert f"{service.variable}={dead.replace(PASSWORD, '***')}" in found.problem
    assert service.how in found.problem
    assert PASSWORD not in found.problem


def test_with_no_server_anywhere_the_message_says_what_each_step_found(
    service: _services.Service, name: str
) -> None:
    nowhere = dataclasses.replace(service, local_url=_dead_url(name))
    found = _services.look_up(nowhere, {})
    assert (found.url, found.source, found.fail) == (None, "none", False)
    assert f"{service.variable} is not set" in found.problem
    assert nowhere.local_url.replace(PASSWORD, "***") in found.problem
    # The container step says why it could not run (here: no testcontainers, or no Docker).
    assert "testcontainers" in found.problem or "Docker" in found.problem, found.problem
    assert found.problem.endswith(f"To run them: {nowhere.how}")
    assert PASSWORD not in found.problem


def test_a_url_from_the_container_step_is_used_when_nothing_else_answers(
    service: _services.Service, name: str
) -> None:
    nowhere = dataclasses.replace(service, local_url=_dead_url(name))
    # Step 3's answer, as from_container gives it once a container runs: a URL (here the
    # real local server's, standing in for the container's).
    found = _services.look_up(nowhere, {}, lambda _: (service.local_url, ""))
    assert found == _services.Found(service.local_url, "testcontainers")


def test_without_testcontainers_the_container_step_says_so(service: _services.Service) -> None:
    try:
        import testcontainers  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("testcontainers is installed here")
    assert _services.from_container(service) == (
        None,
        "testcontainers is not installed (pip install testcontainers)",
    )


PROBE = """
from tests.{name} import server


def test_needs_the_server():
    server.server_url()
"""


@pytest.mark.parametrize(("ci", "outcome"), [(True, "1 failed"), (False, "1 skipped")])
def test_an_unreachable_server_fails_under_ci_and_skips_otherwise(
    name: str, tmp_path: Path, ci: bool, outcome: str
) -> None:
    service = SERVICES[name]
    (tmp_path / "test_probe.py").write_text(PROBE.format(name=name))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTHONPATH")}
    env |= {service.variable: _dead_url(name), "PYTHONPATH": str(ROOT)}
    if ci:
        env["CI"] = "true"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfs", "test_probe.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert outcome in output, output
    assert done.returncode == (1 if ci else 0), output
    assert f"no {service.name} server for these tests: {service.variable}=" in output, output
    assert PASSWORD not in output, output
