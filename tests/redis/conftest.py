"""Fixtures for the Redis tests: a queue of their own on the server (see `server`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from transports_core import Event, Transport, open_transport

from .server import fresh_queue, with_queue


@pytest.fixture
def server_queue() -> Iterator[tuple[str, str]]:
    """(server URL, queue name): checked and deleted when the test ends."""
    with fresh_queue("tr") as pair:
        yield pair


@pytest.fixture
def queue_url(server_queue: tuple[str, str]) -> str:
    return with_queue(*server_queue)


@pytest.fixture
def queue(queue_url: str) -> Iterator[Transport[Event]]:
    with open_transport(queue_url) as transport:
        yield transport


@pytest.fixture
def raw(server_queue: tuple[str, str]) -> Iterator[redis.Redis]:
    """A plain client on the server, outside any transport."""
    client = redis.Redis.from_url(server_queue[0], decode_responses=True)
    yield client
    client.close()
