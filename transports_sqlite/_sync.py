"""`SqliteTransport`: the operations of `_ops` run over the standard library's sqlite3.

`Engine` owns one connection and runs each operation on it as one transaction: the open
sequence, the retries on a busy database and the lease-flush bracket are written here
once, around core's `drive`, which runs the operation's statements. The sync transport
shares one engine between threads under a lock that spans each whole transaction; the
async twin runs the same engine on a thread of its own. `CallersConnection` runs
operations on a caller's connection instead, inside the caller's transaction
(``transport.within(conn)``), for both twins.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any, Generic, TypeVar
from urllib.request import pathname2url

from transports_core import Event, Lease, Migration, TransportError
from transports_core import backend as core
from transports_core.backend import Operation, WaitState, drive, wait_for, wait_plan

from . import _ops
from . import _sql as sql
from ._errors import Retries, is_transient, sqlite_errors
from ._ops import Claim
from ._url import MEMORY, SqliteOptions, database_target, parse_url, wal_bytes
from ._watch import Watcher

E = TypeVar("E")
T = TypeVar("T")


def _execute(conn: sqlite3.Connection | sqlite3.Cursor, stmt: _ops.Stmt) -> _ops.Result:
    """One step of core's `drive`: run ``stmt`` on ``conn`` (or a cursor of it)."""
    statement = stmt.statement
    if stmt.many is not None:
        spread = statement.spread
        rows = stmt.many if spread is None else map(spread, stmt.many)
        cursor = conn.executemany(statement.sql, rows)
    else:
        cursor = conn.execute(statement.sql, statement.bind(stmt.params))
    # Rows first: a write's row count is complete once its RETURNING rows are fetched.
    fetched = cursor.fetchall() if statement.rows else []
    return _result((fetched, cursor.rowcount))


# `Result(rows, rowcount)` without the Python-level `__new__` of a named tuple: every
# statement on the hot path builds one.
_result: Callable[[tuple[list[Any], int]], _ops.Result] = partial(tuple.__new__, _ops.Result)


def own(op: Operation[_ops.Stmt, _ops.Result, T]) -> _ops.Op[T]:
    """``op`` as an operation of this backend's `_ops` (both twins): the only kind their
    `Operations` build, the base classes' methods included."""
    if isinstance(op, _ops.Op):
        return op
    raise TypeError(f"not a SQLite operation: {op!r}")


# The lock of each database file's writers in this process (see `writers_of`).
_WRITERS: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_WRITERS_LOCK = threading.Lock()


def writers_of(path: str) -> threading.Lock:
    """The lock that this process's connections to the file at ``path`` take around each
    transaction that writes. Two of them would otherwise meet at SQLite's write lock,
    where the one that waits sleeps a millisecond or more between tries (SQLite's busy
    handler) however soon the other is done; on this lock it is woken at once. Other
    processes still meet at SQLite's lock. A child process starts with none held."""
    key = os.path.realpath(path)
    with _WRITERS_LOCK:
        lock = _WRITERS.get(key)
        if lock is None:
            lock = _WRITERS[key] = threading.Lock()
        return lock


def _forget_writers() -> None:
    global _WRITERS_LOCK
    _WRITERS.clear()  # a lock held at the fork by another thread would never be released
    _WRITERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_writers)


