"""The crash test of `within`: a process that writes a row of its own and publishes in
one transaction, SIGKILLed at random points, leaves both or neither, every time."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from transports_core import open_transport

from . import _workers
from ._support import chain_problems, query

KILLS = 6


def rows_and_events(db: Path) -> tuple[list[int], list[int]]:
    rows = [n for (n,) in query(db, "SELECT n FROM mine ORDER BY n")]
    events = sorted(json.loads(raw)["n"] for (raw,) in query(db, "SELECT event FROM messages"))
    return rows, events


@pytest.mark.slow
def test_a_sigkilled_writer_leaves_its_row_and_its_message_both_or_neither(
    tmp_path: Path,
) -> None:
    db = tmp_path / "queue.db"
    open_transport(f"sqlite:///{db}").close()  # the queue's schema
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE mine (n INTEGER PRIMARY KEY)")
        conn.commit()
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    ctx = multiprocessing.get_context("spawn")
    written = [0]
    for kill in range(KILLS):
        ready = ctx.Queue()
        child = ctx.Process(target=_workers.write_and_publish, args=(str(db), written[-1], ready))
        child.start()
        try:
            assert ready.get(timeout=60) == "started"
            # Not synchronisation: where in its loop the writer is when it dies.
            time.sleep(rng.uniform(0.02, 0.3))
        finally:
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL

        rows, events = rows_and_events(db)
        assert rows == events, f"kill {kill} (seed {seed}): rows and messages differ"
        assert rows == list(range(len(rows))), f"kill {kill} (seed {seed})"
        assert chain_problems(db) == []
        assert len(rows) > written[-1], f"kill {kill} (seed {seed}): the writer wrote nothing"
        written.append(len(rows))
    # And the queue opens and hands its messages out in order after all that.
    with open_transport(f"sqlite:///{db}") as t:
        lease = t.claim("w", visibility=60)
        assert lease is not None
        assert lease.event.n == 0
