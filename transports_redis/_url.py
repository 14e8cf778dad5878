"""Redis URLs and options -> `RedisOptions`, through one typed whitelist.

``redis://[[user]:password@]host[:port][/db]?queue=NAME&...``, ``rediss://`` (TLS),
``unix:///path/to/socket?db=N&queue=NAME``, a Redis Cluster through several seed nodes
``redis+cluster://[[user]:password@]h1:p1,h2:p2/?queue=NAME`` (``rediss+cluster://``
over TLS), or the primary a set of Sentinels names,
``redis+sentinel://[[user]:password@]s1:p1,s2:p2/SERVICE?queue=NAME``. Options come
from the URL query (strings, coerced here) or keyword arguments (typed values, checked
here), one place each; the connection part is handed to redis-py without its query.
Imports no driver.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from transports_core import backend as core

URL_FORMS = (
    "redis://[[user]:password@]host[:port][/db]?queue=NAME, rediss://... (TLS), "
    "unix:///path/to/redis.sock?db=N&queue=NAME, "
    "redis+cluster://[[user]:password@]host:port,host:port/?queue=NAME (rediss+cluster:// "
    "over TLS) or redis+sentinel://[[user]:password@]host:port,host:port/SERVICE?queue=NAME"
)
SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel")
Topology = Literal["server", "cluster", "sentinel"]
Node = tuple[str, int]
# The ports Redis and Sentinel listen on unless told otherwise.
DEFAULT_PORTS = {"cluster": 6379, "sentinel": 26379}
MaxmemoryCheck = Literal["refuse"]
OnDead = Literal["release", "hold"]
CertReqs = Literal["required", "optional", "none"]


@dataclass(frozen=True)
class RedisOptions:
    """Everything a Redis transport is opened with.

    ``server``: the connection URL without its query (it may hold a password: never
    shown; see `redacted`). ``db``: the database number of a ``unix://`` or
    ``redis+sentinel://`` URL.
    ``topology``: ``server`` (one server, the URL's), ``cluster`` (a Redis Cluster found
    through the seed ``nodes``) or ``sentinel`` (the primary that the Sentinels at
    ``nodes`` name for ``service``); see `node_url`.
    ``wait_replicas``: after every call that writes, wait (Redis ``WAIT``) until that
    many replicas have the write, for at most ``wait_timeout`` seconds; fewer makes the
    call raise `OutcomeUnknown` (a failover may lose it). 0 (default): no waiting.
    ``queue``: the queue's name; its keys all start with ``dt:{queue}:``.
    ``socket_timeout`` / ``connect_timeout``: seconds before a silent server is given up
    on (a call then raises `OutcomeUnknown`).
    ``max_attempts`` / ``on_dead``: the dead-letter policy (see `TransportAdmin`).
    ``maxmemory_policy``: ``refuse``, the only value: a server whose maxmemory-policy may
    evict the queue's keys is refused (``warn``, which opened one, is refused itself).
    ``dedup_window``: seconds a publish's idempotency key is remembered (default a day);
    each key costs memory for that long (see docs/redis.md).
    ``clock``: seconds since the epoch, for tests (keyword only); None (default): every
    script reads the server's TIME.
    ``ssl_*``: TLS, for ``rediss://`` only: ``ssl_ca_certs`` the CA file (PEM) the
    server's certificate must chain to (None: the system's CAs); ``ssl_certfile`` and
    ``ssl_keyfile`` the client's certificate and key, for a server that asks for one;
    ``ssl_password`` the key's passphrase (keyword only, never shown); ``ssl_cert_reqs``
    ``required`` (default), ``optional`` or ``none`` (no check of the server at all);
    ``ssl_check_hostname`` whether the certificate must name the URL's host (default:
    unless ``ssl_cert_reqs`` is ``none``).
    """

    server: str = field(repr=False)  # shown redacted: see `__repr__`
    queue: str = "default"
    db: int | None = None
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    max_attempts: int | None = None
    on_dead: OnDead = "release"
    maxmemory_policy: MaxmemoryCheck = "refuse"
    dedup_window: float = core.DEDUP_WINDOW
    clock: Callable[[], float] | None = None
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_cert_reqs: CertReqs = "required"
    ssl_check_hostname: bool | None = None
    topology: Topology = "server"
    nodes: tuple[Node, ...] = ()
    service: str | None = None
    wait_replicas: int = 0
    wait_timeout: float = 1.0

    def __repr__(self) -> str:
        shown = (f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}(server={self.redacted!r}, {', '.join(shown)})"

    @functools.cached_property
    def redacted(self) -> str:
        """`server` with any password masked: worked out once, as every call names it."""
        return core.redact_url(self.server)

    @property
    def tls(self) -> dict[str, Any]:
        """The TLS settings for redis-py's connections (none for a plain connection)."""
        if not self.server.startswith(("rediss://", "rediss+cluster://")):
            return {}
        check = self.ssl_check_hostname
        return {
            "ssl_ca_certs": self.ssl_ca_certs,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": self.ssl_password,
            "ssl_cert_reqs": self.ssl_cert_reqs,
            "ssl_check_hostname": self.ssl_cert_reqs != "none" if check is None else check,
        }

    def as_cluster_seed(self) -> RedisOptions:
        """These options of a plain URL whose server turned out to be a cluster node, as
        a ``redis+cluster://`` URL naming that node alone would give them: the queue's
        node is then found through the cluster's slot map, and found again after a
        failover."""
        parts = urlsplit(self.server)
        return replace(
            self,
            topology="cluster",
            nodes=((parts.hostname or "localhost", parts.port or DEFAULT_PORTS["cluster"]),),
        )

    def node_url(self, node: Node) -> str:
        """The URL of one data node (a cluster's, or the primary a Sentinel names), with
        the credentials of `server`: what each node's pool is made from."""
        scheme = "rediss" if self.tls else "redis"
        netloc = self.server.partition("://")[2].partition("/")[0]
        userinfo = netloc.rpartition("@")[0]
        host = f"[{node[0]}]" if ":" in node[0] else node[0]
        db = "" if self.db is None else f"/{self.db}"
        return f"{scheme}://{userinfo + '@' if userinfo else ''}{host}:{node[1]}{db}"


