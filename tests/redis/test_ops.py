"""The sans-I/O half, with no server: arguments are checked when an operation is built,
calls are packed in the wire format, replies are read back exactly, and every script
declares its keys and arguments once."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis.exceptions as rex

from transports_core import Event, Lease, LeaseLost, RequeueRefused, TransportError
from transports_core.backend import Claimed, EventCodec, exhausted_reason
from transports_redis import _ops as ops
from transports_redis import _scripts as scripts
from transports_redis._errors import ASKING, Exchange, Node, recover
from transports_redis._ops import command

CODEC: EventCodec[Event] = EventCodec(Event)


def test_bad_arguments_are_refused_when_the_operation_is_built() -> None:
    with pytest.raises(ValueError, match="priority"):
        ops.Publish(CODEC, "g", Event(), 9)
    with pytest.raises(TypeError, match="group_id"):
        ops.Publish(CODEC, 3, Event(), 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a valid Event"):
        ops.Publish(CODEC, "g", {"n": 1}, 0)
    with pytest.raises(ValueError, match="reserved"):
        ops.Claim("__mine", 5, 0, None, "release")
    with pytest.raises(ValueError, match="visibility"):
        ops.Claim("w", 0, 0, None, "release")
    with pytest.raises(TypeError, match="items\\[1\\]"):
        ops.PublishMany(CODEC, [("g", Event(), 0), ("g", Event())])  # type: ignore[list-item]
    lease = Lease(1, "g", Event(), "w", 1, 0.0)
    with pytest.raises(ValueError, match="reason"):
        ops.Bury(lease, "  ", "release")
    with pytest.raises(ValueError, match="delay"):
        ops.Nack(lease, -1)


def test_a_call_is_packed_as_one_resp_array() -> None:
    keys = ops.queue_keys("q", scripts.ACK)
    packed = ops.Packer(keys).evalsha(scripts.ACK, ("grp", 7, "w", 1))
    parts = packed.split(b"\r\n")
    assert parts[0] == b"*%d" % (3 + len(keys) + 4)
    strings = parts[2::2][: 3 + len(keys) + 4]
    assert strings[:3] == [b"EVALSHA", scripts.ACK.sha.encode(), str(len(keys)).encode()]
    assert strings[3 : 3 + len(keys)] == [k.encode() for k in keys]
    assert strings[3 + len(keys) :] == [b"grp", b"7", b"w", b"1"]
    assert all(k.startswith("dt:{q}:") for k in keys)


def test_replies_are_read_exactly() -> None:
    claim = ops.Claim("w", 2.5, 0, None, "release")
    got = claim.result([1, 12, "g", '{"n":1}', 3, "1796317695.1234567"])
    assert got == Claimed(12, "g", '{"n":1}', "w", 3, 1796317695.1234567)
    idle = claim.result([0, "100.5", ""])
    assert idle == ops.Idle(100.5, None)
    assert ops.wait_timeout(10, ops.Idle(100.0, 100.5), 5) == pytest.approx(0.502)
    assert ops.wait_timeout(0.1, ops.Idle(100.0, None), 5) == 0.1
    lease = Lease(12, "g", Event(), "w", 3, 0.0)
    with pytest.raises(LeaseLost):
        ops.Ack(lease).result(0)
    with pytest.raises(RequeueRefused, match="worker 'w9'"):
        ops.Requeue(5).result([-1, "w9", "g"])
    op = ops.DeadLetters(None)
    assert op.args("") == (0, ops.CHUNK)
    letters = op.result([5, "g", 2, "{}", 4, "x", "", 3, 3, "lapsed", "1.5", 1, 0])
    assert isinstance(letters, list)
    assert letters[0].reason == exhausted_reason(3, 3, "lapsed")
    assert letters[0].held


def test_every_script_names_its_keys_and_arguments_once() -> None:
    for script in scripts.ALL:
        assert script.source.startswith("#!lua")
        assert len(set(script.keys)) == len(script.keys)
        body = script.body
        # Only publish_many, whose items are variadic, reads ARGV by position.
        if script is not scripts.PUBLISH_MANY:
            assert "ARGV[" not in body, script.name
        assert "KEYS[" not in body, script.name
        for name in re.findall(r"\bA\.(\w+)", body):
            assert name in script.args, (script.name, name)
        for name in re.findall(r"\bK\.(\w+)", body + scripts.HELPERS):
            assert name in scripts.QUEUE_KEYS, (script.name, name)


def _plan(source: str | None = "return 1", patience: float = 0.05) -> tuple[Any, list[Node]]:
    followed: list[Node] = []
    plan = recover(b"CALL", source, ("h", 1), followed.append, "redis://h:1/0", "ack", patience)
    next(plan)
    return plan, followed


def test_error_replies_are_worked_around_only_where_the_call_did_not_run() -> None:
    script_load = command("SCRIPT", "LOAD", "return 1")
    plan, followed = _plan()
    # MOVED with no host: the host the reply came from; the call goes to the new node.
    assert plan.send(rex.ResponseError("MOVED 7 :2")) == Exchange([b"CALL"])
    assert followed == [("h", 2)]
    # ASK: once to the node named, after ASKING; its NOSCRIPT loads the script there.
    assert plan.send(rex.AskError("7 10.0.0.3:3")) == Exchange([ASKING, b"CALL"], ("10.0.0.3", 3))
    assert plan.send(rex.NoScriptError("No matching script")) == Exchange(
        [script_load], ("10.0.0.3", 3)
    )
    assert plan.send("sha") == Exchange([ASKING, b"CALL"], ("10.0.0.3", 3))
    # TRYAGAIN: back to the queue's node after a pause that grows.
    first = plan.send(rex.TryAgainError("Multiple keys request during rehashing of slot"))
    assert (first.commands, first.node) == ([b"CALL"], None)
    second = plan.send(rex.ResponseError("TRYAGAIN Multiple keys"))
    assert second.pause == 2 * first.pause
    with pytest.raises(StopIteration) as done:
        plan.send([1, 2])
    assert done.value.value == [1, 2]


def _again_and_again(plan: Any, reply: rex.ResponseError) -> None:
    for _ in range(100):
        plan.send(reply)


def test_error_replies_that_no_retry_gets_around_raise_naming_the_call() -> None:
    plan, _ = _plan(patience=0.01)
    with pytest.raises(TransportError, match=r"did not settle within 0\.01 s; nothing was done"):
        _again_and_again(plan, rex.ResponseError("CLUSTERDOWN The cluster is down"))
    plan, _ = _plan()
    with pytest.raises(TransportError, match="keep redirecting"):
        _again_and_again(plan, rex.MovedError("7 h:2"))
    plan, _ = _plan(source=None)  # a plain command has no script to load
    with pytest.raises(TransportError, match="ack: the server refused the call \\(NOSCRIPT"):
        plan.send(rex.NoScriptError("No matching script"))
    plan, _ = _plan()
    plan.send(rex.NoScriptError("No matching script"))
    with pytest.raises(TransportError, match="NOSCRIPT"):  # loaded, yet gone again
        plan.send(rex.NoScriptError("No matching script"))
    plan, _ = _plan()
    with pytest.raises(TransportError, match="out of memory"):
        plan.send(rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
