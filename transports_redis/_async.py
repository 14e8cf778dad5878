"""`AsyncRedisTransport`: the operations of `_ops` run over ``redis.asyncio``.

The sync twin's runner, awaited, over the same `Handle`: one EVALSHA per call, on an idle
connection of the handle's or one from the pool, retries off, error replies through
`_errors.recover`. It connects on first use, or at ``async with`` (the maxmemory-policy
check runs then). A claim that is cancelled while its script may have leased waits for
the reply in the background and gives such a lease back, so no lease is left that nobody
holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Generator, Iterable
from functools import partial
from typing import Any, TypeVar

import redis.asyncio as aredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry

from transports_core import Event, Lease, TransportError
from transports_core.backend import AsyncTransportBase, Claimed, check_wait

from . import _ops as ops
from ._errors import Exchange, Node, connecting, redis_errors, woken
from ._sync import CLOSE_KEY_MS, Handle, pool_kwargs
from ._url import RedisOptions

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

E = TypeVar("E")
T = TypeVar("T")


class AsyncRedisTransport(Handle, AsyncTransportBase[E]):
    """`RedisTransport` as coroutines, over ``redis.asyncio``."""

    _ops = ops

    def __init__(self, options: RedisOptions, event_type: object = Event) -> None:
        pool = aredis.ConnectionPool.from_url(options.server, **pool_kwargs(options, Retry))
        self._setup(options, event_type, pool)
        self._checked = False
        # Claims cancelled mid-script, whose leases are being given back.
        self._giving_back: set[asyncio.Task[None]] = set()

    async def _open(self) -> None:
        self._check_server(await self._command("INFO", "memory", check=False), stacklevel=4)
        self._checked = True

    async def __aenter__(self) -> Self:
        if not self._checked:
            await self._open()
        return self

    # -- the runner ------------------------------------------------------------------

    async def _exchange(self, step: Exchange, writes: bool, name: str, timeout: float = 0) -> Any:
        """Send ``step``'s commands; the last reply (an error reply as its exception)."""
        if step.pause:
            await asyncio.sleep(step.pause)
        node = self._home if step.node is None else step.node
        pool = self._pool_at(node)
        server = self._options.redacted
        with connecting(server):
            conn = await self._connection(node, pool)
        went_through = False
        try:
            with redis_errors(server, name, writes):
                await conn.send_packed_command(step.commands)
                for _ in step.commands[1:]:  # ASKING's: the call's own reply tells
                    with contextlib.suppress(rex.ResponseError):
                        await conn.read_response()
                if timeout:
                    reply = await conn.read_response(timeout=timeout)
                else:
                    reply = await conn.read_response()
            went_through = True
            return reply
        except rex.ResponseError as reply:
            went_through = True
            return reply
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            if not (went_through and self._keep(node, conn)):
                await pool.release(conn)
                if self._closed:  # closed while this call ran: its connection goes too
                    await conn.disconnect()

    async def _connection(self, node: Node, pool: Any) -> Any:
        """The sync twin's, awaited."""
        reusable = self._reusable(node)
        if reusable is None:
            return await pool.get_connection()
        conn, check = reusable
        if not check:
            return conn
        # redis-py 8 renamed the check; older versions have only the first name.
        probe = getattr(conn, "can_read", None) or conn.can_read_destructive
        try:
            try:
                stale = await probe()
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                stale = True
            if stale:
                await conn.disconnect()
                await conn.connect()
        except BaseException:  # cancelled, too: the connection goes back, closed
            await conn.disconnect()
            await pool.release(conn)
            raise
        return conn

    @staticmethod
    async def _drive(
        plan: Generator[Any, Any, T], reply: Any, io: Callable[[Any], Awaitable[Any]]
    ) -> T:
        """Send ``plan`` ``reply``, then what ``io`` makes of each step, to its end."""
        try:
            while True:
                reply = await io(plan.send(reply))
        except StopIteration as stop:
            value: T = stop.value
            return value

    async def _send(
        self, call: bytes, source: str | None, writes: bool, name: str, timeout: float = 0
    ) -> Any:
        reply = await self._exchange(Exchange([call]), writes, name, timeout)
        if isinstance(reply, rex.ResponseError):
            io = partial(self._exchange, writes=writes, name=name, timeout=timeout)
            reply = await self._drive(self._recover(reply, call, source, name), reply, io)
        return reply

    async def _command(self, *args: Any, writes: bool = False, check: bool = True) -> Any:
        if check and not self._checked:
            await self._open()
        return await self._send(ops.command(*args), None, writes, str(args[0]).lower())

    # Narrower than the base's: it only ever gets the operations of its own `_ops`.
    async def _run(self, op: ops.Op[T]) -> T:  # type: ignore[override]
        self._refuse_if_closed()
        return await self._perform(op)

    async def _perform(self, op: ops.Op[T]) -> T:
        """Run ``op`` even if the handle closes meanwhile: the call began before close."""
        if not self._checked:
            await self._open()
        script = op.script
        got = op.result(await self._send(self._call(op), script.source, op.writes, script.name))
        while got is ops.MORE:  # an admin call in chunks: one script each
            call = self._call(op)
            got = op.result(await self._send(call, script.source, op.writes, script.name))
        return got

    async def _claim_once(self, op: ops.Claim) -> Claimed | ops.Idle:
        # Checked here, not in the task: a claim that began before close() finishes as
        # any other call in flight does, though its task first runs after close.
        self._refuse_if_closed()
        task = asyncio.ensure_future(self._perform(op))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._give_back)
            raise

    def _give_back(self, task: asyncio.Future[Claimed | ops.Idle]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        got = task.result()
        if isinstance(got, Claimed):
            lease = Lease(got.seq, got.group_id, got.raw, got.worker_id, got.attempt, 0.0)
            back = asyncio.ensure_future(self._perform(ops.Nack(lease, 0)))
            self._giving_back.add(back)
            back.add_done_callback(self._given_back)

    def _given_back(self, task: asyncio.Task[None]) -> None:
        self._giving_back.discard(task)
        if not task.cancelled():
            task.exception()  # a lease that could not be given back lapses by itself

    async def _look(self, op: ops.Claim, timeout: float) -> Claimed | ops.Idle | None:
        """Wait for a wake-up token (or this handle's close) for at most ``timeout``, then
        claim again; None once the handle is closed."""
        if self._closed:
            return None
        self._waiting += 1
        try:
            blpop, read_timeout = self._wake(op.floor, timeout)
            reply = await self._exchange(blpop, False, "blpop", read_timeout)
            woken(reply, self._options.redacted)
            return await self._claim_once(op)
        except Exception:
            # close() shuts the socket under a blocked read, and redis-py may then fail
            # with any error (a closed file, say): once closed, that is the wake-up.
            if not self._is_closed():
                raise
            return None
        finally:
            self._waiting -= 1

    # -- the contract ----------------------------------------------------------------

    async def publish_many(self, items: Iterable[tuple[str, E, int]]) -> list[int]:
        # The base's, but an empty batch sends no script at all.
        op = ops.PublishMany(self._codec, items)
        return await self._run(op) if op.count else []

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        wait = check_wait(wait)
        op = self._claim_op(worker_id, visibility, min_priority)
        got = await self._claim_once(op)
        if isinstance(got, ops.Idle) and wait > 0:
            got = await self._drive(self._waiting_plan(wait), got, partial(self._look, op.woken()))
        return got.lease(self._codec) if isinstance(got, Claimed) else None

    async def check(self) -> list[str]:
        """The broken invariants of the queue's structures (empty: sound); read-only."""
        return await self._run(ops.Check())

    # -- lifecycle -------------------------------------------------------------------

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
        for node, conn in self._drop_idle():
            await conn.disconnect()
            await self._pools[node].release(conn)
        for pool in list(self._pools.values()):
            await pool.disconnect(inuse_connections=False)
