"""`RedisTransport`: the operations of `_ops` run over redis-py, and `Handle`, what both
twins hold and decide alike.

Each call sends one FCALL (one EVALSHA where the server refused the library of
functions: see `RedisTransport._execute`) on a connection of its own and reads the
reply, so threads share a transport and their calls run side by side on the server. The
connection is one that an earlier call of this handle left idle, else one from the
thread-safe pool, whose checkout costs several times more. One idle for longer than
`FRESH` is first checked as the pool would check it (the server has not closed it, no
stray reply waits on it). An error reply goes to `_errors.recover`, which the runner
drives: its steps are the only thing the twins do differently (one blocks, the other
awaits). Core's drivers run the operations, and core's `wait_plan` a claim that waits,
which sleeps in BLPOP on its floor's wake-up list and on this handle's close key. The
pools are built with retries off: a script is never sent twice behind the caller's back.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable
from functools import partial
from typing import Any, TypeVar

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry

from transports_core import Event, Lease, Message, TransportError
from transports_core import backend as core
from transports_core.backend import Claimed, EventCodec, drive

from . import _ops as ops
from ._errors import (
    FIRST_LOOK,
    LONGEST_LOOK,
    REPLIES,
    Exchange,
    FunctionsRefused,
    Node,
    NotReplicated,
    Recover,
    Reply,
    Unreachable,
    connecting,
    error_code,
    redis_errors,
    wakeup,
)
from ._scripts import Library, Script
from ._topology import Locator
from ._url import RedisOptions

E = TypeVar("E")
T = TypeVar("T")

# How long a waiting claim blocks at most before it looks again when time comes from an
# injected clock, which the server cannot wait on.
CLOCK_RECHECK = 0.02
# The close key lives only long enough for a claim about to block to see it.
CLOSE_KEY_MS = 5000
# A connection idle for less than this many seconds is used without checking that the
# server has not closed it. The server closes idle clients only after whole seconds (its
# `timeout`); a restart or kill in that window fails the call as it would fail one under
# way, and the next call reconnects. The check is a system call, which lets the other
# threads take the interpreter lock: at every call, with many threads, they queue for it.
FRESH = 0.05


def pool_kwargs(options: RedisOptions, retry: Any = Retry) -> dict[str, Any]:
    """What both twins build their pools with (``retry``: the twin's own Retry class)."""
    kwargs: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.connect_timeout,
        # No retries: a re-sent publish would be stored twice, a re-sent ack would fail.
        "retry": retry(NoBackoff(), 0),
        "retry_on_error": [],
        "health_check_interval": 0,
        **options.tls,
    }
    if options.db is not None:
        kwargs["db"] = options.db
    return kwargs


def maxmemory_refusal(options: RedisOptions, info: str) -> str | None:
    """The complaint about a server whose maxmemory-policy may evict queue keys, if any.

    ``volatile-*`` policies evict only keys that have a TTL, and no key that holds a
    queue's state has one (only a closing handle's wake-up key does, whose loss delays
    its waiting claims by at most half the socket timeout): under memory pressure such
    a server refuses writes, as ``noeviction`` does. ``allkeys-*`` may evict any key."""
    policy = "unknown"
    for line in info.splitlines():
        if line.startswith("maxmemory_policy:"):
            policy = line.partition(":")[2].strip()
    if policy == "noeviction" or policy.startswith("volatile-"):
        return None
    return (
        f"{options.redacted}: maxmemory-policy is {policy!r}: the server may evict any of "
        "the queue's keys, which loses messages and can corrupt the queue (a seq handed "
        "out twice, a group cut off); set maxmemory-policy noeviction"
    )


