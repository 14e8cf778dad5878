"""The database file: what is refused (and left untouched), the durability settings each
connection runs with, and the mode of a new file."""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests._privileged import as_nobody
from transports_core import Event, TransportError, open_transport
from transports_sqlite import _sql as sql

from ._support import file_digest, sidecars
from .conftest import OpenDb


def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _text(path: Path) -> None:
    path.write_text("name,qty\nwidget,3\n" * 200)


def _foreign_sqlite(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("INSERT INTO invoices (total) VALUES (9.5)")
        conn.commit()


def _empty_foreign_sqlite(path: Path) -> None:
    """Another application's database that has no tables yet, only its own header."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("PRAGMA user_version = 3")


def _future_queue(path: Path) -> None:
    """A queue written by a later version of this library, with another schema version."""
    with open_transport(f"sqlite:///{path}") as t:
        t.publish("g", Event(i=1))
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {sql.SCHEMA_VERSION + 1}")
    assert sidecars(path) == []


REFUSED: dict[str, tuple[Callable[[Path], None], str]] = {
    "random bytes": (_random_bytes, "is not a SQLite database"),
    "text file": (_text, "is not a SQLite database"),
    "another application's database": (_foreign_sqlite, "of another application"),
    "another application's empty database": (_empty_foreign_sqlite, "of another application"),
    "unknown schema version": (_future_queue, f"schema version {sql.SCHEMA_VERSION + 1}"),
}


@pytest.mark.parametrize(("make", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_file_that_is_not_our_queue_is_refused_and_left_untouched(
    tmp_path: Path, make: Callable[[Path], None], why: str
) -> None:
    path = tmp_path / "data.db"
    make(path)
    digest, mode = file_digest(path), path.stat().st_mode
    with pytest.raises(TransportError, match=why) as info:
        open_transport(f"sqlite:///{path}")
    assert str(path) in str(info.value)
    assert file_digest(path) == digest
    assert path.stat().st_mode == mode
    assert sidecars(path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.db"]


def test_missing_directory_is_refused_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "q.db"
    with pytest.raises(TransportError, match="does not exist") as info:
        open_transport(f"sqlite:///{path}")
    assert str(path) in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_directory_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.mkdir()
    with pytest.raises(TransportError, match="is a directory") as info:
        open_transport(f"sqlite:///{path}")
    assert str(path) in str(info.value)
    assert list(path.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.db"]


def test_empty_file_is_adopted_as_a_new_queue(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.touch()
    with open_transport(f"sqlite:///{path}") as t:
        assert t.publish("g", Event()) == 1


# read-only files: root ignores file modes, so as root the writer is a child process that
# drops to nobody first


def _write_in_process(path: Path) -> str:
    try:
        with open_transport(f"sqlite:///{path}") as t:
            t.publish("g", Event(i=2))
    except TransportError as exc:
        return f"refused: {exc}\n"
    return "written\n"


def _write_as_another_user(path: Path) -> str:
    # Forked, so it works where the installation is private to root (see `as_nobody`).
    return str(as_nobody(lambda: _write_in_process(path)))


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory others may enter and read but not write (tmp_path's parents are 0o700)."""
    with tempfile.TemporaryDirectory(prefix="dt-readonly-") as top:
        os.chmod(top, 0o755)
        yield Path(top)


def test_read_only_file_is_refused_naming_it(world_readable_dir: Path) -> None:
    path = world_readable_dir / "q.db"
    with open_transport(f"sqlite:///{path}") as t:
        t.publish("g", Event(i=1))
    path.chmod(0o444)
    if os.geteuid() == 0:
        write = _write_as_another_user
    elif not os.access(path, os.W_OK):
        write = _write_in_process
    else:
        pytest.skip("not root, and chmod 0o444 does not stop this user writing the file")
    digest = file_digest(path)
    outcome = write(path)
    assert outcome.startswith(f"refused: {path}: the database is read-only"), outcome
    assert file_digest(path) == digest
    assert sidecars(path) == []


# durability settings


def _pragma(t: Any, name: str) -> object:
    ((value,),) = t._engine.conn.execute(f"PRAGMA {name}").fetchall()
    return value


@pytest.mark.parametrize(
    ("options", "url_query", "level"),
    [
        ({}, "", 2),
        ({"synchronous": "full"}, "", 2),
        ({"synchronous": "normal"}, "", 1),
        ({}, "?synchronous=normal", 1),
        ({}, "?synchronous=off", 0),
        ({"synchronous": "EXTRA"}, "", 3),
    ],
)
def test_connection_uses_wal_and_the_synchronous_option(
    db_path: Path, options: dict[str, object], url_query: str, level: int
) -> None:
    with open_transport(f"sqlite:///{db_path}{url_query}", **options) as t:
        assert _pragma(t, "journal_mode") == "wal"
        assert _pragma(t, "synchronous") == level


@pytest.mark.parametrize(
    ("options", "url_query", "ms"),
    [({}, "", 5000), ({"busy_timeout": 250}, "", 250), ({}, "?busy_timeout=0", 0)],
)
def test_connection_uses_the_busy_timeout_option(
    db_path: Path, options: dict[str, object], url_query: str, ms: int
) -> None:
    with open_transport(f"sqlite:///{db_path}{url_query}", **options) as t:
        assert _pragma(t, "busy_timeout") == ms


def test_file_stays_in_wal_mode_for_other_connections(open_db: OpenDb, db_path: Path) -> None:
    open_db().publish("g", Event())
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
        assert conn.execute("PRAGMA application_id").fetchall() == [(sql.APPLICATION_ID,)]
        assert conn.execute("PRAGMA user_version").fetchall() == [(sql.SCHEMA_VERSION,)]


def test_memory_database_works_without_a_file(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    with open_transport("sqlite:///:memory:") as t:
        t.publish("g", Event(i=1))
        lease = t.claim("w", 30)
        assert lease is not None
        assert lease.event == Event(i=1)
    assert list(tmp_path.iterdir()) == []


def test_new_file_is_private_to_its_owner(open_db: OpenDb, db_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        open_db().publish("g", Event())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600
    wal = Path(f"{db_path}-wal")
    assert wal.exists()
    assert stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_existing_file_keeps_its_mode(db_path: Path) -> None:
    db_path.touch()
    db_path.chmod(0o640)
    with open_transport(f"sqlite:///{db_path}") as t:
        t.publish("g", Event())
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o640
