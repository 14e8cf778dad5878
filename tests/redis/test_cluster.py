"""Local clusters on free ports: queues spread over a three-node cluster's slots, each
served by the node that owns it (a MOVED reply is followed), with processes contending on
each; a ``redis+cluster://`` URL that finds the queue's node through its seeds; and a
six-node cluster (three primaries, a replica each) whose queue's primary is SIGKILLed
while a publisher and a consumer run with ``wait_replicas=1``."""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from conformance._suites import AsyncUrlSuite, UrlSuite
from transports_core import Event, TransportError, open_async_transport, open_transport
from transports_core.conformance import CAPABILITIES, PARALLEL_CLAIMS, WITHIN
from transports_redis import RedisTransport
from transports_redis._url import parse_url

from . import _failover, _workers
from ._cluster import claim_and_ack_async, command, local_cluster, owner, slot_of
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


def cluster_url(nodes: list[PrivateServer], queue: str, query: str = "") -> str:
    seeds = ",".join(f"127.0.0.1:{node.port}" for node in nodes)
    return f"redis+cluster://{seeds}/?queue={queue}{query}"


def test_a_cluster_url_finds_the_queue_s_node_through_any_seed_that_answers(
    cluster: list[PrivateServer],
) -> None:
    dead = PrivateServer(cluster[0].directory)  # a free port that nothing listens on
    queue = "seeded"
    home = owner(cluster, slot_of(cluster[0], queue))
    others = [node for node in cluster if node is not home]
    # The seeds name neither the queue's node nor, first, a live one.
    url = cluster_url([dead, *others], queue)
    with open_transport(url) as transport:
        seq = transport.publish("g", Event(n=1))
    assert command(home, "EXISTS", f"dt:{{{queue}}}:seq") == 1  # on the slot's node

    assert claim_and_ack_async(url) == (seq, 1)


def test_when_no_seed_answers_the_error_names_each_seed_and_why(tmp_path: Path) -> None:
    dead = [PrivateServer(tmp_path) for _ in range(2)]  # free ports nothing listens on
    url = cluster_url(dead, "nowhere", "&socket_timeout=2")
    for node in dead:
        # Each seed is tried once, at once: no retries with back-off before the next.
        started = time.monotonic()
        with pytest.raises(TransportError, match="no cluster node answered") as raised:
            open_transport(url)
        assert time.monotonic() - started < 2
        assert f"127.0.0.1:{node.port}: " in str(raised.value)
    with pytest.raises(TransportError, match=f"127.0.0.1:{dead[1].port}: "):
        asyncio.run(_open_async(url))


async def _open_async(url: str) -> None:
    async with open_async_transport(url):
        pass


def test_a_database_number_on_a_cluster_is_refused_naming_it(
    cluster: list[PrivateServer],
) -> None:
    with pytest.raises(ValueError, match=r"a Redis Cluster has only database 0.*'/1'"):
        open_transport(cluster_url(cluster, "db").replace("/?", "/1?"))
    # Through a plain URL, the node refuses SELECT: said plainly, with the way out.
    plain = cluster[0].url.replace("/0", "/1") + "?queue=db"
    with pytest.raises(TransportError, match=r"only database 0.*redis\+cluster://"):
        open_transport(plain)


def _replicated(node: PrivateServer) -> bool:
    info = command(node, "INFO", "replication")  # decoded by redis-py
    return bool(info.get("connected_slaves") == 1 and info["slave0"]["state"] == "online")


