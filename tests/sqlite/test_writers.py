"""The writers' lock: this process's connections to one file take turns to write on a
lock of the process (`writers_of`), where a waiting writer is woken as soon as the other
is done, instead of at SQLite's write lock, where it sleeps between tries. Reads do not
take it; the async twin never waits for it on the event loop; a child process forked
while it is held starts without it."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from pathlib import Path
from typing import cast

from tests.sqlite.conftest import OpenDb
from transports_core import AsyncTransportAdmin, Event, open_async_transport
from transports_sqlite._sync import writers_of

SETTLE = 0.2  # how long a write held back by the lock is given to (wrongly) get through


def test_one_lock_per_file_whatever_the_path_spelling(db_path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    (tmp_path / "sub").mkdir()
    assert writers_of(str(db_path)) is writers_of(str(tmp_path / "sub" / ".." / "queue.db"))
    assert writers_of(str(db_path)) is not writers_of(str(other))


def test_a_write_waits_for_the_lock_and_a_read_does_not(open_db: OpenDb, db_path: Path) -> None:
    transport = open_db()
    transport.publish("g", Event(n=0))
    published = threading.Event()

    def publish() -> None:
        open_db().publish("g", Event(n=1))
        published.set()

    lock = writers_of(str(db_path))
    with lock:
        thread = threading.Thread(target=publish)
        thread.start()
        assert not published.wait(SETTLE), "a write went ahead without the writers' lock"
        assert transport.stats().ready == 2 - 1  # a read goes ahead; n=1 is not in yet
    thread.join(10)
    assert published.is_set()
    assert transport.stats().ready == 2


def test_the_async_twin_does_not_block_its_loop_on_the_lock(db_path: Path) -> None:
    # A publish at synchronous=normal runs on the event loop's thread when it can. While
    # another thread holds the lock, it must go to the engine's thread and wait there:
    # the loop goes on ticking before the lock is let go.
    url = f"sqlite:///{db_path}?synchronous=normal"
    lock = writers_of(str(db_path))
    holding, release, let_go = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(SETTLE * 10)  # let go on the test's word, or in the end anyway
            let_go.set()

    async def main() -> None:
        async with open_async_transport(url) as transport:
            await transport.publish("g", Event(n=0))  # opened, and its engine warm
            holder = threading.Thread(target=hold)
            holder.start()
            holding.wait(10)
            publish = asyncio.ensure_future(transport.publish("g", Event(n=1)))
            ticks = 0
            while ticks < 5 and not let_go.is_set():
                await asyncio.sleep(0.01)
                ticks += 1
            early = let_go.is_set()
            release.set()
            holder.join(10)
            assert not early, "the event loop was blocked until the lock was let go"
            assert ticks == 5
            await asyncio.wait_for(publish, 10)
            assert (await cast(AsyncTransportAdmin, transport).stats()).ready == 2

    asyncio.run(main())


def _child_publishes(url: str) -> None:
    from transports_core import open_transport

    with open_transport(url) as transport:
        transport.publish("child", Event(n=1))


def test_a_child_forked_while_the_lock_is_held_can_write(db_path: Path, open_db: OpenDb) -> None:
    transport = open_db()
    url = f"sqlite:///{db_path}"
    with writers_of(str(db_path)):
        child = multiprocessing.get_context("fork").Process(target=_child_publishes, args=(url,))
        child.start()
        child.join(30)
    assert child.exitcode == 0
    assert transport.stats().ready == 1
