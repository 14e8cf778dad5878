"""Fixtures for the Redis tests: a queue of their own on the server (see `server`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests._services import scratch_fixture

from .server import fresh_queue, with_queue

# (server URL, queue name): checked and deleted when the test ends.
server_queue = scratch_fixture("server_queue", lambda: fresh_queue("tr"))


@pytest.fixture
def queue_url(server_queue: tuple[str, str]) -> str:
    return with_queue(*server_queue)


@pytest.fixture
def raw(server_queue: tuple[str, str]) -> Iterator[redis.Redis]:
    """A plain client on the server, outside any transport."""
    client = redis.Redis.from_url(server_queue[0], decode_responses=True)
    yield client
    client.close()
