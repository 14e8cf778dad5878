"""Fixtures shared by the service tests: each directory's conftest says where its store is
(a ``queue_url`` fixture); `queue` opens a transport on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from transports_core import Event, Transport, open_transport


@pytest.fixture
def queue(queue_url: str) -> Iterator[Transport[Event]]:
    """A transport on the test's own queue, closed when the test ends."""
    with open_transport(queue_url) as transport:
        yield transport
