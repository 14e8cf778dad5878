"""The PostgreSQL transport through PgBouncer, in transaction mode and in session mode, in
front of the test server: the conformance suite passes with ``prepare_threshold=none``;
without it, transaction mode fails with one clear error; a blocked claim falls back to
rechecks (and says so once) unless ``listen_url`` goes straight to the server.

Needs ``pgbouncer`` (Debian's package; `.ci/run` installs it) and root, to run it as the
``postgres`` user; skipped with the reason otherwise, failed under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import psycopg
import pytest

import conformance.test_postgres as direct
from transports_core import Event, TransportError, open_transport
from transports_postgres._url import parse_url

from .server import fresh_schema, server_url, with_schema
from .test_restart import _free_port


class Bouncer:
    def __init__(self, root: Path, mode: str, server: str) -> None:
        self.root, self.mode, self.port = root, mode, _free_port()
        parts = urlsplit(server)
        self.database = parts.path.lstrip("/") or "postgres"
        self.user = parts.username or "postgres"
        (root / "users.txt").write_text(f'"{self.user}" ""\n')
        (root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
            f"pool_mode = {mode}\nmax_client_conn = 400\ndefault_pool_size = 20\n"
            f"logfile = {root / 'log'}\npidfile = {root / 'pid'}\n"
        )
        shutil.chown(root, "postgres", "postgres")
        for path in root.iterdir():
            shutil.chown(path, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> None:
        pgbouncer = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        subprocess.run(
            ["runuser", "-u", "postgres", "--", pgbouncer, "-d", str(self.root / "pgbouncer.ini")],
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise

    def stop(self) -> None:
        pidfile = self.root / "pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), 15)


def _pgbouncer_missing() -> str | None:
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists():
        return "needs pgbouncer (apt-get install -y pgbouncer)"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "needs root, to run pgbouncer as the postgres user"
    return None


@pytest.fixture(scope="module", params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest) -> Iterator[Bouncer]:
    missing = _pgbouncer_missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    root = Path(tempfile.mkdtemp(prefix="transports-pgbouncer-"))
    bouncer = Bouncer(root, str(request.param), server_url())
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(root, ignore_errors=True)


def _through(bouncer: Bouncer, schema: str, **query: object) -> str:
    return with_schema(bouncer.url, schema, **{"pool_min_size": 0, "pool_max_size": 4, **query})


class _ThroughBouncer:
    same_arguments_as_direct = True  # see tests/conftest.py

    @pytest.fixture
    def transport_url(self, bouncer: Bouncer) -> Iterator[str]:
        # Callers' own connections (`within`) go straight to the server.
        with fresh_schema("bnc") as (url, schema):
            self.server = url
            yield _through(bouncer, schema, prepare_threshold="none")


@pytest.mark.slow
class TestPostgresThroughPgBouncer(_ThroughBouncer, direct.TestPostgres):
    pass


@pytest.mark.slow
class TestAsyncPostgresThroughPgBouncer(_ThroughBouncer, direct.TestAsyncPostgres):
    pass


def _take_turns(url: str) -> None:
    """Clients take turns on the pooler's server connections: each prepares its
    statements at once (threshold 0), under the names the next one uses too."""
    with contextlib.ExitStack() as stack:
        for n in range(20):
            stack.enter_context(open_transport(url)).publish("g", Event(n=n))


def test_transaction_mode_without_prepare_threshold_none_fails_saying_what_to_set(
    bouncer: Bouncer,
) -> None:
    if bouncer.mode != "transaction":
        pytest.skip("session mode keeps prepared statements")
    with fresh_schema("bnc") as (_, schema):
        url = _through(bouncer, schema, pool_max_size=2, prepare_threshold=0)
        with pytest.raises(TransportError, match="prepare_threshold=none") as info:
            _take_turns(url)
    assert "pooler in transaction mode" in str(info.value)


def test_a_blocked_claim_through_transaction_mode_warns_once_and_still_wakes(
    bouncer: Bouncer, caplog: pytest.LogCaptureFixture
) -> None:
    with fresh_schema("bnc") as (_, schema):
        url = _through(bouncer, schema, prepare_threshold="none")
        with open_transport(url) as queue, caplog.at_level(logging.WARNING, "transports_postgres"):
            for _ in range(2):
                assert queue.claim("w", 30, wait=0.3) is None
            with open_transport(url) as other:
                other.publish("g", Event(n=1))
            lease = queue.claim("w", 30, wait=5)
            assert lease is not None
    warned = [r for r in caplog.records if "listen_url" in r.getMessage()]
    if bouncer.mode == "transaction":
        assert len(warned) == 1
        assert "every 1.0 s" in warned[0].getMessage()
    else:
        assert warned == []


def test_listen_url_straight_to_the_server_wakes_a_blocked_claim_at_once(
    bouncer: Bouncer, caplog: pytest.LogCaptureFixture
) -> None:
    with fresh_schema("bnc") as (server, schema):
        url = _through(bouncer, schema, prepare_threshold="none", listen_url=quote(server, safe=""))
        with open_transport(url) as queue, caplog.at_level(logging.WARNING, "transports_postgres"):
            assert queue.claim("w", 30, wait=0.2) is None
            with open_transport(url) as other:
                # A second to spare before the recheck: a wake-up, not a look, finds it.
                started = time.monotonic()
                other.publish("g", Event(n=1))
                lease = queue.claim("w", 30, wait=5)
                took = time.monotonic() - started
    assert lease is not None
    assert took < 0.5, f"woken after {took:.2f} s"
    assert not [r for r in caplog.records if "listen_url" in r.getMessage()]


@pytest.mark.parametrize(
    ("given", "threshold"),
    [("prepare_threshold=none", None), ("prepare_threshold=NONE", None), ("", 5)]
    + [(f"prepare_threshold={n}", n) for n in (0, 1, 12)],
)
def test_prepare_threshold_in_the_url(given: str, threshold: int | None) -> None:
    assert parse_url(f"postgresql://h/db?{given}", {}).prepare_threshold == threshold


def test_prepare_threshold_as_a_keyword_takes_none() -> None:
    assert parse_url("postgresql://h/db", {"prepare_threshold": None}).prepare_threshold is None


@pytest.mark.parametrize("bad", ["-1", "x", "1.5", ""])
def test_a_bad_prepare_threshold_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=f"prepare_threshold must be none .* got '{bad}'"):
        parse_url(f"postgresql://h/db?prepare_threshold={bad}", {})


def test_listen_url_is_taken_out_of_the_url_and_shown_without_its_password() -> None:
    inner = "postgresql://app:pw@db:5432/jobs?sslmode=disable"
    options = parse_url(
        f"postgresql://app@bouncer:6432/jobs?listen_url={quote(inner, safe='')}", {}
    )
    assert options.listen_url == inner
    assert "listen_url" not in options.conninfo
    assert ":pw@" not in options.display
    assert ":pw@" not in repr(options)


@pytest.mark.parametrize(
    ("inner", "why"),
    [
        ("redis://h/0", "is not a PostgreSQL URL"),
        ("postgresql://h/db?schema=q", "libpq's parameters only, not schema"),
        ("postgresql://h/db?bogus=1", "malformed listen_url"),
    ],
)
def test_a_bad_listen_url_is_named(inner: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_url(f"postgresql://h/db?listen_url={quote(inner, safe='')}", {})
