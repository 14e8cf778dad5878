"""Bad days on the file system: a full disk, a damaged file, read-only files and
directories, a WAL that must not grow for ever, and the permissions of new files."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import stat
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests import _privileged as privileged
from transports_core import (
    Event,
    Lease,
    TransportAdmin,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_sqlite import SqliteTransport
from transports_sqlite._sql import IDLE_WAL_BYTES, WAL_LIMIT_BYTES

BIG = "x" * 600_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs mounted for the test (needs root and mount rights; else skipped)."""
    with privileged.small_disk(tmp_path) as mnt:
        yield mnt


def test_full_disk_fails_the_publish_and_recovers_without_reopening(small_disk: Path) -> None:
    db = small_disk / "q.db"
    with open_transport(f"sqlite:///{db}") as transport:
        assert isinstance(transport, TransportAdmin)
        for n in range(10):
            transport.publish("g", Event(n=n, pad="y" * 10_000))
        filler = privileged.fill(small_disk)
        with pytest.raises(TransportError, match="full") as caught:
            transport.publish("g", Event(n=10, pad=BIG))
        assert str(db) in str(caught.value)
        assert transport.stats().ready == 10  # earlier messages intact, and readable

        filler.unlink()  # space returns
        transport.publish("g", Event(n=10, pad=BIG))
        seen = []
        while (lease := transport.claim("w", 30)) is not None:
            seen.append(lease.event.n)
            transport.ack(lease)
        assert seen == list(range(11))


def test_page_limit_reached_fails_the_publish_and_recovers(tmp_path: Path) -> None:
    """The same without a mount: SQLite's own size cap stands in for the disk."""
    db = tmp_path / "q.db"
    with open_transport(f"sqlite:///{db}") as transport:
        assert isinstance(transport, SqliteTransport)
        transport.publish("g", Event(n=0))
        conn = transport._engine.conn
        assert conn is not None
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages + 10}")
        with pytest.raises(TransportError, match="full"):
            transport.publish("g", Event(n=1, pad=BIG))
        conn.execute("PRAGMA max_page_count = 1000000")
        transport.publish("g", Event(n=1, pad=BIG))
        assert [lease.event.n for lease in _drain(transport)] == [0, 1]


def _drain(transport: SqliteTransport[Event]) -> list[Lease[Event]]:
    leases: list[Lease[Event]] = []
    while (lease := transport.claim("w", 30)) is not None:
        transport.ack(lease)
        leases.append(lease)
    return leases


def _queue_file(path: Path) -> Path:
    with open_transport(f"sqlite:///{path}") as transport:
        transport.publish_many((f"g{n % 7}", Event(n=n, pad="z" * 400), 0) for n in range(500))
    return path


