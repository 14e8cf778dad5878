"""A store of a benchmark's own on a shared server: a fresh name, removed at the end
whatever happened (a run stopped by SIGTERM too: the benchmarks turn it into an exit)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch(prefix: str, remove: Callable[[str], None]) -> Iterator[str]:
    """``prefix`` with a random suffix; ``remove(name)`` when the block ends."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        remove(name)


@contextmanager
def own_queue(url: str | None, prefix: str) -> Iterator[str]:
    """A queue of the run's own, removed at the end: a SQLite file in a temporary
    directory when ``url`` is None; on a PostgreSQL or Redis server ``url`` names, a
    scratch schema or queue, unless ``url`` names one itself (``schema=``/``queue=``),
    which is then used as it is and kept. Figures from a queue of one's own compare
    across runs: a shared one keeps growing (keys are remembered for a day)."""
    if url is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as where:
            yield f"sqlite:///{Path(where) / 'queue.db'}"
        return
    scheme, _, rest = url.partition("://")
    base, _, query = rest.partition("?")
    joiner = "&" if query else "?"
    if scheme in ("postgresql", "postgres") and "schema=" not in query:
        import psycopg

        def drop_schema(name: str) -> None:
            with psycopg.connect(f"{scheme}://{base}", autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

        with scratch(f"{prefix.replace('-', '_')}", drop_schema) as name:
            yield f"{url}{joiner}schema={name}"
        return
    if scheme in ("redis", "rediss") and "queue=" not in query:
        import redis

        def drop_queue(name: str) -> None:
            client = redis.Redis.from_url(f"{scheme}://{base}")
            keys = list(client.scan_iter(match=f"dt:{{{name}}}:*", count=1000))
            for i in range(0, len(keys), 1000):
                client.delete(*keys[i : i + 1000])
            client.close()

        with scratch(prefix, drop_queue) as name:
            yield f"{url}{joiner}queue={name}"
        return
    yield url