class Engine:
    """One open connection, and every transaction run on it.

    Not thread-safe by itself: the sync transport holds a lock around each call, and the
    async one a lock of its own (see `_async.LoopEngine`). ``commits`` counts the
    transactions that may have made a message deliverable (waiting claims compare it,
    since SQLite's change counter does not count a connection's own commits), and each
    such commit nudges the transport's waiting claims."""

    # Whether transactions may also run on an event loop's thread (see `_async.LoopEngine`):
    # then the connection rests without a busy timeout and without automatic checkpoints.
    on_loop = False

    def __init__(self, options: SqliteOptions) -> None:
        self.options = options
        self.commits = 0
        self.waiters: set[Watcher] = set()
        self._relax = _ops.lease_durability(options.synchronous, options.memory)
        self._resting_busy_timeout = 0 if self.on_loop else options.busy_timeout
        self._execute: Callable[[_ops.Stmt], _ops.Result]
        if options.migrate == "never" and not (options.memory or os.path.exists(options.path)):
            _ops.may_change(options.path, options.migrate, _ops.EMPTY)  # refuses; creates nothing
        target = database_target(options)
        with sqlite_errors(options.path):
            # isolation_level=None: sqlite3 must not open transactions behind our back; we
            # issue BEGIN IMMEDIATE ourselves so that the write lock is taken up front.
            conn = sqlite3.connect(
                target,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=options.busy_timeout / 1000,
            )
        self._execute = partial(_execute, conn)
        self._writers = None if options.memory else writers_of(options.path)
        try:
            # Look before asking for the write lock, so that a read-only queue opens.
            version = self._transaction(conn, _ops.needs_setup(options.path))
            if not options.memory:
                _ops.may_change(options.path, options.migrate, version)
            if version == _ops.EMPTY:
                self._transaction(conn, _ops.new_file())
                self._transaction(conn, _ops.setup(options.path))
            elif version != sql.SCHEMA_VERSION:
                self._transaction(conn, _ops.upgrade(options.path))
            session = _ops.session(options.synchronous, options.memory, self.on_loop)
            self._transaction(conn, session)
        except BaseException:
            conn.close()
            raise
        self.conn: sqlite3.Connection | None = conn

    def connection(self) -> sqlite3.Connection:
        conn = self.conn
        if conn is None:
            raise TransportError(f"the transport on sqlite:///{self.options.path} is closed")
        return conn

    def run(self, op: _ops.Op[T]) -> T:
        value = self._transaction(self.connection(), op)
        self._ran(op)
        return value

    def _ran(self, op: _ops.Op[Any]) -> None:
        if op.wakes:
            self.commits += 1
            for watcher in tuple(self.waiters):
                watcher.nudge()

    def look(self, min_priority: int) -> WaitState:
        """What a waiting claim compares (see `seen`)."""
        return self.seen(self.run(_ops.wait_state(min_priority)))

    def seen(self, state: tuple[int, float | None]) -> WaitState:
        """A waiting claim's look: its version is the database's change counter (moved by
        other connections' commits) with this engine's own commits, which that counter
        does not count; ``due`` comes with the counter, from the database."""
        counter, due = state
        return WaitState((counter, self.commits), due)

    def _transaction(self, conn: sqlite3.Connection, op: _ops.Op[T]) -> T:
        """Run ``op`` in one transaction, again from the start while it fails on contention
        (see `retry_delay`): nothing of a failed attempt was committed."""
        started = time.monotonic()
        try:
            return self._attempt(conn, op)  # the common case, kept free of bookkeeping
        except sqlite3.DatabaseError as exc:
            failed = exc
        try:
            return self._retry(conn, op, failed, started)
        finally:
            # The error's traceback holds this frame, which would hold the error: a
            # cycle left for the garbage collector at every contended transaction.
            del failed

    def _retry(
        self,
        conn: sqlite3.Connection,
        op: _ops.Op[T],
        failed: sqlite3.DatabaseError,
        started: float,
    ) -> T:
        """Run ``op`` again after its first attempt, begun at ``started``, ``failed``. A
        connection that rests without a busy timeout (`on_loop`) sets it for the retries,
        so that they wait for another connection's lock as everywhere else."""
        retries = Retries(started, self.options.busy_timeout)
        rests, waits = self._resting_busy_timeout, self.options.busy_timeout
        patient = rests != waits and is_transient(failed)
        with sqlite_errors(self.options.path):
            if patient:
                conn.execute(sql.busy_timeout(waits))
            try:
                while (delay := retries.after(failed)) is not None:
                    time.sleep(delay)
                    try:
                        return self._attempt(conn, op)
                    except sqlite3.OperationalError as exc:
                        failed = exc
                raise failed
            finally:
                del failed  # as in `_transaction`
                if patient:
                    conn.execute(sql.busy_timeout(rests))

    def writers(self, op: _ops.Op[Any]) -> threading.Lock | None:
        """The lock ``op`` takes before it begins (see `writers_of`); None if it only
        reads, or the database is in memory."""
        return None if op.begin == sql.BEGIN_READ else self._writers

    def _attempt(self, conn: sqlite3.Connection, op: _ops.Op[T]) -> T:
        writers = self.writers(op)
        if writers is None:
            return self.attempt_held(conn, op)
        with writers:
            return self.attempt_held(conn, op)

    def attempt_held(self, conn: sqlite3.Connection, op: _ops.Op[T]) -> T:
        """One attempt at ``op``'s transaction, its `writers` lock held by the caller."""
        relax = None if op.durable else self._relax
        if relax is None:
            return self._commit(conn, op)
        conn.execute(relax.before)
        try:
            return self._commit(conn, op)
        finally:
            conn.execute(relax.after)

    def _commit(self, conn: sqlite3.Connection, op: _ops.Op[T]) -> T:
        begin = op.begin
        if begin is None:  # AUTOCOMMIT: each statement is its own transaction
            return drive(op, self.options.clock(), self._execute)
        conn.execute(begin)
        try:
            value = drive(op, self.options.clock(), self._execute)
            conn.execute(sql.COMMIT)
        except BaseException:
            if conn.in_transaction:
                conn.execute(sql.ROLLBACK)
            raise
        return value

    def idle_due(self) -> bool:
        """Whether a claim that found nothing should shrink the WAL (see `idle`)."""
        return self.conn is not None and _ops.checkpoint_due(wal_bytes(self.options))

    def idle(self) -> None:
        """A claim found nothing: a good moment to shrink a large WAL. Never waits: if
        someone is reading or writing, the next idle claim tries again."""
        if self.idle_due():
            self._checkpoint(sql.CHECKPOINT_TRUNCATE)

    def _checkpoint(self, statement: str) -> bool:
        """Run a checkpoint without waiting for anybody: True if it copied the whole WAL
        into the database, so that the next commit starts the WAL over."""
        conn = self.connection()
        with sqlite_errors(self.options.path):
            if self._resting_busy_timeout:
                conn.execute(sql.busy_timeout(0))
            try:
                ((busy, frames, copied),) = conn.execute(statement).fetchall()
            except sqlite3.OperationalError as exc:
                if not is_transient(exc):
                    raise
                return False
            finally:
                if self._resting_busy_timeout:
                    conn.execute(sql.busy_timeout(self._resting_busy_timeout))
        return not busy and frames == copied

    def close(self) -> None:
        conn, self.conn = self.conn, None
        for watcher in tuple(self.waiters):
            watcher.nudge()
        if conn is not None:
            conn.close()