def _garble_header(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(random.Random(1).randbytes(100))


def _truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize(
    ("damage", "why"),
    [(_garble_header, "not a SQLite database"), (_truncate, "corrupt")],
    ids=["garbage-header", "truncated"],
)
def test_damaged_file_is_refused_by_name_and_left_alone(
    tmp_path: Path, damage: Callable[[Path], None], why: str
) -> None:
    db = _queue_file(tmp_path / "q.db")
    damage(db)
    before = db.read_bytes()
    with pytest.raises(TransportError, match=why) as caught:
        open_transport(f"sqlite:///{db}")
    assert str(db) in str(caught.value)

    async def use_async() -> None:
        async with open_async_transport(f"sqlite:///{db}") as transport:
            await transport.claim("w", 30)

    with pytest.raises(TransportError, match=why):
        asyncio.run(use_async())
    assert db.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["q.db"]


# --- read-only: run as the unprivileged user `nobody` in a forked child -------------------


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    with privileged.shared_directory() as path:
        yield path


def _try(call: Callable[[], object]) -> object:
    try:
        return call()
    except TransportError as exc:
        return ["TransportError", str(exc)]


def test_read_only_file_serves_admin_reads_and_refuses_writes(shared_dir: Path) -> None:
    db = shared_dir / "q.db"
    writer = open_transport(f"sqlite:///{db}")  # a live owner keeps -wal and -shm around
    try:
        writer.publish("g", Event(n=1))
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").chmod(0o644)

        def reader() -> object:
            with open_transport(f"sqlite:///{db}") as transport:
                assert isinstance(transport, TransportAdmin)
                return [
                    transport.stats().ready,
                    [g.group_id for g in transport.groups()],
                    _try(lambda: transport.publish("g", Event(n=2))),
                    _try(lambda: transport.claim("w", 30)),
                ]

        outcome = privileged.as_nobody(reader)
        assert isinstance(outcome, list)
        assert outcome[:2] == [1, ["g"]]
        for refused in outcome[2:]:
            assert refused == [
                "TransportError",
                f"{db}: the database is read-only: the file is not writable "
                "(attempt to write a readonly database)",
            ]
        assert writer.claim("w", 30) is not None  # the owner is unaffected
    finally:
        writer.close()


def test_read_only_directory_is_named_in_the_error(shared_dir: Path) -> None:
    db = shared_dir / "q.db"
    open_transport(f"sqlite:///{db}").close()  # clean close: no -wal or -shm left
    os.chown(db, privileged.NOBODY, privileged.NOBODY)
    shared_dir.chmod(0o555)
    outcome = privileged.as_nobody(lambda: _try(lambda: open_transport(f"sqlite:///{db}").close()))
    assert outcome == [
        "TransportError",
        f"{db}: the database is read-only: directory {str(shared_dir)!r} is not writable, "
        "and SQLite must create the -wal and -shm files beside the database to use it "
        "(attempt to write a readonly database)",
    ]
    fresh = f"sqlite:///{shared_dir / 'n.db'}"
    new = privileged.as_nobody(lambda: _try(lambda: open_transport(fresh)))
    assert new[0] == "TransportError"  # type: ignore[index]
    assert "cannot create the database file" in new[1]  # type: ignore[index]
    assert sorted(p.name for p in shared_dir.iterdir()) == ["q.db"]


# --- the WAL and the file do not grow without bound ----------------------------------------


@pytest.mark.slow
def test_wal_is_truncated_once_polling_workers_find_the_queue_empty(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    wal = Path(f"{db}-wal")
    with open_transport(f"sqlite:///{db}") as a, open_transport(f"sqlite:///{db}") as b:
        a.publish_many((f"g{n % 50}", Event(n=n, pad="w" * 2000), 0) for n in range(3000))
        for _ in range(3000):
            lease = a.claim("a", 30)
            assert lease is not None
            a.ack(lease)
        assert wal.stat().st_size > IDLE_WAL_BYTES  # the load left a large WAL behind
        # Both keep polling an empty queue; the WAL goes back to nothing.
        for _ in range(3):
            assert a.claim("a", 30) is None
            assert b.claim("b", 30) is None
        assert wal.stat().st_size == 0


@pytest.mark.parametrize(("synchronous", "wal_bytes"), [("normal", 4 << 20), ("full", 1000 << 10)])
def test_the_wal_is_checkpointed_after_4_mib_unless_each_commit_is_flushed(
    tmp_path: Path, synchronous: str, wal_bytes: int
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with open_transport(url, synchronous=synchronous) as transport:
        conn = transport._engine.conn  # type: ignore[attr-defined]
        ((pages,),) = conn.execute("PRAGMA wal_autocheckpoint").fetchall()
        ((page_size,),) = conn.execute("PRAGMA page_size").fetchall()
        ((limit,),) = conn.execute("PRAGMA journal_size_limit").fetchall()
    assert pages * page_size == wal_bytes
    assert limit == WAL_LIMIT_BYTES > pages * (page_size + 24)  # frames never trimmed mid-cycle


@pytest.mark.slow
def test_file_does_not_grow_across_cycles_of_the_same_load(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    sizes = []
    with open_transport(f"sqlite:///{db}") as transport:
        for cycle in range(6):
            transport.publish_many(
                (f"g{n % 40}", Event(n=n, cycle=cycle, pad="c" * 1000), n % 3) for n in range(1500)
            )
            while (lease := transport.claim("w", 30)) is not None:
                transport.ack(lease)
            sizes.append(db.stat().st_size)
    assert sizes[0] > 1_000_000
    assert sizes[-1] == sizes[1], sizes


# --- permissions of new files -----------------------------------------------------------


@pytest.mark.parametrize(("given", "mode"), [({}, 0o600), ({"file_mode": 0o640}, 0o640)])
def test_new_files_get_the_file_mode_whatever_the_umask(
    tmp_path: Path, given: dict[str, int], mode: int
) -> None:
    db = tmp_path / "q.db"
    old = os.umask(0o077)
    try:
        with open_transport(f"sqlite:///{db}", **given) as transport:
            transport.publish("g", Event(n=1))
            for suffix in ("", "-wal", "-shm"):
                assert stat.S_IMODE(Path(f"{db}{suffix}").stat().st_mode) == mode, suffix
    finally:
        os.umask(old)


def test_file_mode_from_the_url_is_octal_and_checked(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    open_transport(f"sqlite:///{db}?file_mode=0640").close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o640
    for bad in ("0400", "999", "rw", "0o1777"):
        with pytest.raises(ValueError, match="file_mode"):
            open_transport(f"sqlite:///{tmp_path / 'x.db'}?file_mode={bad}")
    assert not (tmp_path / "x.db").exists()


def test_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    open_transport(f"sqlite:///{db}").close()
    db.chmod(0o644)
    open_transport(f"sqlite:///{db}", file_mode=0o600).close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o644
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
