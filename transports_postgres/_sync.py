"""`PostgresTransport`: the operations of `_ops`, run by core's `drive` over a psycopg
`ConnectionPool`, one round trip per batch.

Each call borrows a pooled connection (autocommit: the operations write their own BEGIN
and COMMIT, so a batch and its transaction go in one pipelined round trip), so threads
sharing one transport run their calls in parallel. A blocked ``claim(wait=)`` follows
core's `wait_plan`, sleeping on a condition that a dedicated LISTEN connection's thread
signals.

``within(conn)`` runs the writing calls on a caller's `psycopg.Connection` instead, in
the caller's transaction, each in a savepoint of its own (see `_Joined`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from transports_core import Event, Lease, Migration, TransportError, Within
from transports_core import backend as core
from transports_core.backend import Operation, WaitState, drive

from . import _ops
from . import _sql as sql
from ._errors import Call, JoinedCall, postgres_errors, unreachable
from ._url import PostgresOptions, parse_url

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger("transports_postgres")
E = TypeVar("E")
TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
T = TypeVar("T")
C = TypeVar("C", psycopg.Cursor[Any], psycopg.AsyncCursor[Any])


class OneCursor(Generic[C]):
    """A pooled connection (of either twin) that keeps one cursor for the batches of one
    statement (most calls): a new cursor per statement costs about as much as reading its
    row."""

    _single: C | None = None

    def _new_cursor(self) -> C:
        raise NotImplementedError

    def single(self) -> C:
        cursor = self._single
        if cursor is None or cursor.closed:
            cursor = self._single = self._new_cursor()
        return cursor


class Conn(psycopg.Connection[Any], OneCursor[psycopg.Cursor[Any]]):
    def _new_cursor(self) -> psycopg.Cursor[Any]:
        return self.cursor()


# A blocked claim looks again at least this often (seconds), in case a notification was
# missed in the moment a waiter registers; with an injected clock, time moves without
# any event, so it looks often.
RECHECK = 1.0
RECHECK_INJECTED_CLOCK = 0.05
# How often the listener thread looks up from the socket to see whether to stop.
LISTEN_TICK = 0.5


def bind(stmt: _ops.Stmt) -> dict[str, Any]:
    """A statement's parameter values by name (both twins)."""
    return dict(zip(stmt.statement.names, stmt.params, strict=True))


