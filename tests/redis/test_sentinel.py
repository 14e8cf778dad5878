"""``redis+sentinel://`` URLs: a private primary, a replica of it and a Sentinel watching
them, each on a free port in a temporary directory, stopped and removed after. A handle
finds the primary through the Sentinel; when a failover is forced during a run with
``wait_replicas=1``, calls go to the new primary within seconds and nothing whose call
returned is lost or numbered twice."""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

from conformance._suites import AsyncUrlSuite, UrlSuite
from transports_core import Event, TransportError, open_async_transport, open_transport
from transports_core.conformance import CAPABILITIES, PARALLEL_CLAIMS, WITHIN
from transports_redis import RedisTransport
from transports_redis._url import parse_url

from . import _failover
from .server import PrivateServer, free_port, private_server

SERVICE = "dtsvc"


@dataclass
class Watched:
    primary: PrivateServer
    replica: PrivateServer
    sentinel_port: int

    def url(self, query: str = "") -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}?queue=sq{query}"

    def sentinel(self, *args: object) -> Any:
        client = redis.Redis(port=self.sentinel_port, decode_responses=True)
        try:
            return client.execute_command(*args)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def primary_port(self) -> int:
        return int(self.sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])


def _info(port: int) -> dict[str, Any]:
    client = redis.Redis(port=port, decode_responses=True)
    try:
        return dict(client.info("replication"))
    finally:
        client.close()


