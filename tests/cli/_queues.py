"""Real SQLite queues in known states, prepared with the library, for the admin commands
to read and repair; and a dump of every row, to tell exactly what a command changed."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from transports_core import Event, Lease, open_transport

LONG = 600.0  # seconds: leases and parks that cannot lapse while a test runs

Rows = dict[str, list[tuple[object, ...]]]


@dataclass(frozen=True)
class Prepared:
    """A queue file with (seqs in publish order):

    * ``leased`` (priority 0): seq 1 leased to worker ``w`` (in flight), seq 2 behind it;
    * ``parked`` (priority 0): seq 3, nacked with a long delay;
    * ``poison`` (priority 1): seq 4, nacked at its only allowed attempt, so the next
      claim made it a dead letter (the group is released, so it has no messages);
    * ``deep`` (priority 2): seqs 5, 6, 7, never claimed;
    * ``ready`` (priority 0): seq 8, never claimed.
    """

    path: Path
    url: str
    lease: Lease[Event]


def prepare(directory: Path) -> Prepared:
    path = directory / "queue.db"
    with open_transport(f"sqlite:///{path}?max_attempts=1") as queue:
        queue.publish("leased", Event(step=1))
        queue.publish("leased", Event(step=2))
        queue.publish("parked", Event(step=1))
        queue.publish("poison", Event(step=1), priority=1)
        heads: dict[str, Lease[Event]] = {}
        while (lease := queue.claim("w", LONG)) is not None:
            heads[lease.group_id] = lease
        assert sorted(heads) == ["leased", "parked", "poison"]
        queue.nack(heads["parked"], delay=LONG)
        queue.nack(heads["poison"])
        assert queue.claim("w", LONG) is None  # buries poison: its one attempt is spent
        for step in (1, 2, 3):
            queue.publish("deep", Event(step=step), priority=2)
        queue.publish("ready", Event(step=1))
    return Prepared(path, f"sqlite:///{path}", heads["leased"])


def rows(path: Path) -> Rows:
    """Every row of every table, in a fixed order (read with plain sqlite3)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"'), key=repr) for t in tables}
    finally:
        conn.close()


def seqs(path: Path, table: str) -> list[int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [seq for (seq,) in conn.execute(f'SELECT seq FROM "{table}" ORDER BY seq')]
    finally:
        conn.close()
