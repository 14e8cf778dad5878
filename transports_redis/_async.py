"""`AsyncRedisTransport`: the operations of `_ops` run over ``redis.asyncio``.

The same runner as the sync twin's, awaited: one EVALSHA per call on a connection from
the pool, retries off. It connects lazily (the maxmemory-policy check runs on first use).
A claim that is cancelled while its script may have leased waits for the reply in the
background and gives such a lease back, so no lease is left that nobody holds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from collections.abc import Iterable
from typing import Any, TypeVar

import redis.asyncio as aredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry

from transports_core import Event, Lease, TransportError
from transports_core.backend import AsyncTransportBase, EventCodec, check_wait

from . import _ops as ops
from ._errors import connecting, redis_errors
from ._scripts import QUEUE_KEYS, Script
from ._sync import CLOCK_RECHECK, CLOSE_KEY_MS, maxmemory_refusal, pool_kwargs
from ._url import RedisOptions

E = TypeVar("E")
T = TypeVar("T")


class AsyncRedisTransport(AsyncTransportBase[E]):
    """`RedisTransport` as coroutines, over ``redis.asyncio``."""

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
        self._checked = False
        self._pool: aredis.ConnectionPool = aredis.ConnectionPool.from_url(
            options.server, **pool_kwargs(options, Retry)
        )
        # Claims cancelled mid-script, whose leases are being given back.
        self._giving_back: set[asyncio.Task[None]] = set()

    async def _open(self) -> None:
        info = await self._command("INFO", "memory", check=False)
        refusal = maxmemory_refusal(self._options, str(info))
        if refusal is not None:
            if self._options.maxmemory_policy == "refuse":
                raise TransportError(refusal)
            warnings.warn(refusal, RuntimeWarning, stacklevel=4)
        self._checked = True

    async def _follow(self, moved: rex.MovedError) -> None:
        """The queue's slot is served by another cluster node: use that node from now on."""
        old = self._pool
        kwargs = {**old.connection_kwargs, "host": moved.host, "port": moved.port}
        self._pool = aredis.ConnectionPool(connection_class=old.connection_class, **kwargs)
        await old.disconnect()

    async def _command(
        self, *args: Any, writes: bool = False, timeout: float | None = None, check: bool = True
    ) -> Any:
        if check and not self._checked:
            await self._open()
        try:
            return await self._command_once(args, writes, timeout)
        except rex.MovedError as moved:
            await self._follow(moved)
            return await self._command_once(args, writes, timeout)

    async def _command_once(
        self, args: tuple[Any, ...], writes: bool, timeout: float | None
    ) -> Any:
        server = self._options.redacted
        with connecting(server):  # the pool connects it
            conn: Any = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            with redis_errors(server, str(args[0]).lower(), writes):
                await conn.send_command(*args)
                if timeout is None:
                    return await conn.read_response()
                return await conn.read_response(timeout=timeout)
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await self._pool.release(conn)
            if self._closed:  # closed while this call ran: its connection goes too
                await conn.disconnect()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise TransportError(f"{self!r} is closed")

    # Narrower than the base's: it only ever gets the operations of its own `_ops`.
    async def _run(self, op: ops.Op[T]) -> T:  # type: ignore[override]
        self._refuse_if_closed()
        return await self._perform(op)

    async def _perform(self, op: ops.Op[T]) -> T:
        """Run ``op`` even if the handle closes meanwhile: the call began before close."""
        if not self._checked:
            await self._open()
        try:
            return await self._run_once(op)
        except rex.MovedError as moved:
            # MOVED: the script did not run on that node, so sending it again is safe.
            await self._follow(moved)
            return await self._run_once(op)

    async def _run_once(self, op: ops.Op[T]) -> T:
        clock = self._options.clock
        script = op.script
        packed = self._packer.evalsha(script, op.args("" if clock is None else repr(clock())))
        server = self._options.redacted
        with connecting(server):  # the pool connects it
            conn: Any = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            with redis_errors(server, script.name, op.writes):
                try:
                    await conn.send_packed_command([packed])
                    reply = await conn.read_response()
                except rex.NoScriptError:
                    await conn.send_command("SCRIPT", "LOAD", script.source)
                    await conn.read_response()
                    await conn.send_packed_command([packed])
                    reply = await conn.read_response()
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await self._pool.release(conn)
            if self._closed:  # closed while this call ran: its connection goes too
                await conn.disconnect()
        return op.result(reply)

    async def _claim_once(self, op: ops.Claim) -> ops.Claimed | ops.Idle:
        # Checked here, not in the task: a claim that began before close() finishes as
        # any other call in flight does, though its task first runs after close.
        self._refuse_if_closed()
        task = asyncio.ensure_future(self._perform(op))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._give_back)
            raise

    def _give_back(self, task: asyncio.Future[ops.Claimed | ops.Idle]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        got = task.result()
        if isinstance(got, ops.Claimed):
            lease = Lease(got.seq, got.group_id, got.raw, got.worker_id, got.attempt, 0.0)
            back = asyncio.ensure_future(self._perform(ops.Nack(lease, 0)))
            self._giving_back.add(back)
            back.add_done_callback(self._given_back)

    def _given_back(self, task: asyncio.Task[None]) -> None:
        self._giving_back.discard(task)
        if not task.cancelled():
            task.exception()  # a lease that could not be given back lapses by itself

    async def _block(self, floor: int, timeout: float) -> None:
        if self._closed:
            return
        self._waiting += 1
        try:
            wake = ops.wake_key(self._options.queue, floor)
            await self._command(
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
            self._waiting -= 1

    async def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        # The base's, but an empty batch sends no script at all.
        op = ops.PublishMany(self._codec, items)
        return await self._run(op) if op.count else []

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        wait = check_wait(wait)
        opts = self._options
        op = ops.Claim(
            worker_id, visibility, min_priority, opts.max_attempts, opts.on_dead, wait > 0
        )
        got = await self._claim_once(op)
        if isinstance(got, ops.Claimed):
            return got.lease(self._codec)
        if wait == 0:
            return None
        deadline = time.monotonic() + wait
        ceiling = CLOCK_RECHECK if opts.clock is not None else opts.socket_timeout / 2
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await self._block(op.floor, ops.wait_timeout(left, got, ceiling))
            if self._is_closed():
                return None
            try:
                got = await self._claim_once(op)
            except Exception:
                if self._is_closed():
                    return None
                raise
            if isinstance(got, ops.Claimed):
                return got.lease(self._codec)
        return None

    async def check(self) -> list[str]:
        """The broken invariants of the queue's structures (empty: sound); read-only."""
        return await self._run(ops.Check())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._waiting:
            try:
                await self._command("RPUSH", self._close_key, "1", writes=True, check=False)
                await self._command(
                    "PEXPIRE", self._close_key, CLOSE_KEY_MS, writes=True, check=False
                )
            except TransportError:
                pass
        if self._giving_back:
            await asyncio.gather(*self._giving_back, return_exceptions=True)
        # Calls in flight finish on their connections (a blocked claim was woken above)
        # and drop them as they end.
        await self._pool.disconnect(inuse_connections=False)

    def _is_closed(self) -> bool:
        # A method, not a field: another thread or task may close while a claim waits.
        return self._closed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._options.redacted} queue={self._options.queue!r}>"
