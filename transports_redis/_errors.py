"""What both runners do with what goes wrong: redis-py's connection errors become
`TransportError`s that name the server (never its password), and an error reply either
becomes one too or is worked around by `Recover`, an operation both runners hand to core.

    redis.ConnectionError / TimeoutError while connecting   -> Unreachable, a TransportError
                              (nothing sent); with a cluster or Sentinel URL, the runner
                              first looks for the queue's node again (a failover)
    an error reply while connecting (SELECT of a database the server does not have)
                                                            -> TransportError (nothing sent)
    redis.InvalidResponse     something other than Redis answered (while connecting:
                              TransportError, nothing sent) or a reply was garbled (in
                              flight: as a lost connection)
    redis.ConnectionError / TimeoutError once a write was sent
                                                            -> OutcomeUnknown
    the same during a read                                  -> TransportError
    NOSCRIPT                  the script is loaded and the call sent again (it did not run)
    "Function not found"      (NOFUNCTION here) the same for the library of functions: it
                              is loaded (FUNCTION LOAD REPLACE) and the call sent again; a
                              server that refuses to load it (an ACL without FUNCTION, out
                              of memory), or to run FCALL at all (NOPERM), raises
                              `FunctionsRefused`: the runner sends its calls as EVALSHA
                              from then on
    MOVED                     the queue's slot is served by another cluster node: that
                              node becomes the queue's node, and the call is sent there
    ASK                       the slot is migrating and its keys are gone from this node:
                              the call is sent to the node named, after ASKING
    TRYAGAIN / CLUSTERDOWN    the slot is migrating with its keys split between two nodes
                              (or no node serves it yet): the call is sent again after a
                              short pause, for up to ``socket_timeout`` seconds, then
                              -> TransportError that says nothing was done
    LOADING / MASTERDOWN      the server is still loading its data set after a restart,
                              or is a replica cut off from its primary: waited out the
                              same way (these replies, too, say the call did not run)
    READONLY                  with a cluster or Sentinel URL: the node was a primary and
                              is a replica now; the runner looks for the new primary
    any other error reply (OOM, READONLY, a script error)   -> TransportError

None of the replies that are worked around ran the call, so sending it again never does
anything twice. Retries are off in the pools the runners build: nothing is ever sent
twice behind the caller's back. An error reply is a value here (`exchange` returns it),
told apart by its text, since redis-py gives the cluster replies their own classes only
in its newer versions. redis-py raises LOADING as a ConnectionError (`BusyLoadingError`),
though the reply was read whole and the connection is sound: `REPLIES` names it beside
`ResponseError`, so that it is a reply here too, never a lost connection (which would
make a write's outcome unknown). Imports redis only for its exception classes (redis.asyncio
raises the same ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import redis.exceptions as rex

from transports_core import OutcomeUnknown, TransportError
from transports_core.backend import Operation, Steps

from ._ops import command
from ._scripts import Library, Script

Node = tuple[str, int]
# What an error reply is raised as: see the module's docstring for LOADING's class.
Reply = rex.ResponseError | rex.BusyLoadingError
REPLIES: tuple[type[rex.ResponseError], type[rex.BusyLoadingError]] = (
    rex.ResponseError,
    rex.BusyLoadingError,
)
# Replies that guarantee the call did not run, and that time may cure: waited out.
WAITED_OUT = ("TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN")

ASKING: bytes = command("ASKING")
# A migration pauses the queue (see docs/redis.md, Cluster): look again soon, then less often.
FIRST_PAUSE = 0.002
LONGEST_PAUSE = 0.05
# MOVED twice in a row means the cluster moved the slot again meanwhile; more than this
# many times for one call means its nodes disagree about who serves it.
MOST_MOVES = 5


class Exchange(NamedTuple):
    """Wait ``pause`` seconds (the slot is migrating), then send ``commands`` (packed) on
    one connection to ``node`` (None: the queue's node) and read a reply to each; the
    plan gets the last one."""

    commands: list[bytes]
    node: Node | None = None
    pause: float = 0.0


class FunctionsRefused(Exception):
    """The server would not load the library of functions, or run FCALL: nothing ran,
    and the runner sends the call again as EVALSHA. Never leaves the runner."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(str(reply))
        self.reply = reply


class Unreachable(TransportError):
    """A node could not be connected to: nothing was sent (never raised to callers as
    its own class; the runners catch it to look for the queue's node again)."""


class NotReplicated(OutcomeUnknown):
    """A write ran on the primary, but fewer replicas than ``wait_replicas`` confirmed
    it in time: a failover may still lose it."""

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(operation, reason)
        self.args = (f"{operation}: ran on the primary, outcome unknown ({reason})",)


# How long a runner waits between looks for the queue's node after a failover.
FIRST_LOOK = 0.05
LONGEST_LOOK = 0.5


@contextmanager
def connecting(server: str) -> Iterator[None]:
    """Opening a connection: whatever fails, nothing reached the server."""
    try:
        yield
    except rex.AuthenticationError as exc:
        raise TransportError(f"{server}: the server refused the credentials ({exc})") from exc
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        why = "cannot connect"
        if server.startswith("rediss://"):
            # A server that refuses our certificate may just drop the connection; the
            # ssl module's own errors say ssl, whatever went wrong in the handshake.
            seen = "the handshake failed" if "ssl" in str(exc).lower() else "if it is up"
            why += (
                f" over TLS ({seen}: check ssl_ca_certs, and ssl_certfile and ssl_keyfile "
                "if the server asks for a client certificate)"
            )
        raise Unreachable(f"{server}: {why} ({exc})") from exc
    except rex.ResponseError as exc:  # a reply to the connection's setup (SELECT, HELLO)
        if "cluster mode" in str(exc).lower():
            raise TransportError(
                f"{server}: the server is a Redis Cluster node, which has only database "
                f"0 ({exc}); drop the /N from the URL, and open the cluster as "
                "redis+cluster://host:port,host:port/?queue=NAME"
            ) from exc
        if "db index" in str(exc).lower():
            raise TransportError(
                f"{server}: the server has no database by that number ({exc}); it has as "
                "many as its 'databases' setting (16 unless configured), numbered from 0"
            ) from exc
        raise TransportError(f"{server}: the server refused the connection ({exc})") from exc
    except rex.InvalidResponse as exc:  # something else listens there (HTTP, say)
        raise TransportError(
            f"{server}: what answered is not a Redis server ({exc}); check the host and port"
        ) from exc


@contextmanager
def redis_errors(server: str, operation: str, writes: bool) -> Iterator[None]:
    """A call in flight: a broken connection leaves a write's outcome unknown."""
    try:
        yield
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        if writes:
            raise OutcomeUnknown(operation, f"{server}: {exc}") from exc
        raise TransportError(f"{server}: {operation}: the connection was lost ({exc})") from exc
    except rex.InvalidResponse as exc:  # a reply that is not Redis's protocol: as lost
        if writes:
            raise OutcomeUnknown(operation, f"{server}: {exc}") from exc
        raise TransportError(f"{server}: {operation}: the reply was unreadable ({exc})") from exc


# redis-py strips the code off the replies it has a class for (which, depends on its
# version): the class tells the code then. MOVED before ASK, its base class.
# MASTERDOWN before CLUSTERDOWN, its base class.
_CODES: tuple[tuple[type[rex.RedisError], str], ...] = (
    (rex.NoScriptError, "NOSCRIPT"),
    (rex.MovedError, "MOVED"),
    (rex.AskError, "ASK"),
    (rex.TryAgainError, "TRYAGAIN"),
    (rex.MasterDownError, "MASTERDOWN"),
    (rex.ClusterDownError, "CLUSTERDOWN"),
    (rex.BusyLoadingError, "LOADING"),
    (rex.OutOfMemoryError, "OOM"),
    (rex.ReadOnlyError, "READONLY"),
)


def error_code(reply: Reply) -> tuple[str, str]:
    """The code of an error reply (``MOVED``) and the text after it. A missing function
    has no code of its own (ERR, which redis-py strips): it is NOFUNCTION here."""
    for cls, code in _CODES:
        if isinstance(reply, cls):
            return code, str(reply)
    text = str(reply)
    if text.startswith("Function not found"):
        return "NOFUNCTION", text
    code, _, rest = text.partition(" ")
    return code, rest


_UNSETTLED = {
    "TRYAGAIN": "the queue's slot is migrating between cluster nodes and did not settle",
    "CLUSTERDOWN": "the queue's slot is migrating between cluster nodes and did not settle",
    "LOADING": "the server was still loading its data set (after a restart)",
    "MASTERDOWN": "the server is a replica that lost its primary, and it did not come back",
}


def _node(rest: str, current: Node) -> Node:
    # MOVED's "3999 127.0.0.1:6381"; a node that does not know its own address names none
    # (":6381"), meaning the host the reply came from.
    host, _, port = rest.split()[1].rpartition(":")
    return (host or current[0], int(port))


class Recover(Operation[Exchange, Any, Any]):
    """What follows when ``call`` (packed; ``source``: what to load where its code is
    missing, its script for an EVALSHA, the library for an FCALL) got the error ``reply``
    from the queue's node ``home``: its steps are the `Exchange`s that work around it,
    each sent the reply it got; they end with the call's real reply, or raise the
    `TransportError` they come to (or `FunctionsRefused`). ``follow`` makes another node
    the queue's node (after MOVED). Core's drivers run it."""

    __slots__ = ("call", "follow", "home", "operation", "patience", "reply", "server", "source")

    def __init__(
        self,
        reply: Reply,
        call: bytes,
        source: Script | Library | None,
        home: Node,
        follow: Callable[[Node], None],
        server: str,
        operation: str,
        patience: float,
    ) -> None:
        self.reply, self.call, self.source, self.home = reply, call, source, home
        self.follow, self.server, self.operation = follow, server, operation
        self.patience = patience

    def steps(self, now: float | None) -> Steps[Exchange, Any, Any]:
        reply, call, home = self.reply, self.call, self.home
        server, operation = self.server, self.operation
        node: Node | None = None
        waited, pause, moves = 0.0, FIRST_PAUSE, 0
        loaded: set[Node | None] = set()
        while True:
            kind, rest = error_code(reply)
            text = f"{kind} {rest}"
            wait = 0.0
            library = isinstance(self.source, Library)
            if library and (kind == "NOPERM" or text.startswith("unknown command")):
                raise FunctionsRefused(reply)
            if kind == "NOSCRIPT" and isinstance(self.source, Script) and node not in loaded:
                # A restarted or flushed server has lost the script: load it, once per node.
                done = yield Exchange([command("SCRIPT", "LOAD", self.source.source)], node)
                if isinstance(done, REPLIES):
                    raise refused(done, server, operation) from done
                loaded.add(node)
            elif kind == "NOFUNCTION" and isinstance(self.source, Library) and node not in loaded:
                # The same for the library (a new node, a restart without persistence, a
                # FUNCTION FLUSH, or never loaded there); REPLACE, since another client
                # may load it meanwhile.
                load = command("FUNCTION", "LOAD", "REPLACE", self.source.source)
                done = yield Exchange([load], node)
                if isinstance(done, REPLIES):
                    if error_code(done)[0] in (*WAITED_OUT, "READONLY"):
                        raise refused(done, server, operation) from done
                    raise FunctionsRefused(done)
                loaded.add(node)
            elif kind == "MOVED":
                moves += 1
                if moves > MOST_MOVES:
                    raise TransportError(
                        f"{server}: {operation}: the cluster's nodes keep redirecting the "
                        f"queue's slot ({text}); nothing was done"
                    )
                home = _node(rest, home)
                self.follow(home)
                node = None
                loaded.discard(None)
            elif kind == "ASK":
                node = _node(rest, home)
            elif kind in WAITED_OUT:
                if waited >= self.patience:
                    raise TransportError(
                        f"{server}: {operation}: {_UNSETTLED[kind]} within "
                        f"{self.patience:g} s; nothing was done, try again ({text})"
                    )
                wait, waited, pause = pause, waited + pause, min(pause * 2, LONGEST_PAUSE)
                node = None  # ask the queue's node again: the migration may have moved on
            else:
                raise refused(reply, server, operation) from reply
            answer = yield Exchange([call] if node is None else [ASKING, call], node, wait)
            if not isinstance(answer, REPLIES):
                return answer
            reply = answer


def wakeup(reply: object, server: str, close_key: str) -> str | None:
    """What a waiting claim's BLPOP came back with (see `_ops.Waiter.woke`): None (it
    timed out), "close" (this handle's close key), "token", or "redirect", which the
    claim it looks with then follows; any other error reply raises."""
    if reply is None:
        return None
    if isinstance(reply, REPLIES):
        code, _ = error_code(reply)
        if code not in ("MOVED", "ASK", *WAITED_OUT):
            raise refused(reply, server, "blpop") from reply
        return "redirect"
    # [key, token]: redis-py reads an array reply as a list.
    return "close" if isinstance(reply, list) and reply[0] == close_key else "token"


def refused(reply: Reply, server: str, operation: str) -> TransportError:
    """The error to raise for an error reply that no retry can get around."""
    code, rest = error_code(reply)
    if code == "OOM":
        why = "the server is out of memory (maxmemory reached; nothing was written)"
    elif code == "READONLY":
        why = "the server is a read-only replica; connect to the primary"
    else:
        why = "the server refused the call"
    return TransportError(f"{server}: {operation}: {why} ({code} {rest})")
