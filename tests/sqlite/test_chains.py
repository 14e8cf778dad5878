"""The file's own structure stays whole under every operation: each group's messages form
one chain in seq order from its head to its tail, its depth counts them, and no seq is
ever handed out twice. Random sequences of publishes, batches, claims, every way of
settling, burials (release and hold), requeues, discards and purges, checked after each
step by reading the file with plain sqlite3 (`chain_problems`)."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, Lease, LeaseLost, TransportError
from transports_core.conformance import ManualClock
from transports_sqlite import _sql as sql

from ._support import chain_problems
from .conftest import OpenDb

GROUPS = ("a", "b", "c", "d")
WEIGHTS = {
    "publish": 6,
    "batch": 3,
    "claim": 8,
    "settle": 8,
    "requeue": 3,
    "discard": 1,
    "purge": 1,
    "time": 2,
}


def test_checker_finds_a_broken_chain(open_db: OpenDb, db_path: Path) -> None:
    transport = open_db()
    transport.publish_many([("a", Event(i=i), 0) for i in range(3)])
    assert chain_problems(db_path) == []
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE messages SET next_seq = NULL WHERE seq = 2")
    assert chain_problems(db_path) == [
        "group 'a': chain [1, 2], messages [1, 2, 3]",
    ]
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE groups SET depth = 7")
    assert "group 'a': tail 3, depth 7 for [1, 2, 3]" in chain_problems(db_path)


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_keep_every_chain_whole(
    open_db: OpenDb, db_path: Path, clock: ManualClock, seed: int
) -> None:
    rng = random.Random(seed)
    handles = [
        open_db(),
        open_db(max_attempts=2, on_dead="release"),
        open_db(max_attempts=2, on_dead="hold"),
    ]
    admin = handles[0]
    leases: list[Lease[Any]] = []
    last_seq = 0
    kinds: dict[str, int] = {}

    def new_seqs(seqs: list[int]) -> None:
        nonlocal last_seq
        assert seqs == sorted(seqs), seqs
        assert seqs[0] > last_seq, (seqs, last_seq)
        last_seq = seqs[-1]

    for step in range(300):
        (kind,) = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "publish":
            new_seqs([admin.publish(rng.choice(GROUPS), Event(i=step), rng.randint(0, 2))])
        elif kind == "batch":
            items = [
                (rng.choice(GROUPS), Event(i=step), rng.randint(0, 2))
                for _ in range(rng.randint(1, 6))
            ]
            new_seqs(admin.publish_many(items))
        elif kind == "claim":
            dead = len(admin.dead_letters())
            lease = rng.choice(handles).claim("w", rng.choice([1.0, 30.0]))
            if len(admin.dead_letters()) > dead:
                kinds["buried"] = kinds.get("buried", 0) + 1
            if lease is not None:
                leases.append(lease)
        elif kind == "settle" and leases:
            lease = leases.pop(rng.randrange(len(leases)))
            settle = rng.choice(["ack", "nack", "nack", "park", "extend"])
            try:
                if settle == "ack":
                    admin.ack(lease)
                elif settle == "extend":
                    leases.append(admin.extend(lease, 5.0))
                else:
                    admin.nack(lease, delay=2.0 if settle == "park" else 0.0)
            except LeaseLost:
                pass  # lapsed and taken over: the fencing is the conformance suite's
        elif kind in ("requeue", "discard") and (letters := admin.dead_letters()):
            seq = rng.choice(letters).seq
            try:
                if getattr(admin, kind)(seq):
                    kinds[f"{kind}d"] = kinds.get(f"{kind}d", 0) + 1
            except TransportError:
                pass  # a lease or a held dead letter holds its group
        elif kind == "purge":
            if admin.purge_group(rng.choice(GROUPS)):
                kinds["purged"] = kinds.get("purged", 0) + 1
        elif kind == "time":
            clock.advance(rng.choice([0.5, 1.5, 3.0]))
        assert chain_problems(db_path) == [], f"after step {step} ({kind})"

    # Burials, requeues and purges really happened, so the test cannot pass by doing nothing.
    assert set(kinds) >= {"publish", "batch", "settle", "buried", "requeued", "purged"}, kinds


def _within(seconds: float, conn: sqlite3.Connection, call: Callable[[], object]) -> object:
    """``call()``'s value; a failure if it has not returned within ``seconds``, after
    interrupting what it runs on ``conn``, so that a loop fails the test, not hangs it."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        conn.interrupt()
        worker.join(10)
        pytest.fail(f"still walking after {seconds} s: a loop?")
    return result[0]


def test_walks_along_a_damaged_chain_end(open_db: OpenDb, db_path: Path) -> None:
    # Every link goes to a higher seq; a file damaged into a loop must not hang the walks.
    transport = open_db()
    transport.publish_many([("a", Event(i=i), 0) for i in range(3)])
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE messages SET next_seq = 1 WHERE seq = 3")  # 1 -> 2 -> 3 -> 1
    with closing(sqlite3.connect(db_path, check_same_thread=False)) as conn:
        walk = {"group_id": "a", "seq": 10}
        found = _within(10, conn, lambda: conn.execute(sql.PREDECESSOR.text, walk).fetchall())
        assert found == [(3,)]
    assert transport._engine.conn is not None
    assert _within(10, transport._engine.conn, lambda: transport.purge_group("a")) == 3
    assert chain_problems(db_path) == []