# sqlite3.LEGACY_TRANSACTION_CONTROL, the default of `Connection.autocommit` (Python 3.12+):
# before 3.12, every connection has legacy transaction control.
_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)


class CallersConnection:
    """A caller's sqlite3 connection to the queue's file, on which operations run inside
    the caller's open transaction (``transport.within(conn)``): never BEGIN, COMMIT or
    ROLLBACK of it; each operation in a savepoint of its own (see `_sql.SAVEPOINT`). No
    retries, as an attempt cannot start over inside someone else's transaction, and no
    lease-durability bracket, as the caller's commit is the one that flushes. Nothing in
    the schema calls a function that only the transport's connection has, so any
    connection of the same SQLite library runs its triggers alike.

    The sync twin calls it on the caller's thread; the async twin on the aiosqlite
    connection's thread, which `check`s the file at the first operation."""

    __slots__ = ("_conn", "_options", "checked")

    def __init__(self, options: SqliteOptions, conn: sqlite3.Connection) -> None:
        if options.memory:
            raise ValueError(
                f"the transport on sqlite:///{MEMORY} cannot join another connection's "
                "transaction: its database lives in its own connection only"
            )
        self._options = options
        self._conn = conn
        self.checked = False

    def check(self) -> None:
        """Refuse a connection whose main database is not the queue's file."""
        with sqlite_errors(self._options.path), _plain(self._conn) as cursor:
            rows = cursor.execute(sql.DATABASE_LIST).fetchall()
        theirs = next((file for _, name, file in rows if name == "main"), "")
        ours = os.path.abspath(self._options.path)
        if not theirs:
            raise ValueError(
                f"the connection is to an in-memory or temporary database, not to the "
                f"queue's file {ours}"
            )
        if not _same_file(theirs, ours):
            raise ValueError(f"the connection is to {theirs}, not to the queue's file {ours}")
        self.checked = True

    def __call__(self, op: Operation[_ops.Stmt, _ops.Result, T]) -> T:
        mine = own(op)
        if not self.checked:
            self.check()
        conn = self._conn
        with sqlite_errors(self._options.path):
            self._in_transaction()
            with _plain(conn) as cursor:
                cursor.execute(sql.SAVEPOINT)
                try:
                    value = drive(mine, self._options.clock(), partial(_execute, cursor))
                except BaseException:
                    # An error that ended the whole transaction (a full disk, say) left
                    # no savepoint to go back to; the caller learns of it from the error.
                    if conn.in_transaction:
                        cursor.execute(sql.ROLLBACK_TO_SAVEPOINT)
                        cursor.execute(sql.RELEASE_SAVEPOINT)
                    raise
                cursor.execute(sql.RELEASE_SAVEPOINT)
        return value

    def _in_transaction(self) -> None:
        """Make sure the caller's transaction is open, or refuse."""
        conn = self._conn
        if conn.in_transaction:
            return
        if getattr(conn, "autocommit", _LEGACY) == _LEGACY and conn.isolation_level is not None:
            conn.execute(sql.OPEN_CALLER_TRANSACTION)
            return
        raise TransportError(
            "the connection has no open transaction and commits each statement on its "
            "own (autocommit), so the queue's statements would commit at once: run BEGIN "
            "(or BEGIN IMMEDIATE) on it first"
        )