@contextmanager
def _sentinel(primary: PrivateServer) -> Iterator[int]:
    directory = Path(tempfile.mkdtemp(prefix="dt-sentinel-"))
    port = free_port()
    (directory / "sentinel.conf").write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
    )
    process = subprocess.Popen(
        ["redis-server", str(directory / "sentinel.conf"), "--sentinel",
         "--logfile", str(directory / "sentinel.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield port
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def watched() -> Iterator[Watched]:
    with _watched() as setup:
        yield setup


@pytest.fixture(scope="module")
def watched_for_the_module() -> Iterator[Watched]:
    with _watched() as setup:
        yield setup


@contextmanager
def _watched() -> Iterator[Watched]:
    with ExitStack() as stack:
        primary = stack.enter_context(private_server())
        replica = stack.enter_context(private_server("--replicaof", "127.0.0.1", str(primary.port)))
        port = stack.enter_context(_sentinel(primary))
        setup = Watched(primary, replica, port)
        deadline = time.monotonic() + 30
        while True:  # the replica is in sync, and the Sentinel knows it
            try:
                replicas = setup.sentinel("SENTINEL", "REPLICAS", SERVICE)
            except redis.ConnectionError:
                replicas = []
            info = _info(primary.port)
            if (
                info.get("connected_slaves") == 1
                and info["slave0"]["state"] == "online"
                and any("s_down" not in str(r) for r in replicas)
            ):
                break
            assert time.monotonic() < deadline, "the Sentinel did not see the replica"
            time.sleep(0.05)
        yield setup


def test_a_sentinel_url_names_its_sentinels_and_service() -> None:
    options = parse_url("redis+sentinel://:pw@s1,s2:26380/orders-main?queue=q&db=3", {})
    assert (options.topology, options.service, options.db) == ("sentinel", "orders-main", 3)
    assert options.nodes == (("s1", 26379), ("s2", 26380))
    assert options.node_url(("10.1.1.1", 6379)) == "redis://:pw@10.1.1.1:6379/3"
    for url, message in [
        ("redis+sentinel://s1:26379/?queue=q", "names the service as its path"),
        ("redis+sentinel://s1:26379/a/b?queue=q", "names the service as its path"),
        ("redis+sentinel://s1:0/svc?queue=q", "'s1:0' is not a host"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_url(url, {})


def test_a_sentinel_url_reaches_the_primary_it_names(watched: Watched) -> None:
    with open_transport(watched.url()) as transport:
        seq = transport.publish("g", Event(n=1))
    assert _info(watched.primary.port)["role"] == "master"
    raw = redis.Redis(port=watched.primary.port)
    assert raw.get("dt:{sq}:seq") == str(seq).encode()  # on the primary
    raw.close()

    async def claim() -> int:
        async with open_async_transport(watched.url()) as transport:
            lease = await transport.claim("w", 5)
            assert lease is not None
            await transport.ack(lease)
            return lease.seq

    assert asyncio.run(claim()) == seq
    url = watched.url().replace(f"/{SERVICE}?", "/no-such-service?")
    with pytest.raises(TransportError, match="no Sentinel named a primary for service"):
        open_transport(url)


@pytest.mark.slow
def test_a_forced_failover_during_a_run_loses_nothing_with_wait_replicas(
    watched: Watched, tmp_path: Path
) -> None:
    url = watched.url("&wait_replicas=1&socket_timeout=5")
    published, consumed, stop = tmp_path / "publisher", tmp_path / "consumer", tmp_path / "stop"
    spawn = multiprocessing.get_context("spawn")
    publisher = spawn.Process(target=_failover.publish, args=(url, str(published), 600, 90))
    consumer = spawn.Process(target=_failover.consume, args=(url, str(consumed), str(stop), 150))
    publisher.start()
    consumer.start()
    try:
        deadline = time.monotonic() + 60
        while not published.exists() or published.read_text().count("\n") < 150:
            assert time.monotonic() < deadline, "the publisher did not get going"
            time.sleep(0.05)
        assert watched.sentinel("SENTINEL", "FAILOVER", SERVICE)
        deadline = time.monotonic() + 30
        while watched.primary_port() != watched.replica.port:
            assert time.monotonic() < deadline, "the Sentinel did not promote the replica"
            time.sleep(0.01)
        promoted_at = time.time()
        publisher.join(120)
        assert publisher.exitcode == 0
        stop.touch()
        consumer.join(150)
        assert consumer.exitcode == 0
    finally:
        for child in (publisher, consumer):
            if child.is_alive():
                child.kill()
    assert watched.primary_port() == watched.replica.port  # and stayed so
    outcome = _failover.read_publisher(published, promoted_at)
    assert len(outcome.published) == 600
    assert outcome.recovered_after < 10, outcome
    assert outcome.longest_gap < 10, outcome
    drained = []
    with open_transport(url) as transport:
        assert isinstance(transport, RedisTransport)
        while (lease := transport.claim("drain", 30, wait=_failover.VISIBILITY + 1)) is not None:
            drained.append((lease.seq, int(lease.event.n)))
            transport.ack(lease)
        assert transport.check() == []
    _failover.check_nothing_acknowledged_lost(outcome, consumed, drained)
    print(  # the figures for the commit message (pytest -s)
        f"recovered {outcome.recovered_after:.2f} s after the promotion; longest gap "
        f"{outcome.longest_gap:.2f} s; "
        f"{outcome.failed} publishes raised; {len(drained)} drained after the run"
    )


class _ThroughSentinel:
    """The conformance suite through a ``redis+sentinel://`` URL with
    ``wait_replicas=1``: the primary found through the Sentinel, every write confirmed
    by the replica."""

    capabilities: ClassVar[Iterable[str]] = CAPABILITIES - {PARALLEL_CLAIMS, WITHIN}
    same_arguments_as_direct = True  # see tests/conftest.py

    @pytest.fixture
    def transport_url(self, watched_for_the_module: Watched) -> str:
        url = watched_for_the_module.url("&wait_replicas=1")
        return url.replace("queue=sq", f"queue=conf-{uuid.uuid4().hex[:12]}")


@pytest.mark.slow
class TestSentinelConformance(_ThroughSentinel, UrlSuite):
    pass


@pytest.mark.slow
class TestAsyncSentinelConformance(_ThroughSentinel, AsyncUrlSuite):
    pass