@pytest.mark.slow
@pytest.mark.parametrize("form", ["cluster", "plain"])
def test_after_a_primary_is_killed_calls_go_to_its_promoted_replica_and_lose_nothing(
    tmp_path: Path, form: str
) -> None:
    """Six servers (three primaries, a replica each); a publisher (sync) and a consumer
    (async) run with ``wait_replicas=1`` while the queue's primary is SIGKILLed, its
    replica promoted, and the old primary restarted (it comes back as a replica). The
    URL is a ``redis+cluster://`` one naming every node, or a plain ``redis://`` one
    naming the primary that is killed: a cluster node, which the handle seeds from."""
    with local_cluster(6, 1, "--cluster-node-timeout", "1000") as nodes:
        queue = "failover"
        primary = owner(nodes, slot_of(nodes[0], queue))
        deadline = time.monotonic() + 30
        while not _replicated(primary):
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.05)
        query = "&wait_replicas=1&socket_timeout=5"
        if form == "plain":
            url = f"{primary.url}?queue={queue}{query}"
        else:
            url = cluster_url(nodes, queue, query)
        published, consumed = tmp_path / "publisher", tmp_path / "consumer"
        stop = tmp_path / "stop"
        spawn = multiprocessing.get_context("spawn")
        publisher = spawn.Process(target=_failover.publish, args=(url, str(published), 600, 90))
        consumer = spawn.Process(
            target=_failover.consume, args=(url, str(consumed), str(stop), 150)
        )
        publisher.start()
        consumer.start()
        try:
            deadline = time.monotonic() + 60
            while not published.exists() or published.read_text().count("\n") < 150:
                assert time.monotonic() < deadline, "the publisher did not get going"
                time.sleep(0.05)
            killed_at = time.time()
            primary.kill()
            if form == "cluster":
                # A handle opened now, before the replica is promoted, reads a map that
                # still names the dead primary: it waits for the promotion as a call does
                # (up to socket_timeout), on both twins.
                waiting = cluster_url(nodes, queue, "&socket_timeout=30")
                asyncio.run(_open_async(waiting))
                open_transport(waiting).close()
            # The new primary has no replica, so every write raises NotReplicated
            # until the old node comes back, as a replica of the one that replaced it.
            deadline = time.monotonic() + 30
            live = next(node for node in nodes if node is not primary)
            asked = [live, *nodes]  # `owner` asks the first one, which must be up
            while owner(asked, slot_of(live, queue)) is primary:
                assert time.monotonic() < deadline, "the replica was not promoted"
                time.sleep(0.05)
            # Calls reach the promoted replica while the old primary is still down.
            deadline = time.monotonic() + 30
            while "NotReplicated" not in published.read_text():
                assert time.monotonic() < deadline, "no call reached the new primary"
                time.sleep(0.05)
            primary.start()
            publisher.join(120)
            assert publisher.exitcode == 0
            stop.touch()
            consumer.join(150)
            assert consumer.exitcode == 0
        finally:
            for child in (publisher, consumer):
                if child.is_alive():
                    child.kill()
        assert owner(asked, slot_of(live, queue)) is not primary
        outcome = _failover.read_publisher(published, killed_at)
        assert len(outcome.published) == 600
        assert outcome.before >= 150
        assert outcome.recovered_after < 10, outcome
        assert outcome.longest_gap < 10, outcome
        drained = []
        with open_transport(url) as transport:
            assert isinstance(transport, RedisTransport)
            while (
                lease := transport.claim("drain", 30, wait=_failover.VISIBILITY + 1)
            ) is not None:
                drained.append((lease.seq, int(lease.event.n)))
                transport.ack(lease)
            assert transport.check() == []
        _failover.check_nothing_acknowledged_lost(outcome, consumed, drained)
        print(  # the figures for the commit message (pytest -s)
            f"recovered {outcome.recovered_after:.2f} s after the kill; longest gap "
            f"{outcome.longest_gap:.2f} s; "
            f"{outcome.failed} publishes raised; {len(drained)} drained after the run"
        )


def test_a_cluster_url_names_its_seed_nodes_and_keeps_the_password_out_of_sight() -> None:
    options = parse_url("redis+cluster://app:s3cret@h1:7000,h2,[::1]:7002/?queue=q", {})
    assert options.topology == "cluster"
    assert options.nodes == (("h1", 7000), ("h2", 6379), ("::1", 7002))
    assert options.node_url(("10.0.0.5", 7005)) == "redis://app:s3cret@10.0.0.5:7005"
    assert "s3cret" not in repr(options)
    tls = parse_url("rediss+cluster://h1:7000/?queue=q&ssl_cert_reqs=none", {})
    assert tls.node_url(("h9", 1)) == "rediss://h9:1"
    assert tls.tls["ssl_cert_reqs"] == "none"
    waits = parse_url("redis+cluster://h1:7000/?wait_replicas=1&wait_timeout=0.5", {})
    assert (waits.wait_replicas, waits.wait_timeout) == (1, 0.5)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://h1:7000,h2:7001/3?queue=q", "only database 0, so the URL cannot"),
        ("redis+cluster://h1:7000/?db=2", "only database 0"),
        ("redis+cluster://h1:7000,h2:x/?queue=q", "'h2:x' is not a host"),
        ("redis+cluster://h1:7000,,h2/?queue=q", "'' is not a host"),
        ("redis+cluster:///?queue=q", "names no node"),
        ("redis+cluster://h1/orders?queue=q", "has no path"),
        ("redis+cluster://h1/?ssl_cert_reqs=none", "need a rediss://"),
        ("redis+cluster://h1/?wait_replicas=-1", "wait_replicas must be"),
        ("redis+cluster://h1/?wait_replicas=1&wait_timeout=10", "must be shorter than"),
    ],
)
def test_a_bad_cluster_url_is_refused_naming_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_url(url, {})


@pytest.fixture(scope="module")
def replicated_cluster() -> Iterator[list[PrivateServer]]:
    """Six servers, three primaries with a replica each, for every test of a class."""
    with local_cluster(6, 1) as nodes:
        deadline = time.monotonic() + 30
        for node in nodes:
            while command(node, "INFO", "replication")["role"] == "master" and not _replicated(
                node
            ):
                assert time.monotonic() < deadline, "the replicas did not catch up"
                time.sleep(0.05)
        yield nodes


class _OnTheCluster:
    """The conformance suite through a ``redis+cluster://`` URL with ``wait_replicas=1``:
    every call found through the slot map, every write confirmed by a replica."""

    capabilities: ClassVar[Iterable[str]] = CAPABILITIES - {PARALLEL_CLAIMS, WITHIN}
    same_arguments_as_direct = True  # see tests/conftest.py

    @pytest.fixture
    def transport_url(self, replicated_cluster: list[PrivateServer]) -> str:
        queue = f"conf-{uuid.uuid4().hex[:12]}"
        return cluster_url(replicated_cluster, queue, "&wait_replicas=1")


@pytest.mark.slow
class TestClusterConformance(_OnTheCluster, UrlSuite):
    pass


@pytest.mark.slow
class TestAsyncClusterConformance(_OnTheCluster, AsyncUrlSuite):
    pass