@contextmanager
def _plain(conn: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
    """A cursor of ``conn`` that reads plain tuples of str, whatever row and text
    factories the caller set on ``conn``, which are the caller's again afterwards."""
    cursor = sqlite3.Cursor(conn)
    cursor.row_factory = None
    text_factory, conn.text_factory = conn.text_factory, str
    try:
        yield cursor
    finally:
        conn.text_factory = text_factory


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class Waiting:
    """What both twins' waiting claims share: a watcher of the files a commit to the
    database writes (none in memory), known to the engine, which nudges it, and the
    claim's `plan` (core's `wait_plan`: it confirms a file's wake-up with a few looks,
    and reads the counter on core's `Backoff` schedule where no file wakes it). A twin
    runs the plan with core's `wait_for` or `wait_for_async`, until the transport is
    ``closed``; a `TransportError` raised once it is closed ends the wait with nothing
    leased."""

    def __init__(
        self, engine: Engine, options: SqliteOptions, seconds: float, closed: Callable[[], bool]
    ) -> None:
        self.watcher = watcher = Watcher(None if options.memory else options.path)
        self.closed = closed
        self._engine = engine
        engine.waiters.add(watcher)
        backoff = None if watcher.sees_files else core.Backoff()
        self.plan: Generator[core.WaitStep, object, None] = wait_plan(
            seconds, options.clock, time.monotonic, confirm=watcher.confirm, backoff=backoff
        )

    def __enter__(self) -> Waiting:
        return self

    def __exit__(self, t: object, e: BaseException | None, tb: object) -> bool:
        self.plan.close()
        self._engine.waiters.discard(self.watcher)
        self.watcher.close()
        return isinstance(e, TransportError) and self.closed()


class Twin(Generic[E]):
    """What both SQLite transports hold and do alike: their options, event codec and
    claim builder, a claim's checked arguments, and how they show."""

    _ops: core.Operations = _ops

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        self._options = options
        self._dedup_window = options.dedup_window
        self._codec: core.EventCodec[E] = core.EventCodec(event_type)
        self._on_dead: str = options.on_dead
        max_attempts, on_dead = options.max_attempts, options.on_dead
        # A worker claims with the same arguments every time: keep its checked op.
        self._claims: core.ReuseLast[[str, float, int], Claim] = core.ReuseLast(
            lambda worker_id, visibility, min_priority: Claim(
                worker_id, visibility, min_priority, max_attempts, on_dead
            )
        )

    def _claim_op(self, worker_id: str, visibility: float, min_priority: int) -> Claim:
        return self._claims(worker_id, visibility, min_priority)

    def _claim_of(
        self, worker_id: str, visibility: float, min_priority: int, wait: float
    ) -> tuple[Claim, float]:
        """A claim's op, and how many seconds it may wait (0: none)."""
        op = self._claims(worker_id, visibility, min_priority)
        return op, 0.0 if type(wait) is int and wait == 0 else core.check_wait(wait)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} sqlite:///{self._options.path}>"


