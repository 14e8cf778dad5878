"""The conformance suite against the Redis backend of this repo, sync and async. Each test
gets a queue of its own on the server; after the test the read-only invariant script
checks its structures, then its keys are deleted.

"durable" here is the suite's sense: the queue outlives its handles (closing every handle
and opening a new one loses nothing), which holds on any server that is not restarted.
What survives a crash of the server itself is tested on a private AOF server in
``tests/redis/test_durability.py``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import pytest

from conformance._suites import AsyncUrlSuite, UrlSuite
from tests.redis.server import fresh_queue, with_queue
from transports_core.conformance import CAPABILITIES, PARALLEL_CLAIMS, WITHIN


class _OwnQueue:
    # Not parallel-claims: a script runs alone on the server, so claims serialize and
    # strict round-robin holds. Not within: Redis has no transaction another connection
    # can share, so within refuses (the within-refuses property checks that it does).
    capabilities: ClassVar[Iterable[str]] = CAPABILITIES - {PARALLEL_CLAIMS, WITHIN}

    @pytest.fixture
    def transport_url(self) -> Iterator[str]:
        with fresh_queue("conf") as (url, queue):
            yield with_queue(url, queue)


class TestRedis(_OwnQueue, UrlSuite):
    pass


class TestAsyncRedis(_OwnQueue, AsyncUrlSuite):
    pass
