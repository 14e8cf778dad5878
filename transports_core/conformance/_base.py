"""What every scenario mixin stands on: the factory types, the declared capabilities, the
manual clock, and `SuiteBase`, which opens and closes the handles of each test and moves
time for it.

A backend declares what it can do in ``capabilities``; a scenario that needs a capability
the backend lacks calls `SuiteBase.require`, which skips with the reason. Nothing else in
the suite skips. Imports pytest and core only, never a backend.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, ClassVar, Final, Protocol, TypeVar, cast

import pytest

from transports_core import (
    AsyncTransport,
    Event,
    Lease,
    LeaseLost,
    Message,
    Settlement,
    Transport,
    TransportAdmin,
)
from transports_core.backend import Closing

ExcT = TypeVar("ExcT", bound=BaseException)

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

__all__ = [
    "ADMIN",
    "CAPABILITIES",
    "checks",
    "CLOCK",
    "DURABLE",
    "MULTIPROCESS",
    "MULTI_HANDLE",
    "PARALLEL_CLAIMS",
    "CONTROL",
    "TENANTS",
    "TIMERS",
    "WITHIN",
    "AsyncJoinFactory",
    "AsyncJoinSession",
    "AsyncTransportFactory",
    "JoinFactory",
    "JoinSession",
    "ManualClock",
    "SuiteBase",
    "TransportFactory",
]


class TransportFactory(Protocol):
    """Opens a new handle on the test's store. The suite passes keyword options the backend
    must accept as ``open_transport`` does: ``event_type=`` and ``dedup_window=`` always
    may come, and with the ``admin`` capability ``max_attempts=`` and ``on_dead=``. Most
    calls pass none."""

    def __call__(self, **options: Any) -> Transport[Any]: ...


class AsyncTransportFactory(Protocol):
    """`TransportFactory` for the async twin; it is called on the suite's event loop."""

    def __call__(self, **options: Any) -> AsyncTransport[Any]: ...


class JoinSession(Protocol):
    """A transaction of the caller's own on the test's store, on a connection the suite
    hands to ``transport.within(conn)``: what the ``join_session`` fixture opens (a new
    connection, with a transaction begun) for a backend with the ``within`` capability.
    After `commit` or `rollback` the suite calls `close`, and only that."""

    @property
    def conn(self) -> object:
        """The connection to pass to ``transport.within``."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None:
        """Close the connection (rolling back a transaction still open)."""
        ...


class AsyncJoinSession(Protocol):
    """`JoinSession` for the async twin: an async connection, and coroutines."""

    @property
    def conn(self) -> object: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...

    async def close(self) -> None: ...


# Opens a new `JoinSession` on the test's store (the ``join_session`` fixture's value).
JoinFactory = Callable[[], JoinSession]
# Opens an `AsyncJoinSession`, on the suite's event loop (``join_async_session``).
AsyncJoinFactory = Callable[[], Awaitable[AsyncJoinSession]]


# The factory's transports read time from the suite's `clock` fixture (the backend passes
# it on, e.g. as ``clock=``), so lapses and parks are checked without sleeping.
CLOCK: Final = "clock"
# Each call of the factory opens an independent handle (its own connection) on the store.
MULTI_HANDLE: Final = "multi-handle"
# The store outlives its handles: closing every handle and opening a new one loses nothing.
DURABLE: Final = "durable"
# The `transport_url` fixture names the store, and other OS processes can open it by URL.
MULTIPROCESS: Final = "multiprocess"
# It implements `TransportAdmin` and the dead-letter options ``max_attempts``/``on_dead``.
ADMIN: Final = "admin"
# Several claims may be in flight at once without serializing (PostgreSQL's SKIP LOCKED):
# round-robin is then only bounded, see the ``parallel-fairness-bound`` property.
PARALLEL_CLAIMS: Final = "parallel-claims"
# ``transport.within(conn)`` runs the writing calls in a transaction of the caller's, on a
# connection the ``join_session`` fixture opens (see `JoinSession`). Without it, ``within``
# must refuse with a TransportError.
WITHIN: Final = "within"
# ``publish(delay=..., hold=...)``: delayed messages (see `Transport.publish`). Without it,
# a delayed publish must raise `Unsupported` and store nothing.
TIMERS: Final = "timers"
# ``publish(tenant=...)`` and weighted fairness across tenants; needs ``admin`` (for
# ``set_tenant_weight``). Without it, a publish with a tenant must raise `Unsupported`.
TENANTS: Final = "tenants"
# ``cancel``, ``pause_group``, ``resume_group``, ``paused_groups`` and ``peek`` of
# `TransportAdmin`; needs ``admin``. Without it, they must raise `Unsupported`.
CONTROL: Final = "group-control"
CAPABILITIES: Final = frozenset(
    {
        ADMIN,
        CLOCK,
        CONTROL,
        DURABLE,
        MULTIPROCESS,
        MULTI_HANDLE,
        PARALLEL_CLAIMS,
        TENANTS,
        TIMERS,
        WITHIN,
    }
)

WHY: Final = {
    CLOCK: "its transports cannot read time from the suite's clock",
    MULTI_HANDLE: "its factory does not open independent handles on one store",
    DURABLE: "its store does not outlive its handles",
    MULTIPROCESS: "other processes cannot open its store by URL",
    ADMIN: "it does not implement TransportAdmin and the dead-letter options",
    PARALLEL_CLAIMS: "its claims serialize, so the strict fairness bound applies instead",
    WITHIN: "it cannot run its writing calls in a transaction of the caller's",
    TIMERS: "it does not offer delayed publishes",
    TENANTS: "it does not offer tenants and their weights",
    CONTROL: "it does not offer cancel, pause, resume and peek",
}

# Real-time margins, used only when the backend does not take the suite's clock.
REAL_BRIEF: Final = 0.8  # a lease or park meant to lapse during the test
REAL_HOLD: Final = 60.0  # a lease meant to outlast the test
REAL_MARGIN: Final = 0.25  # slack after a deadline before it is taken as passed


_current = ["the contract"]


def current_property() -> str:
    """The property the running scenario checks, for helpers' failure messages."""
    return _current[0]


