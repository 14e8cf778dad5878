"""TLS for real: a private redis-server that listens on TLS only (``--port 0``), with
certificates made by openssl for the test. The whole conformance suite, sync and async,
runs through ``rediss://`` URLs with the TLS options; a wrong CA, or a missing client
certificate where the server asks for one, is a clear error at open that names the URL
without its password. A cluster of TLS-only nodes is found through ``rediss+cluster://``
seeds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from conformance import test_redis as conformance_redis
from transports_core import (
    Event,
    TransportError,
    open_async_transport,
    open_transport,
)
from transports_redis import RedisTransport

from ._cluster import claim_and_ack_async
from ._tls import PASSWORD, Certs, make_certs, tls_cluster, tls_server
from .server import free_port, with_queue


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[int]:
    with tls_server(tmp_path_factory.mktemp("tls"), certs, auth_clients=False) as port:
        yield port


@pytest.fixture(scope="module")
def mutual_port(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[int]:
    """A server that refuses a client without a certificate its CA signed."""
    with tls_server(tmp_path_factory.mktemp("mtls"), certs, auth_clients=True) as port:
        yield port


def tls_url(port: int, queue: str, **query: object) -> str:
    return with_queue(f"rediss://:{PASSWORD}@127.0.0.1:{port}/0", queue, **query)


class _OverTls:
    """Each scenario on a queue of its own on the TLS server, its invariants checked over
    TLS when it ends, then its keys deleted."""

    same_arguments_as_direct = True  # see tests/conftest.py

    @pytest.fixture
    def transport_url(self, tls_port: int, certs: Certs) -> Iterator[str]:
        url = tls_url(tls_port, f"tls-{uuid.uuid4().hex[:12]}", ssl_ca_certs=certs.ca)
        try:
            yield url
            with open_transport(url) as transport:
                assert isinstance(transport, RedisTransport)
                assert transport.check() == []
        finally:
            _delete(tls_port, certs, url)


def _delete(port: int, certs: Certs, url: str) -> None:
    queue = url.rpartition("queue=")[2].partition("&")[0]
    client = redis.Redis(
        port=port, password=PASSWORD, ssl=True, ssl_ca_certs=str(certs.ca),
        ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key),
    )  # fmt: skip
    keys = list(client.scan_iter(match=f"dt:{{{queue}}}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.mark.slow
class TestRedisOverTls(_OverTls, conformance_redis.TestRedis):
    """The shipped suite's Redis classes, each scenario's URL a TLS one."""


@pytest.mark.slow
class TestAsyncRedisOverTls(_OverTls, conformance_redis.TestAsyncRedis):
    pass


def test_the_plain_port_is_closed_so_every_call_above_was_tls(tls_port: int) -> None:
    # --port 0: the server has no plain-text listener; rediss:// is the only way in.
    client = redis.Redis(port=tls_port, password=PASSWORD, socket_connect_timeout=2)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()


def _refused_at_open(url: str, port: int) -> list[str]:
    """The messages of the errors that opening ``url`` raises, sync and async (at ``async
    with``): each a TransportError that names the URL, its password masked, and TLS."""

    async def enter() -> None:
        async with open_async_transport(url):
            pass

    messages = []
    for attempt in (lambda: open_transport(url), lambda: asyncio.run(enter())):
        with pytest.raises(TransportError) as caught:
            attempt()
        message = str(caught.value)
        assert f"rediss://:***@127.0.0.1:{port}/0: cannot connect over TLS" in message
        assert PASSWORD not in message
        messages.append(message)
    return messages


def test_a_wrong_ca_is_a_clear_error_at_open(tls_port: int, certs: Certs) -> None:
    url = tls_url(tls_port, "wrong-ca", ssl_ca_certs=certs.other_ca)
    for message in _refused_at_open(url, tls_port):
        assert "the handshake failed" in message
        assert "certificate verify failed" in message


def test_no_ca_option_means_the_system_cas_which_do_not_know_ours(tls_port: int) -> None:
    for message in _refused_at_open(tls_url(tls_port, "system-ca"), tls_port):
        assert "certificate verify failed" in message


def test_a_server_that_asks_for_a_client_certificate(mutual_port: int, certs: Certs) -> None:
    _refused_at_open(tls_url(mutual_port, "mtls", ssl_ca_certs=certs.ca), mutual_port)
    url = tls_url(
        mutual_port,
        f"mtls-{uuid.uuid4().hex[:8]}",
        ssl_ca_certs=certs.ca,
        ssl_certfile=certs.client_cert,
        ssl_keyfile=certs.client_key,
    )
    with open_transport(url) as transport:
        assert isinstance(transport, RedisTransport)
        seq = transport.publish("g", Event(n=1))
        lease = transport.claim("w", 5)
        assert lease is not None
        assert lease.seq == seq
        transport.ack(lease)
        assert transport.check() == []

    async def twin() -> None:
        async with open_async_transport(url) as transport:
            seq = await transport.publish("g", Event(n=2))
            lease = await transport.claim("w", 5)
            assert lease is not None
            assert lease.seq == seq
            await transport.ack(lease)

    asyncio.run(twin())
    with open_transport(url) as transport:
        assert isinstance(transport, RedisTransport)
        assert transport.check() == []
    _delete(mutual_port, certs, url)


def test_without_checks_of_the_server_any_certificate_will_do(tls_port: int, certs: Certs) -> None:
    # ssl_cert_reqs=none: encrypted, but the server is not verified (the docs warn).
    url = tls_url(tls_port, f"nocheck-{uuid.uuid4().hex[:8]}", ssl_cert_reqs="none")
    with open_transport(url) as transport:
        assert isinstance(transport, RedisTransport)
        transport.publish("g", Event(n=1))
        assert transport.check() == []
    _delete(tls_port, certs, url)


def test_tls_options_are_checked_before_anything_is_sent(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ValueError, match="ssl_ca_certs must name a readable file"):
        open_transport(f"rediss://127.0.0.1:1/0?ssl_ca_certs={tmp_path / 'none.pem'}")
    with pytest.raises(ValueError, match="need a rediss:// \\(TLS\\) URL"):
        open_transport(f"redis://:{PASSWORD}@127.0.0.1:1/0?ssl_ca_certs={certs.ca}")


def test_a_cluster_over_tls_is_found_through_its_seeds_on_both_twins(
    tmp_path: Path, certs: Certs
) -> None:
    """Three TLS-only cluster nodes: the slot map is read over TLS, with the URL's
    password and CA, through seeds of which the first answers nothing."""
    with tls_cluster(tmp_path, certs) as ports:
        seeds = ",".join(f"127.0.0.1:{port}" for port in [free_port(), *ports[1:]])
        url = f"rediss+cluster://:{PASSWORD}@{seeds}/?queue=tls-cluster&ssl_ca_certs={certs.ca}"
        with open_transport(url) as transport:
            assert isinstance(transport, RedisTransport)
            seq = transport.publish("g", Event(n=1))
        assert claim_and_ack_async(url) == (seq, 1)
        with open_transport(url) as transport:
            assert isinstance(transport, RedisTransport)
            assert transport.check() == []
        # With the wrong CA, each seed that answers is named, and the handshake failure.
        wrong = url.replace(str(certs.ca), str(certs.other_ca))
        with pytest.raises(TransportError, match="no cluster node answered") as raised:
            open_transport(wrong)
        assert f"127.0.0.1:{ports[1]}: " in str(raised.value)
        assert "certificate verify failed" in str(raised.value)
        assert PASSWORD not in str(raised.value)
