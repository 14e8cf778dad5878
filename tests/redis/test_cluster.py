"""A three-node local cluster on free ports: queues spread over its slots, each served by
the node that owns it (a MOVED reply is followed once), with processes contending on each."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from transports_core import Event, open_transport
from transports_redis import RedisTransport

from . import _workers
from .server import PrivateServer
from .test_processes import GROUPS, PER_GROUP, WORKERS

QUEUES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")


@pytest.fixture
def cluster() -> Iterator[list[PrivateServer]]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed for the cluster test")
    root = Path(tempfile.mkdtemp(prefix="dt-cluster-"))
    nodes: list[PrivateServer] = []
    try:
        for i in range(3):
            directory = root / f"n{i}"
            directory.mkdir()
            node = PrivateServer(
                directory, "--cluster-enabled", "yes",
                "--cluster-config-file", str(directory / "nodes.conf"),
            )  # fmt: skip
            node.start()
            nodes.append(node)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        client = redis.Redis(port=nodes[0].port, decode_responses=True)
        deadline = time.monotonic() + 30
        while client.cluster("INFO").get("cluster_state") != "ok":
            assert time.monotonic() < deadline, "the cluster did not come up"
            time.sleep(0.1)
        client.close()
        yield nodes
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_queues_over_a_cluster_s_slots_each_keep_their_contract(
    cluster: list[PrivateServer], tmp_path: Path
) -> None:
    entry = cluster[0].url  # every queue is opened through one node; MOVED does the rest
    owners = set()
    client = redis.Redis(port=cluster[0].port)
    for queue in QUEUES:
        slot = int(client.cluster("KEYSLOT", f"dt:{{{queue}}}:seq"))
        owners.add(slot * 3 // 16384)
    client.close()
    assert len(owners) >= 2  # the queues really are spread over the nodes
    spawn = multiprocessing.get_context("spawn")
    children = []
    for queue in QUEUES:
        url = f"{entry}?queue={queue}"
        with open_transport(url) as transport:
            items = [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
            transport.publish_many(items)
        for i in range(WORKERS // 2):
            journal = tmp_path / f"{queue}-{i}.journal"
            children.append(
                (
                    queue,
                    journal,
                    spawn.Process(target=_workers.work, args=(url, f"w{i}", str(journal))),
                )
            )
    for _, _, child in children:
        child.start()
    for _, _, child in children:
        child.join(120)
        assert child.exitcode == 0
    for queue in QUEUES:
        lines = [
            line.split()
            for q, journal, _ in children
            if q == queue
            for line in journal.read_text().splitlines()
        ]
        assert len(lines) == GROUPS * PER_GROUP
        by_group: dict[str, list[tuple[int, int]]] = {}
        for _, group, n, _, start, _ in lines:
            by_group.setdefault(group, []).append((int(start), int(n)))
        for spans in by_group.values():
            assert [n for _, n in sorted(spans)] == list(range(PER_GROUP))
        with open_transport(f"{entry}?queue={queue}") as transport:
            assert isinstance(transport, RedisTransport)
            assert transport.check() == []
            assert transport.claim("after", 5) is None
