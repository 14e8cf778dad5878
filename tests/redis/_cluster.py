"""A three-node local Redis Cluster on free ports (private servers, as in `server`), and
the steps of moving one slot from a node to another by hand, as ``redis-cli --cluster
reshard`` does: IMPORTING on the target, MIGRATING on the source, MIGRATE of the keys,
then NODE on every node."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from transports_core import open_async_transport

from .server import PrivateServer


@contextmanager
def local_cluster(size: int = 3, replicas: int = 0, *extra: str) -> Iterator[list[PrivateServer]]:
    """``size`` servers, ``replicas`` replicas a primary (``size / (1 + replicas)``
    primaries), every slot assigned; ``extra``: more server arguments; stopped and
    removed after."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed for the cluster tests")
    root = Path(tempfile.mkdtemp(prefix="dt-cluster-"))
    nodes: list[PrivateServer] = []
    try:
        for i in range(size):
            directory = root / f"n{i}"
            directory.mkdir()
            node = PrivateServer(
                directory, "--cluster-enabled", "yes",
                "--cluster-config-file", str(directory / "nodes.conf"), *extra,
            )  # fmt: skip
            node.start()
            nodes.append(node)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for node in nodes:
            with client(node) as c:
                deadline = time.monotonic() + 30
                while c.cluster("INFO").get("cluster_state") != "ok":
                    assert time.monotonic() < deadline, "the cluster did not come up"
                    time.sleep(0.1)
        yield nodes
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def client(node: PrivateServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=node.port, decode_responses=True)
    try:
        yield c
    finally:
        c.close()


def command(node: PrivateServer, *args: object) -> Any:
    """One command on ``node``, its reply decoded."""
    with client(node) as c:
        return c.execute_command(*args)  # type: ignore[no-untyped-call]


def slot_of(node: PrivateServer, queue: str) -> int:
    return int(command(node, "CLUSTER KEYSLOT", f"dt:{{{queue}}}:seq"))


def owner(nodes: list[PrivateServer], slot: int) -> PrivateServer:
    for start, end, (_, port, *_rest), *_replicas in command(nodes[0], "CLUSTER SLOTS"):
        if start <= slot <= end:
            return next(n for n in nodes if n.port == int(port))
    raise AssertionError(f"no node serves slot {slot}")


def claim_and_ack_async(url: str) -> tuple[int, int]:
    """One claim and its ack on the async twin through ``url``: the lease's seq and its
    event's ``n``."""

    async def run() -> tuple[int, int]:
        async with open_async_transport(url) as transport:
            lease = await transport.claim("w", 5)
            assert lease is not None
            await transport.ack(lease)
            return lease.seq, lease.event.n

    return asyncio.run(run())


def node_id(node: PrivateServer) -> str:
    return str(command(node, "CLUSTER MYID"))


def open_migration(slot: int, source: PrivateServer, target: PrivateServer) -> None:
    command(target, "CLUSTER SETSLOT", slot, "IMPORTING", node_id(source))
    command(source, "CLUSTER SETSLOT", slot, "MIGRATING", node_id(target))


def keys_left(node: PrivateServer, slot: int) -> list[str]:
    return list(command(node, "CLUSTER GETKEYSINSLOT", slot, 1000))


def migrate_key(source: PrivateServer, target: PrivateServer, key: str) -> None:
    command(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", key)


def close_migration(
    nodes: list[PrivateServer], slot: int, source: PrivateServer, target: PrivateServer
) -> None:
    """The slot is the target's: told to the target first, then the source, then the rest."""
    new = node_id(target)
    rest = [n for n in nodes if n is not source and n is not target]
    for node in (target, source, *rest):
        command(node, "CLUSTER SETSLOT", slot, "NODE", new)
