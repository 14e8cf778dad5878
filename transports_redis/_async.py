"""`AsyncRedisTransport`: the operations of `_ops` run over ``redis.asyncio``.

The sync twin's runner, awaited, over the same `Handle`: one FCALL per call, on an idle
connection of the handle's or one from the pool, retries off, error replies through
`_errors.Recover`, operations run by core's `drive_async` and a claim that waits by
`wait_for_async`. It connects on first use, or at ``async with`` (the maxmemory-policy
check runs then). A claim cancelled while its script may have leased follows core's
`GiveBack`: the reply is awaited in the background and a lease in it is given back
with `_ops.Unclaim`, so no lease is left that nobody holds, and its delivery is not
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Iterable
from functools import partial
from typing import Any, TypeVar

import redis.asyncio as aredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry

from transports_core import Event, Lease, Message, TransportError
from transports_core import backend as core
from transports_core.backend import Claimed, GiveBack, Operation, drive_async

from . import _ops as ops
from ._errors import (
    FIRST_LOOK,
    LONGEST_LOOK,
    REPLIES,
    Exchange,
    FunctionsRefused,
    Node,
    Unreachable,
    connecting,
    redis_errors,
)
from ._scripts import Library, Script
from ._sync import CLOSE_KEY_MS, Handle, pool_kwargs
from ._topology import AsyncLocator
from ._url import RedisOptions

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

E = TypeVar("E")
T = TypeVar("T")


class AsyncRedisTransport(Handle, core.AsyncTransportBase[E]):
    """`RedisTransport` as coroutines, over ``redis.asyncio``."""

    def __init__(self, options: RedisOptions, event_type: object = Event) -> None:
        self._locator = None if options.topology == "server" else AsyncLocator(options)
        # With a cluster or Sentinel URL, a stand-in until `_open` finds the queue's node.
        server = options.server if self._locator is None else options.node_url(options.nodes[0])
        pool = aredis.ConnectionPool.from_url(server, **pool_kwargs(options, Retry))
        self._setup(options, event_type, pool)
        self._checked = False
        self._give_back: GiveBack[Claimed | ops.Idle] = GiveBack(self._unclaim)

    async def _open(self) -> None:
        try:
            if self._locator is not None:
                self._follow(await self._locator.locate())
            self._check_server(await self._command("INFO", "memory", check=False))
            if self._locator is None and self._seeds_a_cluster(
                await self._command("INFO", "cluster", check=False)
            ):
                self._locator = AsyncLocator(self._options)
                self._follow(await self._locator.locate())
        except BaseException:
            # Refused (or failed): no connection is left behind for the loop to find.
            for pool in list(self._pools.values()):
                await pool.disconnect()
            if self._locator is not None:
                await self._locator.close()
            raise
        self._checked = True

    async def __aenter__(self) -> Self:
        if not self._checked:
            await self._open()
        return self

    # -- the runner ------------------------------------------------------------------

    async def _exchange(self, step: Exchange, writes: bool, name: str, timeout: float = 0) -> Any:
        """The sync twin's, awaited."""
        if step.pause:
            await asyncio.sleep(step.pause)
        node = self._home if step.node is None else step.node
        pool = self._pool_at(node)
        server = self._options.redacted
        with connecting(server):
            conn = await self._connection(node, pool)
        wait = self._wait_call if writes else None
        replicated: object = None
        went_through = False
        try:
            with redis_errors(server, name, writes):
                try:
                    await conn.send_packed_command(
                        step.commands if wait is None else [*step.commands, wait]
                    )
                    for _ in step.commands[1:]:  # ASKING's: the call's own reply tells
                        with contextlib.suppress(rex.ResponseError):
                            await conn.read_response()
                    if timeout:
                        reply = await conn.read_response(timeout=timeout)
                    else:
                        reply = await conn.read_response()
                except REPLIES as error:  # an error reply is the call's reply
                    reply = error
                if wait is not None:
                    try:
                        replicated = await conn.read_response()
                    except REPLIES as error:  # WAIT on what has become a replica
                        replicated = error
            went_through = True
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            if not (went_through and self._keep(node, conn)):
                await pool.release(conn)
                if self._closed:  # closed while this call ran: its connection goes too
                    await conn.disconnect()
        if wait is not None:
            self._replicated(name, reply, replicated)
        return reply

    async def _reach(self, step: Exchange, writes: bool, name: str, timeout: float = 0) -> Any:
        """The sync twin's, awaited."""
        waited, pause = 0.0, FIRST_LOOK
        while True:
            try:
                reply = await self._exchange(step, writes, name, timeout)
            except Unreachable as exc:
                if not self._relocation(exc, step, waited):
                    raise
            else:
                if not (isinstance(reply, REPLIES) and self._relocation(reply, step, waited)):
                    return reply
            await asyncio.sleep(pause)
            waited, pause = waited + pause, min(pause * 2, LONGEST_LOOK)
            assert self._locator is not None  # `_relocation` said so
            with contextlib.suppress(TransportError):  # no node yet: look again later
                self._follow(await self._locator.locate())

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

    async def _send(
        self,
        call: bytes,
        source: Script | Library | None,
        writes: bool,
        name: str,
        timeout: float = 0,
    ) -> Any:
        reply = await self._reach(Exchange([call]), writes, name, timeout)
        if isinstance(reply, REPLIES):
            io = partial(self._exchange, writes=writes, name=name, timeout=timeout)
            reply = await drive_async(self._recover(reply, call, source, name), None, io)
        return reply

    async def _execute(self, call: ops.ScriptCall) -> Any:
        """The sync twin's, awaited."""
        script, args = call
        packer = self._packer
        try:
            return await self._send(
                packer.call(script, args), packer.loader(script), script.writes, script.name
            )
        except FunctionsRefused:
            packer.functions = False  # see the sync twin's
            return await self._send(packer.call(script, args), script, script.writes, script.name)

    async def _command(self, *args: Any, writes: bool = False, check: bool = True) -> Any:
        if check and not self._checked:
            await self._open()
        return await self._send(ops.command(*args), None, writes, str(args[0]).lower())

    async def _run(self, op: Operation[ops.ScriptCall, Any, T]) -> T:
        self._refuse_if_closed()
        return await self._perform(op)

    async def _perform(self, op: Operation[ops.ScriptCall, Any, T]) -> T:
        """Run ``op`` even if the handle closes meanwhile: the call began before close."""
        if not self._checked:
            await self._open()
        if not self._current:
            await drive_async(ops.Upgrade(), self._now(), self._execute)
            self._current = True
        return await drive_async(op, self._now(), self._execute)

    async def _claim_once(self, op: ops.Claim) -> Claimed | ops.Idle | None:
        """The claim's one script, under `GiveBack` (never None, but for its type)."""
        # Checked here, not in the task: a claim that began before close() finishes as
        # any other call in flight does, though its task first runs after close.
        self._refuse_if_closed()
        call: Awaitable[Claimed | ops.Idle] = self._perform(op)
        return await self._give_back.claim(call)

    def _giving_back(self) -> GiveBack[Claimed | ops.Idle]:
        return self._give_back

    async def _unclaim(self, got: Claimed | ops.Idle) -> None:
        """`GiveBack`'s undoing of a claim whose task was cancelled."""
        if isinstance(got, Claimed):
            await self._perform(ops.Unclaim(got))

    async def _wait(self, op: ops.Claim, idle: ops.Idle, wait: float) -> Claimed | None:
        """The sync twin's, awaited."""
        if self._closed:
            return None
        self._waiting += 1
        plan, waiter = self._waiter(op, idle, wait)
        try:
            return await core.wait_for_async(
                plan,
                partial(self._look, waiter),
                partial(self._claim_again, waiter),
                partial(self._sleep, waiter),
                self._is_closed,
            )
        except Exception:
            if not self._is_closed():  # see the sync twin's
                raise
            return None
        finally:
            self._waiting -= 1

    @staticmethod
    async def _look(waiter: ops.Waiter) -> core.WaitState:
        return waiter.look()

    async def _claim_again(self, waiter: ops.Waiter) -> Claimed | None:
        op = waiter.claim()
        if op is None:
            return None
        got = await self._claim_once(op)
        return waiter.found(got, self._wait_clock()())

    async def _sleep(self, waiter: ops.Waiter, timeout: float) -> bool:
        blpop, read_timeout = self._blpop(waiter, timeout)
        reply = await self._exchange(blpop, False, "blpop", read_timeout)
        return self._woke(waiter, reply, timeout)

    # -- the contract ----------------------------------------------------------------

    async def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]:
        # The base's, but an empty batch sends no script at all.
        op = ops.PublishMany(self._codec, items, self._options.dedup_window)
        return await self._run(op) if op.count else []

    async def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        wait = core.check_wait(wait)
        op = self._claim_op(worker_id, visibility, min_priority)
        got = await self._claim_once(op)
        if isinstance(got, Claimed):
            return got.lease(self._codec)
        if got is None or wait <= 0:
            return None
        claimed = await self._wait(op, got, wait)
        return None if claimed is None else claimed.lease(self._codec)

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
                await self._command(
                    "RPUSH", self._close_key, *["1"] * self._waiting, writes=True, check=False
                )
                await self._command(
                    "PEXPIRE", self._close_key, CLOSE_KEY_MS, writes=True, check=False
                )
            except TransportError:
                pass
        await self._give_back.drain()
        # Calls in flight finish on their connections (a blocked claim was woken above)
        # and drop them as they end.
        for node, conn in self._drop_idle():
            await conn.disconnect()
            await self._pools[node].release(conn)
        for pool in list(self._pools.values()):
            await pool.disconnect(inuse_connections=False)
        if self._locator is not None:
            await self._locator.close()
