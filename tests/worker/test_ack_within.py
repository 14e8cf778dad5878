"""`ctx.ack_within(conn)`: a handler acks inside its own database transaction, on a real
SQLite file, with a connection the handler opens itself.

Each scenario runs on two transports. ``stand-in`` is the SQLite transport with a
``_join`` of this module's own (it runs the operation's statements on the caller's
sqlite3 connection, with core's `drive`), so that the runtime's side is tested whatever
the backend does. ``backend`` is the SQLite backend's own ``transport.within``: those
runs skip, saying so, until the backend implements ``_join``; the async ones need
aiosqlite too.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from transports_core import Event, Lease, LeaseLost, TransportError, open_transport
from transports_core.backend import AsyncTransportBase, TransportBase, drive
from transports_sqlite import AsyncSqliteTransport, SqliteTransport
from transports_sqlite._sync import _execute, own
from transports_sqlite._url import parse_url
from transports_worker import AsyncContext, AsyncWorker, Context, Delivery, RetryPolicy, Worker
from transports_worker.testing import Recorder, RunningWorker

T = TypeVar("T")
Kind = Literal["stand-in", "backend"]
Flavour = Literal["sync", "async"]
VISIBILITY = 1.0
# Enough for the handler's own connection to wait out the worker's short write transactions.
BUSY = 10.0


# The seqs the stand-ins' own ``ack`` (not the one inside a transaction) was called for.
RUNTIME_ACKS: list[int] = []


class JoiningSqlite(SqliteTransport[Event]):
    """The stand-in: the caller's sqlite3 connection runs the statements, in the caller's
    transaction (sqlite3 opens it before the first write, as for the caller's own)."""

    def ack(self, lease: Lease[object]) -> None:
        RUNTIME_ACKS.append(lease.seq)
        super().ack(lease)

    # A runner of its own in place of the backend's, to count the runtime's acks apart.
    def _join(self, conn: object) -> Callable[[Any], Any]:  # type: ignore[override]
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"the stand-in joins a sqlite3.Connection, not {conn!r}")
        clock = self._options.clock
        return lambda op: drive(own(op), clock(), partial(_execute, conn))


class AsyncJoiningSqlite(AsyncSqliteTransport[Event]):
    """`JoiningSqlite` for the async twin: the statements run on the caller's sqlite3
    connection, on the event loop's thread (a test's few statements, not a design)."""

    async def ack(self, lease: Lease[object]) -> None:
        RUNTIME_ACKS.append(lease.seq)
        await super().ack(lease)

    # A runner of its own in place of the backend's, on the caller's sqlite3 connection.
    def _join(self, conn: object) -> Callable[[Any], Any]:  # type: ignore[override]
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"the stand-in joins a sqlite3.Connection, not {conn!r}")
        clock = self._options.clock

        async def run(op: Any) -> Any:
            return drive(own(op), clock(), partial(_execute, conn))

        return run