class SqliteTransport(Twin[E], core.TransportBase[E]):
    """A durable transport in one SQLite file (or in memory), over sqlite3."""

    def __init__(self, options: SqliteOptions, event_type: object = Event) -> None:
        super().__init__(options, event_type)
        self._lock = threading.Lock()
        self._engine = Engine(options)

    def _run(self, op: Operation[_ops.Stmt, _ops.Result, T]) -> T:
        mine = own(op)
        with self._lock:
            return self._engine.run(mine)

    def _look(self, min_priority: int) -> WaitState:
        with self._lock:
            return self._engine.look(min_priority)

    def _wait(self, op: _ops.Claim, wait: float) -> core.Claimed | None:
        """Claim until a message comes or ``wait`` runs out (see `Waiting`)."""
        engine = self._engine
        with Waiting(engine, self._options, wait, lambda: engine.conn is None) as waiting:
            return wait_for(
                waiting.plan,
                partial(self._look, op.min_priority),
                partial(self._run, op),
                waiting.watcher.wait,
                waiting.closed,
            )
        return None  # the transport closed meanwhile (see `Waiting`)

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        op, seconds = self._claim_of(worker_id, visibility, min_priority, wait)
        claimed = self._run(op)
        if claimed is None and seconds > 0:
            claimed = self._wait(op, seconds)
        if claimed is None:
            with self._lock:
                self._engine.idle()
            return None
        return claimed.lease(self._codec)

    def _join(self, conn: object) -> CallersConnection:
        if self._options.memory:  # no other connection can reach a private database
            raise core.cannot_join(self)
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(
                f"{self!r} joins the transaction of a sqlite3.Connection, not of "
                f"{type(conn).__module__}.{type(conn).__qualname__}"
            )
        self._engine.connection()  # refuses once closed
        joined = CallersConnection(self._options, conn)
        joined.check()
        return joined

    def close(self) -> None:
        # Waiting claims are nudged first: they hold the lock only between their looks.
        for watcher in tuple(self._engine.waiters):
            watcher.nudge()
        with self._lock:
            self._engine.close()


def run_migration(options: SqliteOptions, apply: bool) -> Migration:
    """The queue file's state and the DDL that brings it to `sql.SCHEMA_VERSION` (read
    on a read-only connection, so that a missing file is not created); if ``apply``,
    an open does it, as any handle's would, in one write transaction that checks the
    version again under the write lock."""
    if options.memory:
        raise TransportError(
            "sqlite:///:memory: is a new, empty database private to its connection: there "
            "is no schema to migrate; name a file instead"
        )
    version = _ops.EMPTY
    if os.path.exists(options.path):
        target = "file:" + pathname2url(os.path.abspath(options.path)) + "?mode=ro"
        with (
            sqlite_errors(options.path),
            contextlib.closing(sqlite3.connect(target, uri=True, isolation_level=None)) as conn,
        ):
            conn.execute(sql.BEGIN_READ)
            try:
                version = drive(
                    _ops.needs_setup(options.path), options.clock(), partial(_execute, conn)
                )
            finally:
                conn.execute(sql.ROLLBACK)
    if version == sql.SCHEMA_VERSION:
        return Migration("current", version, sql.SCHEMA_VERSION)
    if version == _ops.EMPTY:
        statements = (sql.NEW_FILE_PAGE_SIZE, *sql.SCHEMA)
    else:
        statements = sql.UPGRADES[version]
    if apply:
        SqliteTransport(replace(options, migrate="auto")).close()
    return Migration(
        "missing" if version == _ops.EMPTY else "old",
        None if version == _ops.EMPTY else version,
        sql.SCHEMA_VERSION,
        tuple(sql.script(statement) for statement in statements),
        apply,
    )


def migrate(url: str, *, apply: bool = True, **options: object) -> Migration:
    """Create the queue in the file at ``url`` when it has none, or upgrade an older
    schema (which opening does only with ``migrate="auto"``); with ``apply=False``, only
    read (a missing file is not created), and return the DDL that would run."""
    return run_migration(parse_url(url, options), apply)
