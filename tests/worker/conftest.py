"""The queues the worker's own tests run on: one fresh queue per test, on each backend
of the repository that the runtime supports here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres.server import fresh_schema, with_schema

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def queue_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'queue.db'}"
        return
    with fresh_schema("work") as (server, schema):
        yield with_schema(server, schema, pool_min_size=0, pool_max_size=4)