class Handle:
    """What a handle of either twin holds, and every decision they share: which op a
    claim runs, how a call is packed, where it goes, what an error reply leads to. The
    twins add the driver calls: connecting, sending, reading, sleeping."""

    _options: RedisOptions
    _ops: core.Operations = ops
    _on_dead: str
    _pools: dict[Node, Any]

    def _setup(self, options: RedisOptions, event_type: object, pool: Any) -> None:
        self._options = options
        self._codec: EventCodec[Any] = EventCodec(event_type)
        self._on_dead = options.on_dead
        self._packer = ops.Packer(options.queue)
        self._dedup_window = options.dedup_window
        self._close_key = ops.close_key(options.queue, uuid.uuid4().hex)
        self._closed = False
        self._waiting = 0
        self._lock = threading.Lock()
        self._claim_op = core.ReuseLast(self._new_claim)
        kwargs = pool.connection_kwargs
        # A unix socket is never redirected: its path stands in for the address.
        self._home: Node = (kwargs.get("host") or kwargs.get("path", ""), kwargs.get("port", 0))
        self._pools = {self._home: pool}
        # Per node, the connections its pool lent that no call is using, newest last,
        # each with the moment it went idle.
        self._idle: dict[Node, list[tuple[Any, float]]] = {self._home: []}
        self._pid = os.getpid()
        # Until the handle's first call has run `_ops.Upgrade` (at a call, not at open: a
        # server still loading its data set answers INFO, not scripts, and its wait is
        # the call's). Threads that race to it each run it: it is harmless twice.
        self._current = False
        n = options.wait_replicas
        self._wait_call = ops.command("WAIT", n, int(options.wait_timeout * 1000)) if n else None

    @property
    def _pool(self) -> Any:
        return self._pools[self._home]

    def _pool_at(self, node: Node) -> Any:
        """The pool of cluster node ``node``, made alike the first one's on first use."""
        pool = self._pools.get(node)
        if pool is None:
            first = next(iter(self._pools.values()))
            kwargs = {**first.connection_kwargs, "host": node[0], "port": node[1]}
            with self._lock:
                self._idle.setdefault(node, [])
                pool = self._pools.setdefault(
                    node, type(first)(connection_class=first.connection_class, **kwargs)
                )
        return pool

    def _reusable(self, node: Node) -> tuple[Any, bool] | None:
        """A connection to ``node`` that an earlier call left idle, and whether it has
        been idle long enough to be checked before use (see `FRESH`); or None."""
        if self._pid != os.getpid():  # forked: those are the parent's, left alone
            self._pid = os.getpid()
            self._idle = {known: [] for known in self._idle}
        try:
            conn, since = self._idle[node].pop()
        except IndexError:
            return None
        return conn, time.monotonic() - since >= FRESH

    def _keep(self, node: Node, conn: Any) -> bool:
        """Keep ``conn``, whose call went through, for the next call to ``node``; False if
        the handle is closed (the caller drops it)."""
        if self._closed:
            return False
        idle = self._idle[node]
        entry = (conn, time.monotonic())
        idle.append(entry)
        if self._is_closed():  # close() may have emptied the list before this joined it
            with contextlib.suppress(ValueError):
                idle.remove(entry)
                return False
        return True

    def _drop_idle(self) -> list[tuple[Node, Any]]:
        """Empty the idle lists (the handle is closing): what they held, for disconnecting."""
        dropped = []
        for node, idle in list(self._idle.items()):
            while idle:
                with contextlib.suppress(IndexError):  # another thread took it meanwhile
                    dropped.append((node, idle.pop()[0]))
        return dropped

    def _follow(self, node: Node) -> None:
        """MOVED: the queue's slot is served by ``node`` from now on (the old node's pool
        stays, for an ASK back to it while a migration runs)."""
        self._pool_at(node)
        self._home = node

    def _recover(
        self, reply: Reply, call: bytes, source: Script | Library | None, name: str
    ) -> Recover:
        opts = self._options
        return Recover(
            reply, call, source, self._home, self._follow, opts.redacted, name, opts.socket_timeout
        )

    def _relocation(self, failure: object, step: Exchange, waited: float) -> bool:
        """Whether a call whose ``step`` met ``failure`` (`Unreachable`, or its reply),
        having waited ``waited`` seconds for it so far, looks for the queue's node again
        and is sent there: with a cluster or Sentinel URL, when nothing was sent (the
        node is down) or nothing ran (READONLY: a primary turned replica), within
        ``socket_timeout``."""
        if self._options.topology == "server" or step.node is not None:
            return False
        if isinstance(failure, REPLIES) and error_code(failure)[0] != "READONLY":
            return False
        return waited < self._options.socket_timeout

    def _replicated(self, name: str, reply: object, replicated: object) -> None:
        """Raise if ``reply``, a write's, reached fewer replicas than asked for."""
        wanted = self._options.wait_replicas
        if isinstance(reply, REPLIES) or (isinstance(replicated, int) and replicated >= wanted):
            return  # an error reply: the call's own error tells what happened
        server = self._options.redacted
        if isinstance(replicated, int):
            why = (
                f"{replicated} of the {wanted} replicas asked for (wait_replicas) had it "
                f"after {self._options.wait_timeout:g} s; a failover may lose it"
            )
        else:
            why = f"WAIT failed ({replicated}); a failover may lose it"
        raise NotReplicated(name, f"{server}: {why}")

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise TransportError(f"{self!r} is closed")

    def _check_server(self, info: object) -> None:
        refusal = maxmemory_refusal(self._options, str(info))
        if refusal is not None:
            raise TransportError(refusal)

    def _seeds_a_cluster(self, info: object) -> bool:
        """Whether this handle, opened with a plain URL, reached a cluster node (``INFO
        cluster`` says ``cluster_enabled:1``): it then takes that node as its seed, as a
        ``redis+cluster://`` URL would, so that it follows the queue's slot through
        failovers instead of waiting for the node it first reached."""
        if self._options.topology != "server" or "cluster_enabled:1" not in str(info):
            return False
        self._options = self._options.as_cluster_seed()
        return True

    def _new_claim(self, worker_id: str, visibility: float, min_priority: int) -> ops.Claim:
        opts = self._options
        return ops.Claim(worker_id, visibility, min_priority, opts.max_attempts, opts.on_dead)

    def _now(self) -> float | None:
        """The ``now`` core passes the operations: the injected clock's, or None."""
        clock = self._options.clock
        return None if clock is None else clock()

    def _wait_clock(self) -> Callable[[], float]:
        """The clock of a waiting claim's plan: the injected one (a lease ends when it
        says so), else the monotonic clock, on which the server's deadlines are placed."""
        return self._options.clock or time.monotonic

    def _waiter(
        self, op: ops.Claim, idle: ops.Idle, wait: float
    ) -> tuple[Generator[core.WaitStep, object, None], ops.Waiter]:
        """Core's plan for a claim that waits ``wait`` seconds, whose first try found
        ``idle``, and the `_ops.Waiter` that looks, claims and wakes for it. The plan
        looks again at least every ``recheck`` seconds, at most half the socket timeout,
        so that a BLPOP is always read within it."""
        opts = self._options
        recheck = CLOCK_RECHECK if opts.clock is not None else opts.socket_timeout / 2
        clock = self._wait_clock()
        plan = core.wait_plan(wait, clock, time.monotonic, recheck=recheck)
        return plan, ops.Waiter(op, idle, clock(), recheck)

    def _blpop(self, waiter: ops.Waiter, timeout: float) -> tuple[Exchange, float]:
        """The BLPOP a waiting claim sleeps in for the plan's ``timeout``, and how long
        to read its reply."""
        timeout = waiter.timeout(timeout, self._wait_clock()())
        wake = ops.wake_key(self._options.queue, waiter.floor)
        blpop = ops.command("BLPOP", wake, self._close_key, f"{timeout:.6f}")
        return Exchange([blpop]), timeout + self._options.socket_timeout

    def _woke(self, waiter: ops.Waiter, reply: object, timeout: float) -> bool:
        woke = wakeup(reply, self._options.redacted, self._close_key)
        return waiter.woke(woke, timeout)

    def _is_closed(self) -> bool:
        # A method, not a field: another thread or task may close while a claim waits.
        return self._closed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._options.redacted} queue={self._options.queue!r}>"