def _first(cursor: psycopg.Cursor[Any]) -> int:
    row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def has_rows(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement ``cursor`` ran returns rows (both twins)."""
    # The status, not `description`, which builds a column object per column.
    result = cursor.pgresult
    return bool(result and result.status == TUPLES_OK)


def _result(cursor: psycopg.Cursor[Any]) -> _ops.Result:
    return _ops.Result(cursor.fetchall() if has_rows(cursor) else [], cursor.rowcount)


def run_batch(conn: Conn, schema: str, call: Call, batch: _ops.Batch) -> list[_ops.Result]:
    """Run ``batch`` in one round trip (pipelined when it has several statements); an
    empty one (a `publish_many` of nothing) needs none."""
    if len(batch) == 1:
        call.sent = True
        stmt = batch[0]
        return [_result(conn.single().execute(stmt.statement.render(schema), bind(stmt)))]
    if not batch:
        return []
    call.sent = True
    with conn.pipeline():
        cursors = [conn.execute(s.statement.render(schema), bind(s)) for s in batch]
    return [_result(cursor) for cursor in cursors]


def run_caller(
    conn: psycopg.Connection[Any], schema: str, call: Call, batch: _ops.Batch
) -> list[_ops.Result]:
    """`run_batch` on a caller's connection: cursors of our own, whatever its cursor and
    row factories (a client-side cursor cannot send binary arrays; rows must be tuples),
    under its own prepare_threshold."""
    if not batch:
        return []
    call.sent = True
    if len(batch) == 1:
        (stmt,) = batch
        cursor = psycopg.Cursor(conn, row_factory=tuple_row)
        return [_result(cursor.execute(stmt.statement.render(schema), bind(stmt)))]
    with conn.pipeline():
        cursors = [
            psycopg.Cursor(conn, row_factory=tuple_row).execute(s.statement.render(schema), bind(s))
            for s in batch
        ]
    return [_result(cursor) for cursor in cursors]


def own(op: Operation[_ops.Batch, list[_ops.Result], T]) -> _ops.Operation[T]:
    """``op`` as an operation of this backend's `_ops` (both twins): the only kind their
    `Operations` build, the base classes' methods included."""
    if isinstance(op, _ops.Operation):
        return op
    raise TypeError(f"not a PostgreSQL operation: {op!r}")


def in_transaction(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether a call that failed left a transaction open on ``conn`` (both twins): its
    runner then rolls back before the pool has the connection again."""
    return conn.info.transaction_status != TransactionStatus.IDLE and not conn.closed


# Connections the server has said goodbye to (a FATAL message while idle, as a
# termination or a shutdown sends just before it closes the socket).
DOOMED: weakref.WeakSet[psycopg.BaseConnection[Any]] = weakref.WeakSet()


def _on_notice(
    ref: weakref.ref[psycopg.BaseConnection[Any]], diag: psycopg.errors.Diagnostic
) -> None:
    conn = ref()
    if conn is not None and diag.severity_nonlocalized in ("FATAL", "PANIC"):
        DOOMED.add(conn)


def note_goodbye(conn: psycopg.BaseConnection[Any]) -> None:
    """Called on every new pooled connection: note the server's goodbye when it comes."""
    conn.add_notice_handler(functools.partial(_on_notice, weakref.ref(conn)))


def configure(conn: Conn) -> None:
    note_goodbye(conn)


def check_alive(conn: psycopg.BaseConnection[Any]) -> None:
    """The pools' check on lending a connection (both twins'), without a round trip and
    without blocking: read whatever the server sent while it sat idle (a termination,
    say), so that a dead connection is replaced before a call is sent down it, not after."""
    pgconn = conn.pgconn
    if pgconn.status == ConnStatus.OK:
        # The first read takes the server's goodbye (an error message), the second sees
        # the closed socket: only then is the connection known to be dead.
        pgconn.consume_input()
        pgconn.is_busy()
        pgconn.consume_input()
    if pgconn.status != ConnStatus.OK or conn.closed or conn in DOOMED:
        raise psycopg.OperationalError("the connection was closed while idle")


# Seconds a first connection (on opening, or to see whether the server is back) may take
# unless the URL's connect_timeout says otherwise: a host that does not answer fails in
# this time, not in the pool's.
FIRST_CONNECT_TIMEOUT = 4


def first_connect(options: PostgresOptions) -> dict[str, Any]:
    """The first connection's arguments: libpq waits forever for a host that does not
    answer unless told otherwise, so it gets a short timeout unless the URL sets one."""
    if "connect_timeout" in conninfo_to_dict(options.conninfo):
        return {}
    return {"connect_timeout": max(1, min(FIRST_CONNECT_TIMEOUT, round(options.pool_timeout)))}


class Pool(ConnectionPool[Conn]):
    """psycopg's pool, checking each connection it lends (`check_alive`) in a way that
    survives a server restart: psycopg's own ``check`` backs off (1, 2, 4... s) after each
    dead connection, so a pool holding several waited seconds, or timed out, with the
    server up. The first dead one found here asks the server directly (one connection,
    `first_connect`'s short timeout): if it does not answer, the call fails at once with
    libpq's reason; if it does, every idle connection is dropped, and the pool opens new
    ones at once (all the idle ones are as old as the dead one)."""

    def __init__(self, options: PostgresOptions) -> None:
        self._options = options
        super().__init__(
            options.conninfo, connection_class=Conn, configure=configure, **pool_arguments(options)
        )

    def getconn(self, timeout: float | None = None) -> Conn:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            conn = super().getconn(max(0.0, deadline - time.monotonic()))
            try:
                check_alive(conn)
            except psycopg.OperationalError:
                self.putconn(conn)
                options = self._options
                # Raises libpq's reason when the server is down.
                psycopg.connect(options.conninfo, **first_connect(options)).close()
                self.drain()
                continue
            return conn


def pool_arguments(options: PostgresOptions) -> dict[str, Any]:
    """What both twins' pools are built with, but the connection class and callbacks:
    autocommit, since the operations write their own BEGIN (or none: see `_ops`)."""
    return {
        "min_size": options.pool_min_size,
        "max_size": options.pool_max_size,
        "timeout": options.pool_timeout,
        "kwargs": {"autocommit": True, "prepare_threshold": options.prepare_threshold},
        "open": False,
        "num_workers": 1,
        "name": f"transports-{options.schema}",
    }


def check_joinable(conn: psycopg.BaseConnection[Any], where: str, name: str) -> None:
    """Refuse a caller's connection (either twin's) whose statements would not run in an
    open transaction of the caller's: closed, in autocommit with no transaction open
    (each statement would commit at once), failed, or busy. Idle without autocommit is
    fine: psycopg begins the transaction with the first statement, ours or the caller's."""
    if conn.closed:
        raise ValueError(f"{where}: {name}: the connection is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS or (
        status == TransactionStatus.IDLE and not conn.autocommit
    ):
        return
    if status == TransactionStatus.IDLE:
        raise ValueError(
            f"{where}: {name}: the connection is in autocommit mode with no "
            "transaction open, so each statement would commit at once; open one first "
            "(with conn.transaction(): ...)"
        )
    if status == TransactionStatus.INERROR:
        raise ValueError(f"{where}: {name}: the connection's transaction has failed; roll it back")
    raise ValueError(f"{where}: {name}: the connection is busy ({status.name})")


def not_this_store(where: str, schema: str, ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> str:
    """Why a caller's connection (``theirs``, `_ops.Identity`) is not one to this
    transport's queue (``ours``), or '' if it is."""
    if theirs == ours:
        return ""
    if theirs[0] != ours[0] or theirs[1] != ours[1]:
        return (
            f"{where}: within: the connection is to database {theirs[0]!r} of a server "
            f"started at {theirs[1]}, not to this transport's database {ours[0]!r} of "
            f"the server started at {ours[1]}"
        )
    return f"{where}: within: the connection's database has no queue in schema {schema!r}"


class Listening:
    """What both twins' wakers hold and do alike around their LISTEN connection: its
    statements, the end of a listener, the pid a claim registers under (or why there is
    none), whether it is closed and how many claims wait on it."""

    def __init__(self, options: PostgresOptions) -> None:
        self._options = options
        self._error: BaseException | None = None
        self.pid: int | None = None
        # Moves on every wake-up: a blocked claim's `WaitState.version`.
        self.generation = 0
        self.closed = False
        self._waiting = 0
        # Whether notifications cannot reach the listener (see `_heard`).
        self.deaf = False
        self._warned = False

    def _bump(self) -> None:
        raise NotImplementedError

    def _listen_statement(self) -> str:
        return f"LISTEN {sql.quote_ident(self._options.schema)}"

    # The server process behind a connection: through a pooler, not the pid the
    # connection was told at startup (PgBouncer makes that one up).
    BACKEND_PID = "SELECT pg_backend_pid()"

    def _target(self) -> tuple[str, dict[str, Any]]:
        """Where the LISTEN connection goes (``listen_url``, else the main URL), and how:
        it never prepares, so it works through any pooler."""
        options = self._options
        return options.listen_url or options.conninfo, {
            "autocommit": True,
            "prepare_threshold": None,
        }

    def _heard(self, pid: int, other: int) -> None:
        """``pid`` (the listener's server process) was seen through a pooler, and a second
        connection then got server process ``other``: the same one means the pooler lent
        the listener's server connection away between transactions (transaction mode),
        where notifications do not reach the listener. Blocked claims then only look
        again every recheck; say so once."""
        self.deaf = other == pid
        if self.deaf and not self._warned:
            self._warned = True
            logger.warning(
                "%s: the LISTEN connection goes through a pooler in transaction mode, "
                "where notifications never reach it: a blocked claim looks again every "
                "%.1f s instead of waking when a message comes; add listen_url=<a URL "
                "straight to the server> to wake it at once",
                self._options.display,
                RECHECK,
            )

    def _goodbye(self, pid: int) -> tuple[str, dict[str, Any]]:
        """The statement, and its values, that unregisters the listener ``pid``."""
        return sql.UNREGISTER_WAITER.render(self._options.schema), {"pid": pid}

    def _stopped(self, ready: threading.Event | asyncio.Event) -> None:
        """The listener has ended: wake whoever waits to see it start or to be woken."""
        self.pid = None
        ready.set()
        self._bump()

    def _started(self) -> int:
        """The listener's pid, or the error that kept it from listening."""
        pid = self.pid
        if pid is None:
            with postgres_errors(self._options.display, Call("claim", writes=False)):
                if self._error is not None:
                    raise self._error
            raise TransportError(f"{self._options.display}: claim: cannot LISTEN for wake-ups")
        return pid


class _Waker(Listening):
    """The LISTEN connection and its thread, and the condition blocked claims sleep on."""

    def __init__(self, options: PostgresOptions) -> None:
        super().__init__(options)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._count = threading.Lock()

    def _bump(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def _listen(self, ready: threading.Event) -> None:
        conn: psycopg.Connection[Any] | None = None
        pid = 0
        try:
            target, how = self._target()
            conn = psycopg.connect(target, **how)
            conn.execute(self._listen_statement())
            pid = _first(conn.execute(self.BACKEND_PID))
            if pid != conn.info.backend_pid:
                with psycopg.connect(target, **how) as other:
                    self._heard(pid, _first(other.execute(self.BACKEND_PID)))
            self.pid = pid
            ready.set()
            while not self.closed:
                for _ in conn.notifies(timeout=LISTEN_TICK):
                    self._bump()
        except BaseException as exc:
            self._error = exc
        finally:
            self._stopped(ready)
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(*self._goodbye(pid))
                conn.close()

    def _start(self) -> int:
        thread = self._thread
        if thread is None or not thread.is_alive() or self.pid is None:
            ready = threading.Event()
            self._error = None
            thread = threading.Thread(
                target=self._listen, args=(ready,), name="transports-postgres-listen", daemon=True
            )
            self._thread = thread
            thread.start()
            ready.wait(self._options.pool_timeout)
        return self._started()

    @contextlib.contextmanager
    def waiting(self, run: Callable[[_ops.Waiter], None]) -> Iterator[None]:
        """Listen, and register as waiting while the block runs."""
        with self._count:
            pid = self._start()
            if self._waiting == 0 and not self.deaf:
                run(_ops.Waiter(pid, True))
            self._waiting += 1
        try:
            yield
        finally:
            with self._count:
                self._waiting -= 1
                if self._waiting == 0 and not self.closed and not self.deaf:
                    with contextlib.suppress(TransportError):
                        run(_ops.Waiter(pid, False))

    def wait(self, seen: int, timeout: float) -> bool:
        """Sleep up to ``timeout`` s unless woken since generation ``seen``; whether woken."""
        with self._cond:
            if self.generation == seen and not self.closed:
                self._cond.wait(timeout)
            return self.generation != seen

    def close(self) -> None:
        self.closed = True
        self._bump()
        # Not yet started (a claim is starting it right now): it sees `closed` and ends.
        thread = self._thread
        if thread is None or thread.ident is None or thread is threading.current_thread():
            return
        thread.join(LISTEN_TICK * 4)


class Configured(Generic[E]):
    """What both twins take from their options, by the same names."""

    _codec: core.EventCodec[E]
    _on_dead: str

    def _configure(self, options: PostgresOptions, event_type: object) -> None:
        self._options = options
        self._schema = options.schema
        self._where = f"{options.display} (schema {options.schema})"
        self._schema_policy = _ops.Opening(options.schema, options.migrate, options.display)
        self._codec = core.EventCodec(event_type)
        self._on_dead = options.on_dead
        self._operations = _ops.Operations(
            options.max_attempts,
            options.on_dead,
            options.lease_synchronous_commit,
        )
        self._dedup_window = options.dedup_window
        # Within a caller's transaction, no operation may change its synchronous_commit.
        self._joined_ops = (
            self._operations
            if options.lease_synchronous_commit is None
            else _ops.Operations(options.max_attempts, options.on_dead, None)
        )
        self._store: tuple[Any, ...] | None = None
        self._clock = options.clock
        self._closed = False
        self._recheck = RECHECK if options.server_clock else RECHECK_INJECTED_CLOCK

    def _claim_op(self, worker_id: str, visibility: float, min_priority: int) -> _ops.Claim:
        return self._operations.claim(worker_id, visibility, min_priority)

    def _plan(self, wait: float) -> Generator[core.WaitStep, object, None]:
        """The plan of a blocked claim: it claims again when woken by a notification, at
        the end of the next lease or park, and looks again after `_recheck` seconds."""
        return core.wait_plan(wait, self._due_clock, time.monotonic, recheck=self._recheck)

    def _due_clock(self) -> float:
        # The end of a lease is read as seconds from the look (`_ops.NextDue`), and timed
        # on this host's monotonic clock; an injected clock moves only when a test says.
        now = self._clock()
        return time.monotonic() if now is None else now

    def _looked(self, generation: int, look: tuple[float | None, bool]) -> WaitState:
        """What a blocked claim's look saw (see `_ops.NextDue`): the wake-ups so far, a
        group ready for it, and when the next lease or park ends."""
        due, ready = look
        # A ready group is worth a try whatever else the look saw: a version never seen.
        version = (generation, object() if ready else None)
        return WaitState(version, None if due is None else self._due_clock() + due)


class PostgresTransport(Configured[E], core.TransportBase[E]):
    """A durable transport in one PostgreSQL schema, over a psycopg connection pool."""

    def __init__(self, options: PostgresOptions, event_type: object = Event) -> None:
        self._configure(options, event_type)
        self._ops = self._operations
        # One plain connection first: a server that is down fails here at once, with
        # libpq's reason, rather than after pool_timeout of the pool's retries and logs.
        try:
            psycopg.connect(options.conninfo, **first_connect(options)).close()
        except psycopg.OperationalError as exc:
            raise unreachable(self._where, exc) from exc
        self._pool = Pool(options)
        self._waker = _Waker(options)
        call = Call("open", writes=False)
        try:
            with postgres_errors(self._where, call):
                self._pool.open(wait=True, timeout=options.pool_timeout)
            self._run(_ops.Setup(self._schema_policy))
        except BaseException:
            self._pool.close()
            raise

    def _run(self, op: Operation[_ops.Batch, list[_ops.Result], T]) -> T:
        if self._closed:
            raise TransportError(f"{self!r} is closed")
        mine = own(op)
        call = Call(mine.call, mine.writes)
        with postgres_errors(self._where, call), self._pool.connection() as conn:
            execute = functools.partial(run_batch, conn, self._schema, call)
            try:
                return drive(mine, self._clock(), execute)
            except BaseException:
                if in_transaction(conn):
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise

    def within(self, conn: object) -> Within[E]:
        return Within(
            self._joined_ops, self._codec, self._on_dead, self._dedup_window, self._join(conn)
        )

    def _join(self, conn: object) -> _Joined:
        if not isinstance(conn, psycopg.Connection):
            twin = (
                " (the async twin takes those)" if isinstance(conn, psycopg.AsyncConnection) else ""
            )
            raise TypeError(
                f"{self._where}: within needs a psycopg.Connection, not {type(conn).__name__}{twin}"
            )
        check_joinable(conn, self._where, "within")
        return _Joined(self, conn)

    def _check_store(self, theirs: tuple[Any, ...]) -> None:
        """Refuse a caller's connection that is not to this queue's database (its
        identity, ``theirs``, is compared to ours, read again once after a restart)."""
        for fresh in (False, True):
            if self._store is None or fresh:
                self._store = self._run(_ops.Identity(self._schema))
            why = not_this_store(self._where, self._schema, self._store, theirs)
            if not why:
                return
        raise ValueError(why)

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        op = self._operations.claim(worker_id, visibility, min_priority)
        wait = core.check_wait(wait)
        claimed = self._run(op)
        if claimed is None and wait > 0:
            claimed = self._wait(op, wait)
        return None if claimed is None else claimed.lease(self._codec)

    def _wait(self, op: _ops.Claim, wait: float) -> core.Claimed | None:
        waker = self._waker
        seen = waker.generation

        def look() -> WaitState:
            nonlocal seen
            seen = waker.generation
            return self._looked(seen, self._run(_ops.NextDue(op.min_priority)))

        try:
            with waker.waiting(self._run):
                return core.wait_for(
                    self._plan(wait),
                    look,
                    lambda: self._run(op),
                    lambda timeout: waker.wait(seen, timeout),
                    lambda: waker.closed,
                )
        except TransportError:
            if self._closed:  # closed from another thread while this claim was blocked
                return None
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._waker.close()
        self._pool.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._where}>"


class _Joined:
    """`within`'s runner on a caller's `psycopg.Connection`: each operation as
    `_ops.Joined` (its statements in a savepoint of its own, inside the caller's
    transaction, released when it succeeds), rolled back to the savepoint when it fails.
    Its first operation checks first that the connection reaches this queue's database.
    The async twin's runner is the same around the same sans-I/O body."""

    __slots__ = ("_checked", "_conn", "_transport")

    def __init__(self, transport: PostgresTransport[Any], conn: psycopg.Connection[Any]) -> None:
        self._transport, self._conn, self._checked = transport, conn, False

    def __call__(self, op: Operation[_ops.Batch, list[_ops.Result], T]) -> T:
        transport, conn = self._transport, self._conn
        schema = transport._schema
        mine = own(op)
        check_joinable(conn, transport._where, f"{mine.call} within")
        call = JoinedCall(mine.call, writes=False)
        execute = functools.partial(run_caller, conn, schema, call)
        with postgres_errors(transport._where, call):
            if not self._checked:
                transport._check_store(drive(_ops.Identity(schema), None, execute))
                self._checked = True
            joined = _ops.Joined(mine)
            try:
                return drive(joined, transport._clock(), execute)
            except BaseException:
                if joined.opened and not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        execute(_ops.UNDO)
                raise


def run_migration(options: PostgresOptions, apply: bool) -> Migration:
    """`_ops.Migrate` on one connection of its own (no pool, no listener): the schema's
    state and its DDL, each statement with its values written in as SQL literals by
    psycopg's client-side binding (`ClientCursor.mogrify`), run too if ``apply``."""
    where = f"{options.display} (schema {options.schema})"
    try:
        conn = psycopg.connect(options.conninfo, autocommit=True, **first_connect(options))
    except psycopg.OperationalError as exc:
        raise unreachable(where, exc) from exc
    call = Call("migrate", writes=apply)
    with conn, postgres_errors(where, call):
        execute = functools.partial(run_caller, conn, options.schema, call)
        found, version, batch = drive(_ops.Migrate(options.schema, apply), None, execute)
        literal = psycopg.ClientCursor(conn)
        statements = tuple(
            literal.mogrify(stmt.statement.render(options.schema), bind(stmt)) for stmt in batch
        )
    return Migration(found, version, sql.SCHEMA_VERSION, statements, apply and bool(batch))


def migrate(url: str, *, apply: bool = True, **options: object) -> Migration:
    """Create the queue's schema at ``url`` when missing, or upgrade it when at the
    version before this code's (``transports migrate``); with ``apply=False``, only read,
    and return the DDL that would run, for a DBA to review."""
    return run_migration(parse_url(url, options), apply)