def _queue(value: object) -> str:
    # A brace would end the hash tag early and spread the queue over cluster slots.
    if (
        not isinstance(value, str)
        or not value
        or len(value) > 200
        or any(c in value for c in "{}")
        or not value.isprintable()
    ):
        raise ValueError(
            "queue must be a non-empty printable name of at most 200 characters without "
            f"braces, got {value!r}"
        )
    return value


def _db(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"db must be a database number >= 0, got {value!r}")
    return value


def _maxmemory(value: object) -> MaxmemoryCheck:
    if value == "refuse":
        return value
    if value == "warn":
        # An evicted key silently breaks the queue's structures (a group's chain loses a
        # link, the seq counter restarts and hands out seqs again): no warning covers that.
        raise ValueError(
            "maxmemory_policy=warn is no longer accepted: a server that may evict the "
            "queue's keys can corrupt the queue, not just lose messages; run it with "
            "maxmemory-policy noeviction (or a volatile-* policy, see docs/redis.md)"
        )
    raise ValueError(f"maxmemory_policy must be refuse, got {value!r}")


def _on_dead(value: object) -> OnDead:
    return cast(OnDead, core.check_on_dead(value))


def _file(name: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        if not isinstance(value, (str, os.PathLike)) or not os.path.isfile(value):
            raise ValueError(f"{name} must name a readable file, got {value!r}")
        return os.fspath(value)

    return check


def _cert_reqs(value: object) -> CertReqs:
    if value == "required" or value == "optional" or value == "none":
        return value
    raise ValueError(f"ssl_cert_reqs must be required, optional or none, got {value!r}")


def _flag(name: str) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{name} must be true or false, got {value!r}")

    return check


def _replicas(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ValueError(f"wait_replicas must be a number of replicas from 0 to 100, got {value!r}")
    return value


def _passphrase(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("ssl_password must be a string")  # never shown
    return value


OPTIONS = core.OptionTable(
    "Redis",
    {
        "queue": _queue,
        "db": _db,
        "socket_timeout": core.seconds_option("socket_timeout"),
        "connect_timeout": core.seconds_option("connect_timeout"),
        "max_attempts": core.check_max_attempts,
        "on_dead": _on_dead,
        "maxmemory_policy": _maxmemory,
        "dedup_window": core.seconds_option("dedup_window"),
        "ssl_ca_certs": _file("ssl_ca_certs"),
        "ssl_certfile": _file("ssl_certfile"),
        "ssl_keyfile": _file("ssl_keyfile"),
        "ssl_cert_reqs": _cert_reqs,
        "ssl_check_hostname": _flag("ssl_check_hostname"),
        "wait_replicas": _replicas,
        "wait_timeout": core.seconds_option("wait_timeout"),
    },
    # Never from the URL: a callable, and a secret (messages show a URL with its query).
    keyword_only={"clock": core.check_clock, "ssl_password": _passphrase},
)


def _nodes(hosts: str, default_port: int, shown: str) -> tuple[Node, ...]:
    """``h1:p1,h2:p2`` (a bracketed IPv6 address too) as (host, port) pairs."""
    nodes = []
    for item in hosts.split(","):
        try:
            parts = urlsplit(f"//{item}")
            host, port = parts.hostname, parts.port
        except ValueError:
            host = port = None
        if not host or port == 0 or parts.netloc != item:
            raise ValueError(
                f"Redis URL {shown!r}: {item!r} is not a host[:port] node; use {URL_FORMS}"
            )
        nodes.append((host, port or default_port))
    return tuple(nodes)


def _several(url: str, scheme: str, shown: str) -> tuple[Topology, tuple[Node, ...], str | None]:
    """The topology, nodes and service of a ``redis+cluster://`` or ``redis+sentinel://``
    URL (whose netloc urlsplit cannot read: it has several ports)."""
    topology: Topology = "sentinel" if scheme.endswith("sentinel") else "cluster"
    rest = url.partition("://")[2].partition("?")[0]
    netloc, _, path = rest.partition("/")
    hosts = netloc.rpartition("@")[2]
    if not hosts:
        raise ValueError(f"Redis URL {shown!r} names no node; use {URL_FORMS}")
    nodes = _nodes(hosts, DEFAULT_PORTS[topology], shown)
    if topology == "cluster":
        if path.isascii() and path.isdigit() and int(path) != 0:
            raise ValueError(
                f"Redis URL {shown!r}: a Redis Cluster has only database 0, so the URL "
                f"cannot name database {path}; drop '/{path}' (and move the data: a "
                "cluster's keys are all in database 0)"
            )
        if path not in ("", "0"):
            raise ValueError(
                f"Redis URL {shown!r}: a cluster URL has no path (or /0), got {path!r}"
            )
        return topology, nodes, None
    if not path or "/" in path or not path.isprintable():
        raise ValueError(
            f"Redis URL {shown!r}: a Sentinel URL names the service as its path "
            f"(/mymaster), got {path!r}; use {URL_FORMS}"
        )
    return topology, nodes, unquote(path)


def parse_url(url: str, options: Mapping[str, object]) -> RedisOptions:
    """Check ``url`` and ``options`` and return the options to open with."""
    shown = core.redact_url(url)
    scheme = url.partition("://")[0]
    topology: Topology = "server"
    nodes: tuple[Node, ...] = ()
    service = None
    try:
        parts = urlsplit(url)
        port = None if "+" in scheme else parts.port
    except ValueError as exc:
        raise ValueError(f"malformed Redis URL {shown!r} ({exc}); use {URL_FORMS}") from None
    if parts.scheme not in SCHEMES or not url.startswith(f"{parts.scheme}://"):
        raise ValueError(f"malformed Redis URL {shown!r}; use {URL_FORMS}")
    if parts.fragment:
        raise ValueError(f"Redis URL {shown!r} has a fragment (#...); use {URL_FORMS}")
    if "+" in parts.scheme:
        topology, nodes, service = _several(url, parts.scheme, shown)
    elif parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise ValueError(f"Redis URL {shown!r} names no socket path; use {URL_FORMS}")
    else:
        if not parts.hostname:
            raise ValueError(f"Redis URL {shown!r} names no host; use {URL_FORMS}")
        if port == 0:
            raise ValueError(f"Redis URL {shown!r} has port 0; use {URL_FORMS}")
        path = parts.path.strip("/")
        if path and not (path.isascii() and path.isdigit()):
            raise ValueError(
                f"Redis URL {shown!r}: the path must be a database number, got {path!r}"
            )

    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key in OPTIONS.keyword_only for key, _ in query):
        # Before any message that shows the URL: it would show the secret too.
        raise ValueError(f"{', '.join(OPTIONS.keyword_only)} may only be given as keywords")
    chosen = OPTIONS.choose(url, query, options)
    if "db" in chosen and parts.scheme not in ("unix", "redis+sentinel"):
        if topology == "cluster":
            raise ValueError(f"Redis URL {shown!r}: a Redis Cluster has only database 0")
        raise ValueError(f"Redis URL {shown!r}: give the database as its path (/N), not db=")
    tls = sorted(key for key in chosen if key.startswith("ssl_"))
    if tls and parts.scheme not in ("rediss", "rediss+cluster"):
        raise ValueError(f"Redis URL {shown!r}: {', '.join(tls)} need a rediss:// (TLS) URL")
    if "ssl_keyfile" in chosen and "ssl_certfile" not in chosen:
        raise ValueError("ssl_keyfile needs ssl_certfile, the certificate it is the key of")
    if chosen.get("ssl_cert_reqs") == "none" and chosen.get("ssl_check_hostname") is True:
        raise ValueError("ssl_check_hostname=true needs ssl_cert_reqs required or optional")
    server = f"{parts.scheme}://{parts.netloc}{parts.path}"
    built = OPTIONS.build(
        RedisOptions, chosen, server=server, topology=topology, nodes=nodes, service=service
    )
    if built.wait_replicas and built.wait_timeout >= built.socket_timeout:
        raise ValueError(
            f"wait_timeout ({built.wait_timeout:g} s) must be shorter than socket_timeout "
            f"({built.socket_timeout:g} s): WAIT's reply is read within socket_timeout"
        )
    return built
