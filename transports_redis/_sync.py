"""`RedisTransport`: the operations of `_ops` run over redis-py.

Each call takes a connection from a thread-safe pool, sends one EVALSHA and reads its
reply, so threads share a transport and their calls run side by side on the server. The
pool is built with retries off: a script is never sent twice behind the caller's back.
A waiting claim blocks in BLPOP on its floor's wake-up list and on this handle's close key.
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Iterable
from typing import Any, TypeVar

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry

from transports_core import Event, Lease, TransportError
from transports_core.backend import EventCodec, TransportBase, check_wait

from . import _ops as ops
from ._errors import connecting, redis_errors
from ._scripts import QUEUE_KEYS, Script
from ._url import RedisOptions

E = TypeVar("E")
T = TypeVar("T")

# How long a waiting claim blocks at most before it looks again when time comes from an
# injected clock, which the server cannot wait on.
CLOCK_RECHECK = 0.02
# The close key lives only long enough for a claim about to block to see it.
CLOSE_KEY_MS = 5000


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
    }
    if options.db is not None:
        kwargs["db"] = options.db
    return kwargs


def maxmemory_refusal(options: RedisOptions, info: str) -> str | None:
    """The complaint about a server whose maxmemory-policy may evict queue keys, if any."""
    policy = "unknown"
    for line in info.splitlines():
        if line.startswith("maxmemory_policy:"):
            policy = line.partition(":")[2].strip()
    if policy == "noeviction":
        return None
    return (
        f"{options.redacted}: maxmemory-policy is {policy!r}: the server may evict queue "
        "keys and lose messages silently; set maxmemory-policy noeviction (or open with "
        "maxmemory_policy=warn to accept the risk)"
    )


class RedisTransport(TransportBase[E]):
    """A durable transport on a Redis server (or one cluster node's slot), over redis-py."""

    _ops = ops

    def __init__(self, options: RedisOptions, event_type: object = Event) -> None:
        self._options = options
        self._codec = EventCodec(event_type)
        self._on_dead = options.on_dead
        self._keys = ops.queue_keys(options.queue, Script("keys", QUEUE_KEYS, (), ""))
        self._packer = ops.Packer(self._keys)
        self._close_key = ops.close_key(options.queue, uuid.uuid4().hex)
        self._closed = False
        self._waiting = 0
        self._lock = threading.Lock()
        self._pool: redis.ConnectionPool = redis.ConnectionPool.from_url(
            options.server, **pool_kwargs(options)
        )
        self._claims: tuple[object, object, object, object, ops.Claim] | None = None
        try:
            info = self._command("INFO", "memory")
            refusal = maxmemory_refusal(options, str(info))
            if refusal is not None:
                if options.maxmemory_policy == "refuse":
                    raise TransportError(refusal)
                warnings.warn(refusal, RuntimeWarning, stacklevel=3)
        except BaseException:
            self._pool.disconnect()
            raise

    # -- the runner ------------------------------------------------------------------

    def _follow(self, moved: rex.MovedError) -> None:
        """The queue's slot is served by another cluster node: use that node from now on."""
        old = self._pool
        kwargs = {**old.connection_kwargs, "host": moved.host, "port": moved.port}
        self._pool = redis.ConnectionPool(connection_class=old.connection_class, **kwargs)
        old.disconnect()

    def _command(self, *args: Any, writes: bool = False, timeout: float | None = None) -> Any:
        try:
            return self._command_once(args, writes, timeout)
        except rex.MovedError as moved:
            self._follow(moved)
            return self._command_once(args, writes, timeout)

    def _command_once(self, args: tuple[Any, ...], writes: bool, timeout: float | None) -> Any:
        server = self._options.redacted
        with connecting(server):  # the pool connects it
            conn: Any = self._pool.get_connection()
        try:
            with redis_errors(server, str(args[0]).lower(), writes):
                conn.send_command(*args)
                if timeout is None:
                    return conn.read_response()
                return conn.read_response(timeout=timeout)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._pool.release(conn)
            if self._closed:  # closed while this call ran: its connection goes too
                conn.disconnect()

    # Narrower than the base's: it only ever gets the operations of its own `_ops`.
    def _run(self, op: ops.Op[T]) -> T:  # type: ignore[override]
        if self._closed:
            raise TransportError(f"{self!r} is closed")
        try:
            return self._run_once(op)
        except rex.MovedError as moved:
            # MOVED: the script did not run on that node, so sending it again is safe.
            self._follow(moved)
            return self._run_once(op)

    def _run_once(self, op: ops.Op[T]) -> T:
        clock = self._options.clock
        script = op.script
        packed = self._packer.evalsha(script, op.args("" if clock is None else repr(clock())))
        server = self._options.redacted
        with connecting(server):  # the pool connects it
            conn: Any = self._pool.get_connection()
        try:
            with redis_errors(server, script.name, op.writes):
                try:
                    conn.send_packed_command([packed])
                    reply = conn.read_response()
                except rex.NoScriptError:
                    # A restarted or flushed server has lost the script: load it, once.
                    conn.send_command("SCRIPT", "LOAD", script.source)
                    conn.read_response()
                    conn.send_packed_command([packed])
                    reply = conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._pool.release(conn)
            if self._closed:  # closed while this call ran: its connection goes too
                conn.disconnect()
        return op.result(reply)

    def _claim_op(
        self, worker_id: str, visibility: float, min_priority: int, waiting: bool
    ) -> ops.Claim:
        # A worker asks with the very same objects each time: reuse the checked op.
        last = self._claims
        if (
            last is not None
            and last[0] is worker_id
            and last[1] is visibility
            and last[2] is min_priority
            and last[3] is waiting
        ):
            return last[4]
        opts = self._options
        op = ops.Claim(
            worker_id, visibility, min_priority, opts.max_attempts, opts.on_dead, waiting
        )
        self._claims = (worker_id, visibility, min_priority, waiting, op)
        return op

    def _block(self, floor: int, timeout: float) -> None:
        """Wait for a wake-up token (or this handle's close) for at most ``timeout``."""
        with self._lock:
            if self._closed:
                return
            self._waiting += 1
        try:
            wake = ops.wake_key(self._options.queue, floor)
            self._command(
                "BLPOP",
                wake,
                self._close_key,
                f"{timeout:.6f}",
                timeout=timeout + self._options.socket_timeout,
            )
        except Exception:
            # close() shuts the socket under a blocked read, and redis-py may then fail
            # with any error (a closed file, say): once closed, that is the wake-up.
            if not self._is_closed():
                raise
        finally:
            with self._lock:
                self._waiting -= 1

    # -- the contract ----------------------------------------------------------------

    def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        # The base's, but an empty batch sends no script at all.
        op = ops.PublishMany(self._codec, items)
        return self._run(op) if op.count else []

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        wait = check_wait(wait)
        op = self._claim_op(worker_id, visibility, min_priority, wait > 0)
        got = self._run(op)
        if isinstance(got, ops.Claimed):
            return got.lease(self._codec)
        if wait == 0:
            return None
        deadline = time.monotonic() + wait
        ceiling = (
            CLOCK_RECHECK if self._options.clock is not None else self._options.socket_timeout / 2
        )
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._block(op.floor, ops.wait_timeout(left, got, ceiling))
            if self._is_closed():
                return None
            try:
                got = self._run(op)
            except Exception:
                if self._is_closed():
                    return None
                raise
            if isinstance(got, ops.Claimed):
                return got.lease(self._codec)
        return None

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
            # Wake this handle's blocked claims; they see `_closed` and return None.
            try:
                self._command("RPUSH", self._close_key, "1", writes=True)
                self._command("PEXPIRE", self._close_key, CLOSE_KEY_MS, writes=True)
            except TransportError:
                pass
        # Calls in flight finish on their connections (a blocked claim was woken above)
        # and drop them as they end: shutting a socket under a call would leave its outcome
        # unknown.
        self._pool.disconnect(inuse_connections=False)

    def _is_closed(self) -> bool:
        # A method, not a field: another thread or task may close while a claim waits.
        return self._closed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._options.redacted} queue={self._options.queue!r}>"
