"""A three-node local cluster on free ports: queues spread over its slots, each served by
the node that owns it (a MOVED reply is followed), with processes contending on each."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from transports_core import Event, open_transport
from transports_redis import RedisTransport

from . import _workers
from ._cluster import local_cluster, owner, slot_of
from .server import PrivateServer

GROUPS = 12
PER_GROUP = 25
WORKERS = 4
QUEUES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")


@pytest.fixture
def cluster() -> Iterator[list[PrivateServer]]:
    with local_cluster() as nodes:
        yield nodes


@pytest.mark.slow
def test_queues_over_a_cluster_s_slots_each_keep_their_contract(
    cluster: list[PrivateServer], tmp_path: Path
) -> None:
    entry = cluster[0].url  # every queue is opened through one node; MOVED does the rest
    owners = {owner(cluster, slot_of(cluster[0], queue)).port for queue in QUEUES}
    assert len(owners) >= 2  # the queues really are spread over the nodes
    spawn = multiprocessing.get_context("spawn")
    children = []
    published: dict[str, dict[int, tuple[str, int]]] = {}
    for queue in QUEUES:
        url = f"{entry}?queue={queue}"
        with open_transport(url) as transport:
            items = [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
            seqs = transport.publish_many(items)
            published[queue] = {s: (g, e.n) for s, (g, e, _) in zip(seqs, items, strict=True)}
        for i in range(WORKERS // 2):
            journal = tmp_path / f"{queue}-{i}.journal"
            worker = spawn.Process(target=_workers.work, args=(url, f"w{i}", str(journal)))
            children.append((queue, journal, worker))
    for _, _, child in children:
        child.start()
    for _, _, child in children:
        child.join(120)
        assert child.exitcode == 0
    for queue in QUEUES:
        journals = [journal for q, journal, _ in children if q == queue]
        _workers.check_journals(journals, published[queue])
        with open_transport(f"{entry}?queue={queue}") as transport:
            assert isinstance(transport, RedisTransport)
            assert transport.check() == []
            assert transport.claim("after", 5) is None
