"""Driving an `AsyncTransport` from the sync scenarios.

`Portal` runs one event loop on a private thread; `BlockingTransport` exposes an async
transport living on that loop through the sync `Transport` interface, so every sync
scenario also runs against the async twin, and adopters need no async pytest plugin.
Several threads may call through one portal at once. Imports no backend.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from transports_core import (
    AsyncTransport,
    AsyncTransportAdmin,
    Lease,
    LeaseLost,
    Message,
    Settlement,
)
from transports_core.backend import Closing

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

if TYPE_CHECKING:
    from ._base import AsyncJoinSession

__all__ = ["BlockingSession", "BlockingTransport", "BlockingWithin", "Portal"]

E = TypeVar("E")
T = TypeVar("T")

# Far beyond any scenario's needs; only there so that a hung backend fails the test.
TIMEOUT = 120.0


class Portal:
    """An event loop on its own thread, and a way to run coroutines on it from outside."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="conformance-event-loop", daemon=True
        )
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the loop and return its result (or raise its error)."""
        if threading.current_thread() is self._thread:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError("Portal.run called from the portal's own loop would deadlock")

        async def wrapper() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(TIMEOUT)

    def call(self, function: Callable[[], T]) -> T:
        """Call ``function`` on the loop's thread (for constructors that want a loop)."""
        if threading.current_thread() is self._thread:
            return function()

        async def wrapper() -> T:
            return function()

        return self.run(wrapper())

    def close(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        self.run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(TIMEOUT)
        self._loop.close()


class BlockingTransport(Closing, Generic[E]):
    """The sync `Transport` interface over an `AsyncTransport` that lives on ``portal``.

    ``with`` awaits the async transport's ``__aenter__``, and its ``close()`` at the end.
    Over an `AsyncTransportAdmin`, it is made a `BlockingAdminTransport`, with the admin
    calls blocking too.
    """

    def __new__(cls, portal: Portal, transport: AsyncTransport[E]) -> Self:
        if cls is BlockingTransport and isinstance(transport, AsyncTransportAdmin):
            return cast(Self, super().__new__(BlockingAdminTransport))
        return super().__new__(cls)

    def __init__(self, portal: Portal, transport: AsyncTransport[E]) -> None:
        self._portal = portal
        self.async_transport = transport

    def publish(
        self,
        group_id: str,
        event: E,
        priority: int = 0,
        *,
        key: str | None = None,
        delay: float = 0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        return self._portal.run(
            self.async_transport.publish(
                group_id, event, priority, key=key, delay=delay, hold=hold, tenant=tenant
            )
        )

    def publish_many(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[int]:
        return self._portal.run(self.async_transport.publish_many(items))

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[E] | None:
        return self._portal.run(
            self.async_transport.claim(worker_id, visibility, min_priority, wait)
        )

    def bury(self, lease: Lease[object], reason: str) -> None:
        self._portal.run(self.async_transport.bury(lease, reason))

    def ack(self, lease: Lease[object]) -> None:
        self._portal.run(self.async_transport.ack(lease))

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._portal.run(self.async_transport.nack(lease, delay))

    def extend(self, lease: Lease[E], visibility: float) -> Lease[E]:
        return self._portal.run(self.async_transport.extend(lease, visibility))

    def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[Lease[E]]:
        return self._portal.run(
            self.async_transport.claim_many(worker_id, visibility, limit, min_priority, wait)
        )

    def settle_many(self, items: Iterable[Settlement[object]]) -> list[LeaseLost]:
        return self._portal.run(self.async_transport.settle_many(items))

    def ack_many(self, leases: Iterable[Lease[object]]) -> list[LeaseLost]:
        return self._portal.run(self.async_transport.ack_many(leases))

    def ack_and_claim(
        self,
        lease: Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> Lease[E] | None:
        return self._portal.run(
            self.async_transport.ack_and_claim(lease, worker_id, visibility, min_priority, wait)
        )

    def close(self) -> None:
        self._portal.run(self.async_transport.close())

    def within(self, conn: object) -> BlockingWithin:
        """The async twin's ``within(conn)``, its calls made blocking."""
        view: Any = self._portal.call(lambda: self.async_transport.within(conn))  # type: ignore[attr-defined]  # not in the protocol: a backend may lack it
        return BlockingWithin(self._portal, view)

    def __getattr__(self, name: str) -> object:
        # The admin methods, and anything else the async twin has: coroutine functions
        # become blocking calls, other attributes pass through.
        attribute = getattr(self.async_transport, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        def call(*args: object, **kwargs: object) -> object:
            return self._portal.run(attribute(*args, **kwargs))

        return call

    def __enter__(self) -> Self:
        entered = self._portal.run(self.async_transport.__aenter__())
        # Keep `with t as x` honest: x must be this wrapper exactly when __aenter__
        # returned the async transport itself, and otherwise whatever __aenter__ returned,
        # which `Self` cannot describe: cast, not checked (the suite wants a wrong one to
        # show).
        return self if entered is self.async_transport else cast(Self, entered)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.async_transport!r}>"


class BlockingAdminTransport(BlockingTransport[E]):
    """A `BlockingTransport` over an `AsyncTransportAdmin`: the admin calls are methods
    of this class, not only found by ``__getattr__``, so that ``isinstance(t,
    TransportAdmin)`` holds here as it does for the sync twin (Python 3.12 and later
    look a protocol's methods up on the class alone)."""


def _blocking_call(name: str) -> Callable[..., object]:
    def call(self: BlockingTransport[Any], *args: object, **kwargs: object) -> object:
        return self._portal.run(getattr(self.async_transport, name)(*args, **kwargs))

    call.__name__ = name
    call.__qualname__ = f"{BlockingAdminTransport.__name__}.{name}"
    return call


for _name, _method in vars(AsyncTransportAdmin).items():
    if inspect.iscoroutinefunction(_method):
        setattr(BlockingAdminTransport, _name, _blocking_call(_name))


class BlockingWithin:
    """An async ``within(conn)`` view's writing calls, blocking, through ``portal``."""

    def __init__(self, portal: Portal, view: Any) -> None:
        self._portal, self._view = portal, view

    def publish(
        self,
        group_id: str,
        event: object,
        priority: int = 0,
        *,
        key: str | None = None,
        delay: float = 0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        seq: int = self._portal.run(
            self._view.publish(
                group_id, event, priority, key=key, delay=delay, hold=hold, tenant=tenant
            )
        )
        return seq

    def publish_many(self, items: Iterable[tuple[str, object, int] | Message[object]]) -> list[int]:
        seqs: list[int] = self._portal.run(self._view.publish_many(items))
        return seqs

    def ack(self, lease: Lease[object]) -> None:
        self._portal.run(self._view.ack(lease))

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._portal.run(self._view.nack(lease, delay))

    def bury(self, lease: Lease[object], reason: str) -> None:
        self._portal.run(self._view.bury(lease, reason))


class BlockingSession:
    """An `AsyncJoinSession`, opened by ``opener`` on ``portal``'s loop, with blocking
    ``commit``, ``rollback`` and ``close``."""

    def __init__(self, portal: Portal, opener: Callable[[], Awaitable[AsyncJoinSession]]) -> None:
        self._portal = portal
        self._session = portal.run(opener())

    @property
    def conn(self) -> object:
        return self._session.conn

    def commit(self) -> None:
        self._portal.run(self._session.commit())

    def rollback(self) -> None:
        self._portal.run(self._session.rollback())

    def close(self) -> None:
        self._portal.run(self._session.close())