class RedisTransport(Handle, core.TransportBase[E]):
    """A durable transport on a Redis server (or one cluster node's slot), over redis-py."""

    def __init__(self, options: RedisOptions, event_type: object = Event) -> None:
        self._locator = None if options.topology == "server" else Locator(options)
        try:
            server = options.server
            if self._locator is not None:
                server = options.node_url(self._locator.locate())
            pool = redis.ConnectionPool.from_url(server, **pool_kwargs(options))
        except BaseException:
            if self._locator is not None:
                self._locator.close()
            raise
        self._setup(options, event_type, pool)
        try:
            self._check_server(self._command("INFO", "memory"))
            if self._locator is None and self._seeds_a_cluster(self._command("INFO", "cluster")):
                self._locator = Locator(self._options)
                self._follow(self._locator.locate())
        except BaseException:
            pool.disconnect()
            if self._locator is not None:
                self._locator.close()
            raise

    # -- the runner ------------------------------------------------------------------

    def _exchange(self, step: Exchange, writes: bool, name: str, timeout: float = 0) -> Any:
        """Send ``step``'s commands (and a write's WAIT, with ``wait_replicas``); the last
        reply (an error reply as its exception)."""
        if step.pause:
            time.sleep(step.pause)
        node = self._home if step.node is None else step.node
        pool = self._pool_at(node)
        server = self._options.redacted
        with connecting(server):
            conn = self._connection(node, pool)
        wait = self._wait_call if writes else None
        replicated: object = None
        went_through = False
        try:
            with redis_errors(server, name, writes):
                try:
                    conn.send_packed_command(
                        step.commands if wait is None else [*step.commands, wait]
                    )
                    for _ in step.commands[1:]:  # ASKING's: the call's own reply tells
                        with contextlib.suppress(rex.ResponseError):
                            conn.read_response()
                    reply = conn.read_response(timeout=timeout) if timeout else conn.read_response()
                except REPLIES as error:  # an error reply is the call's reply
                    reply = error
                if wait is not None:
                    try:
                        replicated = conn.read_response()
                    except REPLIES as error:  # WAIT on what has become a replica
                        replicated = error
            went_through = True
        except BaseException:
            conn.disconnect()
            raise
        finally:
            if not (went_through and self._keep(node, conn)):
                pool.release(conn)
                if self._closed:  # closed while this call ran: its connection goes too
                    conn.disconnect()
        if wait is not None:
            self._replicated(name, reply, replicated)
        return reply

    def _reach(self, step: Exchange, writes: bool, name: str, timeout: float = 0) -> Any:
        """`_exchange`, but after a failover (see `_relocation`) the call goes to the
        queue's node once it is found again."""
        waited, pause = 0.0, FIRST_LOOK
        while True:
            try:
                reply = self._exchange(step, writes, name, timeout)
            except Unreachable as exc:
                if not self._relocation(exc, step, waited):
                    raise
            else:
                if not (isinstance(reply, REPLIES) and self._relocation(reply, step, waited)):
                    return reply
            time.sleep(pause)
            waited, pause = waited + pause, min(pause * 2, LONGEST_LOOK)
            assert self._locator is not None  # `_relocation` said so
            with contextlib.suppress(TransportError):  # no node yet: look again later
                self._follow(self._locator.locate())

    def _connection(self, node: Node, pool: Any) -> Any:
        """A connection to ``node`` ready to send: an idle one of this handle's, or the
        pool's (which connects it)."""
        reusable = self._reusable(node)
        if reusable is None:
            return pool.get_connection()
        conn, check = reusable
        if not check:
            return conn
        try:
            try:
                # What the pool checks: data waiting means a reply nobody read, or that
                # the server closed the connection meanwhile (idle timeout, a restart).
                stale = conn.can_read()
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                stale = True
            if stale:
                conn.disconnect()
                conn.connect()
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return conn

    def _send(
        self,
        call: bytes,
        source: Script | Library | None,
        writes: bool,
        name: str,
        timeout: float = 0,
    ) -> Any:
        reply = self._reach(Exchange([call]), writes, name, timeout)
        if isinstance(reply, REPLIES):
            io = partial(self._exchange, writes=writes, name=name, timeout=timeout)
            reply = drive(self._recover(reply, call, source, name), None, io)
        return reply

    def _execute(self, call: ops.ScriptCall) -> Any:
        """Send one step of an operation: its script, as one FCALL (or EVALSHA)."""
        script, args = call
        packer = self._packer
        try:
            return self._send(
                packer.call(script, args), packer.loader(script), script.writes, script.name
            )
        except FunctionsRefused:
            packer.functions = False  # this server will not have the library: EVALSHA
            return self._send(packer.call(script, args), script, script.writes, script.name)

    def _command(self, *args: Any, writes: bool = False) -> Any:
        return self._send(ops.command(*args), None, writes, str(args[0]).lower())

    def _run(self, op: core.Operation[ops.ScriptCall, Any, T]) -> T:
        self._refuse_if_closed()
        if not self._current:
            drive(ops.Upgrade(), self._now(), self._execute)
            self._current = True
        return drive(op, self._now(), self._execute)

    def _wait(self, op: ops.Claim, idle: ops.Idle, wait: float) -> Claimed | None:
        """The rest of a claim that waits, after its first try found ``idle``: core's
        plan, claiming again when woken; None once it ends or the handle is closed."""
        with self._lock:
            if self._closed:
                return None
            self._waiting += 1
        plan, waiter = self._waiter(op, idle, wait)
        try:
            return core.wait_for(
                plan,
                waiter.look,
                partial(self._claim_again, waiter),
                partial(self._sleep, waiter),
                self._is_closed,
            )
        except Exception:
            # close() shuts the socket under a blocked read, and redis-py may then fail
            # with any error (a closed file, say), or the claim after it is refused:
            # once closed, that is the wake-up.
            if not self._is_closed():
                raise
            return None
        finally:
            with self._lock:
                self._waiting -= 1

    def _claim_again(self, waiter: ops.Waiter) -> Claimed | None:
        op = waiter.claim()
        if op is None:
            return None
        got = self._run(op)
        return waiter.found(got, self._wait_clock()())

    def _sleep(self, waiter: ops.Waiter, timeout: float) -> bool:
        blpop, read_timeout = self._blpop(waiter, timeout)
        return self._woke(waiter, self._exchange(blpop, False, "blpop", read_timeout), timeout)

    # -- the contract ----------------------------------------------------------------

    def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]:
        # The base's, but an empty batch sends no script at all.
        op = ops.PublishMany(self._codec, items, self._options.dedup_window)
        return self._run(op) if op.count else []

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        wait = core.check_wait(wait)
        op = self._claim_op(worker_id, visibility, min_priority)
        got = self._run(op)
        if isinstance(got, ops.Idle):
            if wait <= 0:
                return None
            claimed = self._wait(op, got, wait)
            return None if claimed is None else claimed.lease(self._codec)
        return got.lease(self._codec)

    def check(self) -> list[str]:
        """The broken invariants of the queue's structures (empty: sound); read-only."""
        return self._run(ops.Check())

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = self._waiting
        if waiting:
            # Wake this handle's blocked claims, a token each; they see `_closed` and
            # return None.
            try:
                self._command("RPUSH", self._close_key, *["1"] * waiting, writes=True)
                self._command("PEXPIRE", self._close_key, CLOSE_KEY_MS, writes=True)
            except TransportError:
                pass
        # Calls in flight finish on their connections (a blocked claim was woken above)
        # and drop them as they end: shutting a socket under a call would leave its outcome
        # unknown.
        for node, conn in self._drop_idle():
            conn.disconnect()
            self._pools[node].release(conn)
        for pool in list(self._pools.values()):
            pool.disconnect(inuse_connections=False)
        if self._locator is not None:
            self._locator.close()
