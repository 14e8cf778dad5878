"""The suite classes this repository's backends share: each test's store is the one at the
URL of the subclass's ``transport_url`` fixture, opened with the suite's manual clock."""

from __future__ import annotations

from typing import Any

import pytest

from transports_core import open_async_transport, open_transport
from transports_core.conformance import (
    AsyncTransportFactory,
    AsyncTransportSuite,
    ManualClock,
    TransportFactory,
    TransportSuite,
)


def opener(url: str, clock: ManualClock) -> TransportFactory:
    """Opens handles on the store at ``url`` that read ``clock``."""
    return lambda **options: open_transport(url, clock=clock, **options)


def async_opener(url: str, clock: ManualClock) -> AsyncTransportFactory:
    """`opener` for the async twin."""
    return lambda **options: open_async_transport(url, clock=clock, **options)


class UrlSuite(TransportSuite):
    @pytest.fixture
    def make_transport(self, transport_url: str, clock: ManualClock) -> TransportFactory:
        return opener(transport_url, clock)


class AsyncUrlSuite(AsyncTransportSuite):
    @pytest.fixture
    def make_async_transport(self, transport_url: str, clock: ManualClock) -> AsyncTransportFactory:
        return async_opener(transport_url, clock)


class Session:
    """A connection of the caller's own to the test's store, for ``join_session``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def close(self) -> None:
        self.conn.close()


class AsyncSession:
    """`Session` over an async driver's connection, for ``join_async_session``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        await self.conn.rollback()

    async def close(self) -> None:
        await self.conn.close()