class NoWithin:
    """A transport of someone else's making, without ``within``: it delegates the rest."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "within":
            raise AttributeError(name)
        return getattr(self._inner, name)


def backend_joins(flavour: Flavour) -> bool:
    if flavour == "sync":
        return SqliteTransport._join is not TransportBase._join
    return AsyncSqliteTransport._join is not AsyncTransportBase._join


class AsyncDb:
    """What an async handler uses of its connection: aiosqlite's (the backend) or a plain
    sqlite3 one behind coroutines (the stand-in). ``raw`` goes to ``ack_within``."""

    def __init__(self, raw: Any, native: bool) -> None:
        self.raw, self._native = raw, native

    async def execute(self, sql: str, params: tuple[object, ...] = ()) -> None:
        if self._native:
            await self.raw.execute(sql, params)
        else:
            self.raw.execute(sql, params)

    async def commit(self) -> None:
        await self.raw.commit() if self._native else self.raw.commit()

    async def rollback(self) -> None:
        await self.raw.rollback() if self._native else self.raw.rollback()

    async def close(self) -> None:
        await self.raw.close() if self._native else self.raw.close()


@dataclass
class Setup:
    kind: Kind
    flavour: Flavour
    path: Path

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def source(self) -> Callable[[], Any]:
        if self.kind == "backend":
            return self.url  # type: ignore[return-value]  # the worker opens the URL
        options = parse_url(self.url, {})
        if self.flavour == "sync":
            return lambda: JoiningSqlite(options)
        return lambda: AsyncJoiningSqlite(options)

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=BUSY)

    async def connect_async(self) -> AsyncDb:
        if self.kind == "backend":
            import aiosqlite  # type: ignore[import-not-found,unused-ignore]  # the backend's extra

            return AsyncDb(await aiosqlite.connect(self.path, timeout=BUSY), native=True)
        return AsyncDb(self.connect(), native=False)

    def rows(self) -> list[tuple[int, int]]:
        with closing(sqlite3.connect(self.path)) as conn:
            return sorted(conn.execute("SELECT seq, attempt FROM done").fetchall())

    def start(
        self,
        sync: Callable[[Event, Context[Event]], object],
        asynchronous: Callable[[Event, AsyncContext[Event]], Any],
        recorder: Recorder,
        **options: Any,
    ) -> RunningWorker:
        options.setdefault("visibility", VISIBILITY)
        worker: Any
        if self.flavour == "sync":
            worker = Worker(self.source(), sync, hooks=[recorder], handle_signals=False, **options)
        else:
            worker = AsyncWorker(
                self.source(), asynchronous, hooks=[recorder], handle_signals=False, **options
            )
        return RunningWorker(worker)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Flavour:
    chosen: Flavour = request.param
    return chosen


@pytest.fixture(params=["stand-in", "backend"])
def setup(request: pytest.FixtureRequest, flavour: Flavour, tmp_path: Path) -> Setup:
    kind: Kind = request.param
    if kind == "backend":
        if not backend_joins(flavour):
            pytest.skip("waits for the SQLite backend's _join (transport.within)")
        if flavour == "async":
            pytest.importorskip("aiosqlite", reason="the async backend joins aiosqlite")
    RUNTIME_ACKS.clear()
    chosen = Setup(kind, flavour, tmp_path / "queue.db")
    # The handler's own table, in the queue's file: its rows commit with the acks.
    with open_transport(chosen.url):
        pass
    with closing(sqlite3.connect(chosen.path)) as conn:
        conn.execute("CREATE TABLE done (seq INTEGER, attempt INTEGER)")
        conn.commit()
    return chosen


def publish(setup: Setup, *groups: str) -> list[int]:
    with open_transport(setup.url) as transport:
        return [transport.publish(group, Event(n=n)) for n, group in enumerate(groups)]


def settled_outcomes(recorder: Recorder) -> list[tuple[int, int, str]]:
    return sorted(recorder.outcomes())


def queue_is_empty(setup: Setup) -> bool:
    with open_transport(setup.url) as transport:
        return transport.claim("checker", 60) is None


def test_the_handlers_row_and_the_ack_commit_together_and_the_runtime_acks_once(
    setup: Setup,
) -> None:
    seqs = publish(setup, "a", "b", "a")

    def handle(event: Event, ctx: Context[Event]) -> None:
        conn = setup.connect()
        try:
            conn.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            ctx.ack_within(conn)
            conn.commit()
        finally:
            conn.close()

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        db = await setup.connect_async()
        try:
            await db.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            await ctx.ack_within(db.raw)
            await db.commit()
        finally:
            await db.close()

    recorder = Recorder()
    running = setup.start(handle, ahandle, recorder)
    recorder.wait_settled(3)
    assert running.stop() == 0
    assert settled_outcomes(recorder) == [(seq, 1, "acked") for seq in seqs]
    if setup.kind == "stand-in":
        assert RUNTIME_ACKS == [], "the runtime acked again after ack_within"
    assert all(error is None for _, _, error in recorder.settled_), recorder.settled_
    assert setup.rows() == [(seq, 1) for seq in seqs]
    assert queue_is_empty(setup)


def test_a_rolled_back_ack_leaves_the_lease_to_the_runtimes_failure_path(setup: Setup) -> None:
    (seq,) = publish(setup, "a")

    def handle(event: Event, ctx: Context[Event]) -> None:
        conn = setup.connect()
        try:
            conn.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            ctx.ack_within(conn)
            if ctx.attempt == 1:
                conn.rollback()
                raise ValueError("the first attempt rolls back")
            conn.commit()
        finally:
            conn.close()

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        db = await setup.connect_async()
        try:
            await db.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            await ctx.ack_within(db.raw)
            if ctx.attempt == 1:
                await db.rollback()
                raise ValueError("the first attempt rolls back")
            await db.commit()
        finally:
            await db.close()

    recorder = Recorder()
    running = setup.start(handle, ahandle, recorder, retry=RetryPolicy(base=0.05, jitter=0))
    recorder.wait_settled(2)
    assert running.stop() == 0
    # Rolled back: the lease was still current, so the runtime's nack worked.
    assert settled_outcomes(recorder) == [(seq, 1, "failed"), (seq, 2, "acked")]
    assert setup.rows() == [(seq, 2)]
    assert queue_is_empty(setup)


def test_a_handler_that_commits_its_ack_then_raises_is_acked_not_retried(setup: Setup) -> None:
    (seq,) = publish(setup, "a")

    def handle(event: Event, ctx: Context[Event]) -> None:
        conn = setup.connect()
        try:
            conn.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            ctx.ack_within(conn)
            conn.commit()
        finally:
            conn.close()
        raise ValueError("after the commit")

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        db = await setup.connect_async()
        try:
            await db.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            await ctx.ack_within(db.raw)
            await db.commit()
        finally:
            await db.close()
        raise ValueError("after the commit")

    recorder = Recorder()
    running = setup.start(handle, ahandle, recorder, retry=RetryPolicy(base=0.05, jitter=0))
    recorder.wait_settled(1)
    # The runtime's nack met LeaseLost: the committed ack stands, and is no failure.
    [(delivery, outcome, error)] = recorder.settled_
    assert (delivery.seq, delivery.attempt, outcome) == (seq, 1, "acked")
    assert isinstance(error, ValueError), error
    assert queue_is_empty(setup)
    assert running.stop() == 0
    assert len(recorder.started_) == 1, "the message was delivered again"
    assert setup.rows() == [(seq, 1)]


class Losses(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.lost_: list[Delivery] = []

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        self.lost_.append(delivery)


def test_renewals_stop_once_ack_within_ran_and_the_lease_is_not_lost_meanwhile(
    setup: Setup,
) -> None:
    (seq,) = publish(setup, "a")
    # The transaction stays open after the ack for twice the visibility: a keeper still
    # renewing would wait on the transaction's lock, then lose the lease (and interrupt
    # or cancel the handler) at its deadline.
    hold = 2 * VISIBILITY
    seen: dict[str, int] = {}
    recorder = Losses()

    def handle(event: Event, ctx: Context[Event]) -> None:
        ctx.sleep(VISIBILITY)  # renewed meanwhile
        conn = setup.connect()
        try:
            conn.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            ctx.ack_within(conn)
            seen["at-ack"] = recorder.renewals
            ctx.sleep(hold)
            seen["at-commit"] = recorder.renewals
            conn.commit()
        finally:
            conn.close()

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        await ctx.sleep(VISIBILITY)
        db = await setup.connect_async()
        try:
            await db.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            await ctx.ack_within(db.raw)
            seen["at-ack"] = recorder.renewals
            await ctx.sleep(hold)
            seen["at-commit"] = recorder.renewals
            await db.commit()
        finally:
            await db.close()

    running = setup.start(handle, ahandle, recorder)
    recorder.wait_settled(1)
    assert running.stop() == 0
    assert recorder.outcomes() == [(seq, 1, "acked")], recorder.settled_
    assert recorder.lost_ == []
    assert seen["at-ack"] >= 1, "the lease was not renewed before the ack"
    assert seen["at-commit"] == seen["at-ack"], "the lease was renewed after ack_within"
    assert setup.rows() == [(seq, 1)]
    assert queue_is_empty(setup)


def test_a_transport_without_within_is_refused_and_the_runtime_acks_as_usual(
    flavour: Flavour, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as transport:
        seq = transport.publish("a", Event(n=1))
    refusals: list[BaseException] = []
    conn = sqlite3.connect(tmp_path / "queue.db")

    def handle(event: Event, ctx: Context[Event]) -> None:
        try:
            ctx.ack_within(conn)
        except TransportError as exc:
            refusals.append(exc)

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        try:
            await ctx.ack_within(conn)
        except TransportError as exc:
            refusals.append(exc)

    recorder = Recorder()
    worker: Any
    if flavour == "sync":
        with open_transport(url) as inner:
            worker = Worker(NoWithin(inner), handle, hooks=[recorder], handle_signals=False)
            running = RunningWorker(worker)
            recorder.wait_settled(1)
            assert running.stop() == 0
    else:

        async def main() -> None:
            from transports_core import open_async_transport

            async with open_async_transport(url) as inner:
                worker = AsyncWorker(
                    NoWithin(inner), ahandle, hooks=[recorder], handle_signals=False
                )
                task = asyncio.ensure_future(worker.run())
                while not recorder.settled_:
                    await asyncio.sleep(0.01)
                worker.stop()
                assert await task == 0

        asyncio.run(main())
    conn.close()
    assert [type(exc) for exc in refusals] == [TransportError], refusals
    assert "cannot join a transaction of yours" in str(refusals[0])
    assert "outbox" in str(refusals[0])
    assert recorder.outcomes() == [(seq, 1, "acked")]


def test_ack_within_raises_lease_lost_once_the_lease_is_gone_and_writes_nothing(
    setup: Setup,
) -> None:
    (seq,) = publish(setup, "a")
    raised: list[BaseException] = []
    taken = threading.Event()

    def take_over() -> None:
        # The lease lapses (nothing renews it once the handler stops the keeper below)
        # and another worker claims the message.
        with open_transport(setup.url) as other:
            end = time.monotonic() + 30
            while other.claim("thief", 60) is None:
                assert time.monotonic() < end, "the lease never lapsed"
                time.sleep(0.05)
        taken.set()

    def handle(event: Event, ctx: Context[Event]) -> None:
        ctx._keeper.release()  # as if the keeper were stuck: the lease lapses
        take_over()
        conn = setup.connect()
        try:
            conn.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            try:
                ctx.ack_within(conn)
            except LeaseLost as exc:
                raised.append(exc)
                conn.rollback()
                raise
            conn.commit()
        finally:
            conn.close()

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        ctx._keeper.release()
        await asyncio.get_running_loop().run_in_executor(None, take_over)
        db = await setup.connect_async()
        try:
            await db.execute("INSERT INTO done VALUES (?, ?)", (ctx.lease.seq, ctx.attempt))
            try:
                await ctx.ack_within(db.raw)
            except LeaseLost as exc:
                raised.append(exc)
                await db.rollback()
                raise
            await db.commit()
        finally:
            await db.close()

    recorder = Recorder()
    running = setup.start(handle, ahandle, recorder)
    recorder.wait_settled(1)
    assert running.stop() == 0
    assert taken.is_set()
    assert [type(exc) for exc in raised] == [LeaseLost]
    assert recorder.outcomes() == [(seq, 1, "lost")]
    assert setup.rows() == []
