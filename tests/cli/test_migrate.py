"""``transports migrate`` on SQLite and Redis, through the installed command: a SQLite
file is created or upgraded (``--sql`` prints DDL that sqlite3 runs as it is, and
creates no file); Redis keeps no schema, which is nothing to migrate. PostgreSQL's are
in tests/postgres/test_migrate.py."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from tests.sqlite.test_timers import _v5_queue
from transports_core import Event, open_transport
from transports_core.conformance import ManualClock
from transports_sqlite import _sql as sql

from ._command import transports


def _schema(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT type, name FROM sqlite_master ORDER BY 1, 2").fetchall()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
    return [*rows, ("user_version", str(version))]


def _run_script(path: Path, script: str) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executescript(script)


def test_migrate_creates_a_queue_file_then_finds_it_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    made = transports("migrate", url)
    assert made.returncode == 0, made.stderr
    assert f"created the queue's schema at version {sql.SCHEMA_VERSION}" in made.stdout
    again = transports("migrate", url)
    assert again.returncode == 0, again.stderr
    assert "nothing to migrate" in again.stdout


def test_the_printed_ddl_creates_no_file_and_runs_as_it_is(tmp_path: Path) -> None:
    printed_db, made_db = tmp_path / "printed.db", tmp_path / "made.db"
    printed = transports("migrate", "--sql", f"sqlite:///{printed_db}")
    assert printed.returncode == 0, printed.stderr
    assert not printed_db.exists()
    blocks = [block for block in printed.stdout.split("\n\n") if not block.startswith("--")]
    assert (blocks[0], blocks[-1]) == ("BEGIN;", "COMMIT;\n")
    assert all(block.rstrip().endswith(";") for block in blocks)
    _run_script(printed_db, printed.stdout)
    assert transports("migrate", f"sqlite:///{made_db}").returncode == 0
    assert _schema(printed_db) == _schema(made_db)
    with open_transport(f"sqlite:///{printed_db}") as queue:
        assert queue.publish("g", Event(n=1)) == 1


def test_migrate_upgrades_a_version_5_file_and_sql_prints_the_upgrade(tmp_path: Path) -> None:
    clock = ManualClock()
    old, copy, fresh = tmp_path / "old.db", tmp_path / "copy.db", tmp_path / "fresh.db"
    _v5_queue(old, clock)
    shutil.copy(old, copy)
    printed = transports("migrate", "--sql", f"sqlite:///{old}")
    assert printed.returncode == 0, printed.stderr
    assert f"from version 5 to {sql.SCHEMA_VERSION}" in printed.stdout
    assert _schema(old)[-1] == ("user_version", "5")  # --sql changed nothing
    _run_script(copy, printed.stdout)
    done = transports("migrate", f"sqlite:///{old}")
    assert done.returncode == 0, done.stderr
    assert f"upgraded the queue's schema from version 5 to {sql.SCHEMA_VERSION}" in done.stdout
    transports("migrate", f"sqlite:///{fresh}")
    assert _schema(old) == _schema(copy) == _schema(fresh)
    with open_transport(f"sqlite:///{old}") as queue:
        assert queue.claim("w", 30) is not None


def test_migrate_takes_the_url_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "env.db"
    done = transports("migrate", env={"TRANSPORTS_URL": f"sqlite:///{path}"})
    assert done.returncode == 0, done.stderr
    assert path.exists()


def test_migrate_without_a_url_is_a_usage_error() -> None:
    done = transports("migrate", env={"TRANSPORTS_URL": ""})
    assert done.returncode == 2
    assert "TRANSPORTS_URL" in done.stderr


def test_migrate_refuses_an_in_memory_database() -> None:
    done = transports("migrate", "sqlite:///:memory:")
    assert done.returncode == 1
    assert "no schema to migrate" in done.stderr


def test_redis_has_nothing_to_migrate() -> None:
    # Nothing connects: Redis keeps no schema, so the server need not even answer.
    done = transports("migrate", "redis://:s3cretpw@127.0.0.1:1/0?queue=q")
    assert done.returncode == 0, done.stderr
    assert "keeps no schema: nothing to migrate" in done.stdout
    assert "s3cretpw" not in done.stdout + done.stderr
