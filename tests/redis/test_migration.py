"""A queue's slot moves to another cluster node while workers run on it, as a reshard
does it: IMPORTING and MIGRATING, its keys MIGRATEd one at a time, then NODE.

While its keys are split between the nodes, the nodes answer a script with TRYAGAIN (the
source still has some of its keys) or ASK (it has none), and the target answers an
ASKING script with TRYAGAIN too, since a script declares keys that do not exist yet; the
transports wait that out and follow the MOVED that comes at the end, so workers pause
and go on. Nothing is lost or handled twice, no group is in two workers' hands at once,
and a call that waits longer than ``socket_timeout`` gives up having done nothing."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from transports_core import Event, TransportError, open_async_transport, open_transport
from transports_redis import RedisTransport

from . import _workers
from ._cluster import (
    client,
    close_migration,
    keys_left,
    local_cluster,
    migrate_key,
    open_migration,
    owner,
    slot_of,
)
from .server import PrivateServer

QUEUE = "mover"
GROUPS = 10
PER_GROUP = 60
WORKERS = 4  # two on each twin
PAUSE = 0.004  # seconds a worker takes per message, so the work outlasts the migration


@pytest.fixture
def cluster() -> Iterator[list[PrivateServer]]:
    with local_cluster() as nodes:
        yield nodes


def _asking_calls(node: PrivateServer) -> int:
    with client(node) as c:
        return int(c.info("commandstats").get("cmdstat_asking", {}).get("calls", 0))


def _in_thread(call: Callable[[], int]) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []

    def run() -> None:
        try:
            got.append(call())
        except BaseException as exc:  # the assertion below shows it
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


@pytest.mark.slow
def test_a_slot_migrating_under_workers_loses_and_doubles_nothing(
    cluster: list[PrivateServer], tmp_path: Path
) -> None:
    slot = slot_of(cluster[0], QUEUE)
    source = owner(cluster, slot)
    target = next(n for n in cluster if n is not source)
    url = f"{source.url}?queue={QUEUE}"
    with open_transport(url) as transport:
        items = [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
        seqs = transport.publish_many(items)
    published = {s: (g, e.n) for s, (g, e, _) in zip(seqs, items, strict=True)}

    spawn = multiprocessing.get_context("spawn")
    journals = [tmp_path / f"w{i}.journal" for i in range(WORKERS)]
    together = spawn.Barrier(WORKERS + 1)
    children = [
        spawn.Process(
            target=_workers.work_async if i % 2 else _workers.work,
            args=(url, f"w{i}", str(journal), together, PAUSE),
        )
        for i, journal in enumerate(journals)
    ]
    for child in children:
        child.start()
    try:
        together.wait(60)
        with open_transport(url) as watcher:
            deadline = time.monotonic() + 60
            while watcher.stats().ready > len(items) * 0.8:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "the workers made no progress"
                time.sleep(0.02)
        asked_before = _asking_calls(target)

        open_migration(slot, source, target)
        opened = time.monotonic_ns()
        keys = keys_left(source, slot)
        assert len(keys) >= 5
        for key in keys:  # one at a time: the queue's keys are split for a while
            migrate_key(source, target, key)
            time.sleep(0.05)
        assert keys_left(source, slot) == []

        # Every key is on the target, the slot still the source's: calls go round
        # (ASK, then TRYAGAIN from the target) until it is settled. One that may not
        # wait that long gives up, having done nothing.
        with (
            open_transport(url, socket_timeout=0.5) as impatient,
            pytest.raises(TransportError, match=r"did not settle within 0\.5 s; nothing was"),
        ):
            impatient.publish("probe", Event(n=-1))
        waiting = [
            _in_thread(lambda: _publish_sync(url, -2)),
            _in_thread(lambda: asyncio.run(_publish_async(url, -3))),
        ]
        time.sleep(0.3)
        assert [got for thread, got in waiting if not thread.is_alive()] == []  # held
        closing = time.monotonic_ns()
        close_migration(cluster, slot, source, target)
        closed = time.monotonic_ns()
        probes = []
        for thread, got in waiting:
            thread.join(30)
            assert len(got) == 1
            assert isinstance(got[0], int), got[0]
            probes.append(got[0])
        assert _asking_calls(target) > asked_before  # an ASK was followed to the target
    finally:
        # Whatever failed, the workers must be able to end: the migration is finished.
        for key in keys_left(source, slot):
            migrate_key(source, target, key)
        close_migration(cluster, slot, source, target)
        for child in children:
            child.join(120)
    assert [child.exitcode for child in children] == [0] * WORKERS

    with open_transport(url) as transport:  # through the old node: MOVED, then the new
        assert isinstance(transport, RedisTransport)
        assert transport.check() == []
        left = []
        while (lease := transport.claim("late", 30)) is not None:
            left.append(lease.seq)
            transport.ack(lease)
        assert transport.check() == []
        assert transport._home == ("127.0.0.1", target.port)
    _workers.check_journals(journals, published, skip_groups={"probe"})
    rows = [row.split() for journal in journals for row in journal.read_text().splitlines()]
    probes_handled = [int(seq) for seq, group, *_ in rows if group == "probe"]
    assert sorted(probes_handled + left) == sorted(probes)  # each probe once, none lost
    # The workers were at it on both sides of the migration, and claimed nothing while
    # it ran (a claim answered just before MIGRATING may return a little after it).
    starts = [int(start) for _, _, _, _, start, _ in rows]
    assert min(starts) < opened
    assert max(starts) > closed
    during = [(s - opened) / 1e6 for s in starts if opened + 200_000_000 < s < closing]
    assert not during, f"claims {during} ms into a migration of {(closing - opened) / 1e6} ms"


def _publish_sync(url: str, n: int) -> int:
    with open_transport(url) as transport:
        return transport.publish("probe", Event(n=n))


async def _publish_async(url: str, n: int) -> int:
    async with open_async_transport(url) as transport:
        return await transport.publish("probe", Event(n=n))