def seen(lease: Lease[Event] | None, *fields: str) -> tuple[object, ...] | None:
    """The named fields of a claimed lease, or None when claim returned None."""
    return None if lease is None else tuple(getattr(lease, name) for name in fields)


def must_raise(
    prop: str, error: type[ExcT] | tuple[type[ExcT], ...], what: str, call: Callable[[], object]
) -> ExcT:
    """Call ``call`` and return the ``error`` it raised; fail, naming ``prop``, if it
    raised nothing (any other error propagates as it is)."""
    try:
        call()
    except error as exc:
        return exc
    pytest.fail(f"{prop}: {what} did not raise {_names(error)}")


def _names(error: type[BaseException] | tuple[type[BaseException], ...]) -> str:
    kinds = error if isinstance(error, tuple) else (error,)
    return " or ".join(kind.__name__ for kind in kinds)


def checks(prop: str) -> pytest.MarkDecorator:
    """Mark a scenario with the property it checks (see `_properties`)."""
    return pytest.mark.conformance_property(prop)


class ManualClock:
    """Seconds since the epoch that move only when told to.

    Each reading moves the clock one microsecond on, so that no two readings are equal and
    "the oldest claim" is never a tie, just as with a real clock. Safe across threads.
    """

    TICK: Final = 1e-6

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._now += self.TICK
            return self._now

    def now(self) -> float:
        """The current reading, without moving the clock."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds!r}")
        with self._lock:
            self._now += seconds

    def advance_to(self, when: float) -> None:
        """Move to ``when`` (or stay, if that is in the past)."""
        with self._lock:
            self._now = max(self._now, when)

    def __repr__(self) -> str:
        return f"ManualClock({self.now()!r})"


class _Tracked(Closing):
    """A handle that remembers the leases and parks it hands out, so that a test on a
    store shared with other tests can give everything back when it ends. ``with`` enters
    the handle it wraps, and closes it at the end."""

    def __init__(
        self,
        inner: Transport[Event],
        leases: list[Lease[Event]],
        parks: list[float],
        now: Callable[[], float],
        delayed: list[str],
    ) -> None:
        self._inner, self._leases, self._parks, self._now = inner, leases, parks, now
        # The groups of delayed publishes: their messages may not show in `groups`.
        self._delayed = delayed

    def publish(
        self,
        group_id: str,
        event: Event,
        priority: int = 0,
        *,
        key: str | None = None,
        delay: float = 0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        if delay:
            self._delayed.append(group_id)
        return self._inner.publish(
            group_id, event, priority, key=key, delay=delay, hold=hold, tenant=tenant
        )

    def publish_many(self, items: Iterable[tuple[str, Event, int] | Message[Event]]) -> list[int]:
        items = list(items)
        self._delayed.extend(i.group_id for i in items if isinstance(i, Message) and i.delay)
        return self._inner.publish_many(items)

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> Lease[Event] | None:
        lease = self._inner.claim(worker_id, visibility, min_priority, wait)
        if lease is not None:
            self._leases.append(lease)
        return lease

    def bury(self, lease: Lease[object], reason: str) -> None:
        self._inner.bury(lease, reason)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)  # the admin methods

    def ack(self, lease: Lease[object]) -> None:
        self._inner.ack(lease)

    def nack(self, lease: Lease[object], delay: float = 0) -> None:
        self._inner.nack(lease, delay)
        if delay > 0:
            self._parks.append(self._now() + delay)

    def extend(self, lease: Lease[Event], visibility: float) -> Lease[Event]:
        return self._inner.extend(lease, visibility)

    def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[Lease[Event]]:
        leases = self._inner.claim_many(worker_id, visibility, limit, min_priority, wait)
        self._leases.extend(leases)
        return leases

    def settle_many(self, items: Iterable[Settlement[object]]) -> list[LeaseLost]:
        items = list(items)
        stale = self._inner.settle_many(items)  # a bad item raises here, before any note
        parked = [i for i in items if i.action == "nack" and i.delay]
        self._parks.extend(self._now() + i.delay for i in parked)
        return stale

    def ack_many(self, leases: Iterable[Lease[object]]) -> list[LeaseLost]:
        return self._inner.ack_many(leases)

    def ack_and_claim(
        self,
        lease: Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> Lease[Event] | None:
        got = self._inner.ack_and_claim(lease, worker_id, visibility, min_priority, wait)
        if got is not None:
            self._leases.append(got)
        return got

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Self:
        self._inner.__enter__()
        return self


class SuiteBase:
    """Fixtures and helpers shared by every scenario mixin.

    Subclasses (via `TransportSuite`) override the ``make_transport`` fixture, declare
    ``capabilities``, and, with ``multiprocess``, a ``transport_url`` fixture.
    """

    capabilities: ClassVar[Iterable[str]] = frozenset()
    # True when every test of the class works on one store that outlives the test (the
    # CLI's store at a URL): each test then starts by draining it and ends by giving back
    # what it holds. Leave False when ``make_transport`` makes a fresh store per test.
    shared_store: ClassVar[bool] = False
    # The async suite sets this: process workers then use the async twin.
    _async_twin: ClassVar[bool] = False
    # False when the suite cannot know whether the backend joins a caller's transaction
    # (the CLI, at a URL): then ``within`` of a stranger's object may be refused with
    # TypeError or ValueError too, not only with the TransportError of a backend that
    # cannot join at all.
    within_known: ClassVar[bool] = True
    # Without the clock capability: a lease or park meant to lapse lasts this long, and a
    # deadline counts as passed this much later (real seconds).
    real_brief: ClassVar[float] = REAL_BRIEF
    real_margin: ClassVar[float] = REAL_MARGIN

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = set(cls.capabilities) - CAPABILITIES
        if unknown:
            raise TypeError(
                f"{cls.__name__}.capabilities has unknown {sorted(unknown)}; "
                f"known capabilities: {', '.join(sorted(CAPABILITIES))}"
            )

    # -- fixtures a backend overrides --------------------------------------------------

    @pytest.fixture
    def make_transport(self) -> TransportFactory:
        """Override: return a callable that opens a new handle on one store, fresh for
        the test."""
        pytest.fail(f"{type(self).__name__} must override the make_transport fixture")

    @pytest.fixture
    def transport_url(self) -> str:
        """Override with the ``multiprocess`` capability: a URL any process can open."""
        pytest.fail(
            f"{type(self).__name__} declares {MULTIPROCESS!r} but does not override the "
            "transport_url fixture"
        )

    @pytest.fixture
    def join_session(self) -> JoinFactory:
        """Override with the ``within`` capability: a callable that opens a connection of
        the caller's own to the test's store and begins a transaction on it (see
        `JoinSession`)."""
        pytest.fail(
            f"{type(self).__name__} declares {WITHIN!r} but does not override the "
            "join_session fixture"
        )

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The clock a backend with the ``clock`` capability hands its transports."""
        return ManualClock()

    # -- per-test state ------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _conformance_handles(
        self, request: pytest.FixtureRequest, make_transport: TransportFactory
    ) -> Iterator[None]:
        self._request = request
        marker = request.node.get_closest_marker("conformance_property")
        _current[0] = str(marker.args[0]) if marker else request.node.name
        self._factory = make_transport
        self._handles: list[Transport[Any]] = []
        self._given: list[Lease[Event]] = []
        self._parks: list[float] = []
        self._delayed: list[str] = []
        self._clock: ManualClock | None = (
            request.getfixturevalue("clock") if self.has(CLOCK) else None
        )
        if self.shared_store:
            self._empty_store()
        yield
        if self.shared_store:
            self._give_back()
        self.close_all()

    def has(self, capability: str) -> bool:
        return capability in set(self.capabilities)

    def require(self, capability: str) -> None:
        """Skip the test, with the reason, unless the backend declares ``capability``."""
        if not self.has(capability):
            pytest.skip(
                f"backend does not declare the {capability!r} capability: {WHY[capability]}"
            )

    def open(self, **options: Any) -> Transport[Any]:
        """A new handle on the test's store, opened with ``options``, closed when the test
        ends."""
        handle = self._factory(**options)
        if self.shared_store:
            handle = _Tracked(handle, self._given, self._parks, self.now, self._delayed)
        self._handles.append(handle)
        return handle

    def close_all(self) -> None:
        handles, self._handles = self._handles, []
        for handle in reversed(handles):
            handle.close()

    # -- time ----------------------------------------------------------------------------

    @property
    def brief(self) -> float:
        """A visibility or delay meant to run out during the test."""
        return 5.0 if self._clock is not None else self.real_brief

    @property
    def hold(self) -> float:
        """A visibility meant to outlast the test."""
        return 3600.0 if self._clock is not None else REAL_HOLD

    def now(self) -> float:
        return self._clock.now() if self._clock is not None else time.time()

    def pass_deadline(self, deadline: float) -> None:
        """Let time run until ``deadline`` (epoch seconds) has clearly passed."""
        if self._clock is not None:
            self._clock.advance_to(deadline + 0.5)
            return
        while (left := deadline + self.real_margin - time.time()) > 0:
            time.sleep(left)

    def wait(self, seconds: float) -> None:
        self.pass_deadline(self.now() + seconds)

    # -- a store shared between tests ----------------------------------------------------

    def _drain(self, transport: Transport[Event]) -> None:
        while (lease := transport.claim("conformance-cleanup", self.hold)) is not None:
            transport.ack(lease)

    def _empty_store(self) -> None:
        with self._factory() as transport:
            self._drain(transport)

    def _give_back(self) -> None:
        with self._factory() as transport:
            if self.has(ADMIN):
                # The store started empty, so all it holds the test made: purging each
                # group takes its leases, parks and dead letters at once, where waiting
                # for a park of `hold` would cost a minute.
                admin = cast(TransportAdmin, transport)
                for group_id in admin.paused_groups():
                    admin.resume_group(group_id)
                for group_id in dict.fromkeys(self._delayed):
                    admin.purge_group(group_id)
                while groups := admin.groups(limit=100):
                    for group in groups:
                        admin.purge_group(group.group_id)
                for letter in admin.dead_letters():
                    admin.discard(letter.seq)
                return
            for lease in self._given:
                with contextlib.suppress(LeaseLost):
                    transport.nack(lease)
            for deadline in self._parks:
                self.pass_deadline(deadline)
            self._drain(transport)
