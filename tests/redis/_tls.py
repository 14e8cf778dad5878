"""A private ``redis-server`` that speaks only TLS, with certificates made for the test by
the ``openssl`` command: a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate, and a second CA that signed none of them; and a Redis Cluster of such
servers. Skips, saying why, where openssl is missing or the redis-server build has no
TLS."""

from __future__ import annotations

import functools
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from .server import free_port

PASSWORD = "tls-s3cret"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-days", "2",
        "-keyout", key, "-out", cert, "-subj", f"/CN=durable-transports test {name}",
        # What Python 3.13's strict checks (VERIFY_X509_STRICT) ask of a CA.
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _signed(
    directory: Path, name: str, ca: tuple[Path, Path], extensions: str
) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}.ext"
    # The key identifiers: Python 3.13's strict checks want the issuer's named.
    ext.write_text(
        f"{extensions}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(
        "req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", key, "-out", csr,
        "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-days", "2", "-out", cert, "-extfile", ext,
    )  # fmt: skip
    return cert, key


def make_certs(directory: Path) -> Certs:
    """Everything a TLS test needs, made fresh in ``directory``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the TLS test's certificates")
    ca = _ca(directory, "ca")
    other_ca, _ = _ca(directory, "other-ca")
    server = _signed(
        directory, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth",
    )  # fmt: skip
    client = _signed(directory, "client", ca, "extendedKeyUsage=clientAuth")
    return Certs(ca[0], server[0], server[1], client[0], client[1], other_ca)


@functools.cache
def _without_tls() -> str | None:
    """Why this redis-server cannot serve TLS (None: it can). A build with TLS started
    on a TLS port with no certificate complains about the missing certificate; a build
    without says something else."""
    try:
        probe = subprocess.run(
            ["redis-server", "--port", "0", "--tls-port", str(free_port()), "--save", ""],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        said = probe.stdout + probe.stderr
    except subprocess.TimeoutExpired as still:  # it came up, listening on nothing
        said = str(still.stdout or "") + str(still.stderr or "")
    if "tls-cert-file" in said:
        return None
    return f"this redis-server build has no TLS (started with --tls-port it said: {said[-300:]!r})"


@contextmanager
def tls_server(directory: Path, certs: Certs, *extra: str, auth_clients: bool) -> Iterator[int]:
    """A redis-server listening on TLS only (``--port 0``), password `PASSWORD`; yields
    its TLS port. With ``auth_clients`` it refuses a client without a certificate;
    ``extra``: more server arguments."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the TLS tests need it")
    why = _without_tls()
    if why is not None:
        pytest.skip(why)
    port = free_port()
    log = directory / "redis.log"
    process = subprocess.Popen(
        [
            "redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", "yes" if auth_clients else "no",
            "--requirepass", PASSWORD, "--dir", str(directory), "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--logfile", str(log), *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(
            port=port, password=PASSWORD, ssl=True, ssl_ca_certs=str(certs.ca),
            ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key),
            socket_connect_timeout=1,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                text = log.read_text() if log.exists() else ""
                raise RuntimeError(f"the TLS redis-server did not start: {text[-2000:]}")
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                assert time.monotonic() < deadline, "the TLS redis-server did not answer"
                time.sleep(0.05)
        client.close()
        yield port
    finally:
        process.kill()
        process.wait()


@contextmanager
def tls_cluster(directory: Path, certs: Certs, size: int = 3) -> Iterator[list[int]]:
    """``size`` TLS-only servers, password `PASSWORD`, made one Redis Cluster whose bus
    and replication speak TLS too (every slot assigned, no replicas); yields their
    ports."""
    with ExitStack() as stack:
        ports = []
        for i in range(size):
            node = directory / f"n{i}"
            node.mkdir()
            cluster = ("--cluster-enabled", "yes", "--cluster-config-file",
                       str(node / "nodes.conf"), "--tls-cluster", "yes",
                       "--tls-replication", "yes", "--masterauth", PASSWORD,
                       # The bus asks each node for a client certificate.
                       "--tls-client-cert-file", str(certs.client_cert),
                       "--tls-client-key-file", str(certs.client_key))  # fmt: skip
            ports.append(stack.enter_context(tls_server(node, certs, *cluster, auth_clients=False)))
        subprocess.run(
            ["redis-cli", "--tls", "--cacert", str(certs.ca), "-a", PASSWORD,
             "--no-auth-warning", "--cluster", "create",
             *(f"127.0.0.1:{port}" for port in ports), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for port in ports:
            client = redis.Redis(
                port=port, password=PASSWORD, ssl=True, ssl_ca_certs=str(certs.ca),
                decode_responses=True,
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while client.cluster("INFO").get("cluster_state") != "ok":
                assert time.monotonic() < deadline, "the TLS cluster did not come up"
                time.sleep(0.1)
            client.close()
        yield ports
