"""The conformance suite against the SQLite backends of this repo: a file, ``:memory:``,
and the async twin on a file."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from conformance._suites import (
    AsyncSession,
    AsyncUrlSuite,
    Session,
    UrlSuite,
    async_opener,
    opener,
)
from transports_core import Transport, open_transport
from transports_core.conformance import (
    ADMIN,
    CLOCK,
    CONTROL,
    DURABLE,
    MULTI_HANDLE,
    MULTIPROCESS,
    TENANTS,
    TIMERS,
    WITHIN,
    AsyncJoinFactory,
    BlockingTransport,
    JoinFactory,
    ManualClock,
    Portal,
    TransportFactory,
    TransportSuite,
)


class _File:
    # The async suite makes its join_session of join_async_session: each test class
    # below overrides only the one its suite asks for.
    capabilities: ClassVar[Iterable[str]] = frozenset(
        {ADMIN, CLOCK, CONTROL, DURABLE, MULTI_HANDLE, MULTIPROCESS, TENANTS, TIMERS, WITHIN}
    )

    @pytest.fixture
    def join_async_session(self, tmp_path: Path) -> AsyncJoinFactory:
        import aiosqlite

        async def open_session() -> AsyncSession:
            conn = await aiosqlite.connect(tmp_path / "queue.db", timeout=10)
            await conn.execute("BEGIN")
            return AsyncSession(conn)

        return open_session

    @pytest.fixture
    def transport_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'queue.db'}"

    @pytest.fixture
    def store_urls(self, tmp_path: Path) -> Iterator[str]:
        """A new file for each example of the model-based scenario."""
        return (f"sqlite:///{tmp_path / f'model-{n}.db'}" for n in itertools.count())


class TestSqliteFile(_File, UrlSuite):
    @pytest.fixture
    def join_session(self, tmp_path: Path) -> JoinFactory:
        def open_session() -> Session:
            conn = sqlite3.connect(tmp_path / "queue.db", timeout=10)
            conn.execute("BEGIN")
            return Session(conn)

        return open_session

    @pytest.fixture
    def make_store(
        self, store_urls: Iterator[str], clock: ManualClock
    ) -> Callable[[], TransportFactory]:
        return lambda: opener(next(store_urls), clock)


class TestSqliteMemory(TransportSuite):
    # One in-memory database per connection: every "handle" is the one transport, which
    # is neither durable nor reachable from another process.
    capabilities = frozenset({ADMIN, CLOCK, CONTROL, TENANTS, TIMERS})

    @pytest.fixture
    def make_transport(self, clock: ManualClock) -> Iterator[TransportFactory]:
        with open_transport("sqlite:///:memory:", clock=clock) as shared:

            def factory(**options: object) -> Transport[Any]:
                # Options ask for a handle of their own: a database of its own, here.
                if options:
                    return open_transport("sqlite:///:memory:", clock=clock, **options)
                return shared

            yield factory


class TestAsyncSqliteFile(_File, AsyncUrlSuite):
    @pytest.fixture
    def make_store(
        self, store_urls: Iterator[str], clock: ManualClock, _conformance_portal: Portal
    ) -> Callable[[], TransportFactory]:
        def store() -> TransportFactory:
            open_async = async_opener(next(store_urls), clock)

            def factory(**options: object) -> Transport[Any]:
                opened = _conformance_portal.call(lambda: open_async(**options))
                return BlockingTransport(_conformance_portal, opened)

            return factory

        return store
