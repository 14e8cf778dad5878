"""The sans-I/O half, with no server: arguments are checked when an operation is built,
calls are packed in the wire format, replies are read back exactly, and every script
declares its keys and arguments once."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import pytest
import redis.exceptions as rex

from transports_core import Event, Lease, LeaseLost, RequeueRefused, TransportError
from transports_core.backend import AFTER_DUE, Claimed, EventCodec, drive, exhausted_reason
from transports_redis import _ops as ops
from transports_redis import _scripts as scripts
from transports_redis._errors import ASKING, Exchange, FunctionsRefused, Node, Recover
from transports_redis._ops import command

T = TypeVar("T")

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
        ops.BuryLease(lease, "  ", "release")
    with pytest.raises(ValueError, match="delay"):
        ops.Nack(lease, -1)


@pytest.mark.parametrize("functions", [True, False])
def test_a_call_is_packed_as_one_resp_array(functions: bool) -> None:
    keys = ops.queue_keys("q", scripts.ACK)
    packer = ops.Packer("q", functions)
    packed = packer.call(scripts.ACK, ("grp", 7, "w", 1))
    parts = packed.split(b"\r\n")
    assert parts[0] == b"*%d" % (3 + len(keys) + 4)
    strings = parts[2::2][: 3 + len(keys) + 4]
    if functions:
        named = [b"FCALL", f"{scripts.LIBRARY.name}_ack".encode()]
        assert packer.loader(scripts.ACK) is scripts.LIBRARY
    else:
        named = [b"EVALSHA", scripts.ACK.sha.encode()]
        assert packer.loader(scripts.ACK) is scripts.ACK
    assert strings[:3] == [*named, str(len(keys)).encode()]
    assert strings[3 : 3 + len(keys)] == [k.encode() for k in keys]
    assert strings[3 + len(keys) :] == [b"grp", b"7", b"w", b"1"]
    assert all(k.startswith("dt:{q}:") for k in keys)


def test_a_claim_on_the_servers_clock_is_packed_once() -> None:
    claim, packer = ops.Claim("w", 2.5, 0, None, "release"), ops.Packer("q")
    first = packer.call(*claim.first(None))
    assert packer.call(*claim.first(None)) is first
    assert first == ops.Packer("q").call(scripts.CLAIM, tuple(claim.first(None)[1]))
    timed = packer.call(*claim.first(100.25))
    assert timed != first
    assert b"100.25" in timed
    assert packer.call(*claim.first(None)) == first


def test_replies_are_read_exactly() -> None:
    claim = ops.Claim("w", 2.5, 0, None, "release")
    assert claim.first(None) == (scripts.CLAIM, ("w", "2.5", 0, "", 0, "release", 0, 250))
    assert claim.first(100.25)[1][3] == "100.25"
    got = claim.done([1, 12, "g", '{"n":1}', 3, "1796317695.1234567"], None)
    assert got == Claimed(12, "g", '{"n":1}', "w", 3, 1796317695.1234567)
    idle = claim.done([0, "100.5", ""], None)
    assert idle == ops.Idle(100.5, None)
    assert claim.woken().first(None)[1][6] == 1
    lease = Lease(12, "g", Event(), "w", 3, 0.0)
    with pytest.raises(LeaseLost):
        ops.Ack(lease).done(0, None)
    with pytest.raises(RequeueRefused, match="worker 'w9'"):
        ops.Requeue(5).done([-1, "w9", "g"], None)
    assert ops.Unclaim(got).first(None) == (scripts.UNCLAIM, ("g", 12, "w", 3))


def _run(op: ops.Op[T], replies: list[Any]) -> tuple[T, list[ops.ScriptCall]]:
    """Drive ``op`` with no server: its value, and the calls it made."""
    calls: list[ops.ScriptCall] = []

    def execute(call: ops.ScriptCall) -> Any:
        calls.append(call)
        return replies.pop(0)

    return drive(op, None, execute), calls


def _dead_row(seq: int) -> list[Any]:
    return [seq, "g", 2, "{}", 4, "x", "", 3, 3, "lapsed", "1.5", 1, 0]


def test_admin_calls_page_one_script_a_chunk_and_keep_nothing_on_the_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ops, "CHUNK", 2)
    op = ops.DeadLetters(3)
    letters, calls = _run(op, [[*_dead_row(5), *_dead_row(6)], _dead_row(9)])
    assert [c[1] for c in calls] == [(0, 2), (6, 1)]  # from where the last page ended
    assert [letter.seq for letter in letters] == [5, 6, 9]
    assert letters[0].reason == exhausted_reason(3, 3, "lapsed")
    assert letters[0].held
    # The same operation, run again (a kept one may be), starts over.
    again, calls = _run(op, [_dead_row(7)])
    assert [letter.seq for letter in again] == [7]
    assert [c[1] for c in calls] == [(0, 2)]

    purged, calls = _run(ops.PurgeGroup("g"), [[2, "9", 1], [1, "9", 0]])
    assert purged == 3
    assert [c[1] for c in calls] == [("g", "", 2), ("g", "9", 2)]


def test_a_batch_is_one_script_call_per_batch_of_items_and_stops_when_a_claim_finds_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ops, "BATCH", 2)
    claim = ops.Claim("w", 30, 1, 3, "hold")
    lease = ["12", "g", "{}", "1", "1000.5"]
    # Five asked: two a call; the third call leases one of the two it asks, so it ends.
    got, calls = _run(ops.ClaimMany(claim, 5), [[0, *lease * 2], [0, *lease * 2], [0, *lease]])
    assert len(got) == 5
    assert got[0] == Claimed(12, "g", "{}", "w", 1, 1000.5)
    assert [c[0] for c in calls] == [scripts.CLAIM_MANY] * 3
    # The calls after the first pass on the end of the batch's first lease.
    assert [c[1] for c in calls] == [
        (*claim.first(None)[1], n, ends) for n, ends in ((2, ""), (2, "1000.5"), (1, "1000.5"))
    ]
    got, calls = _run(ops.ClaimMany(claim, 5), [[0, *lease]])  # one found, then none: done
    assert len(got) == 1
    assert len(calls) == 1
    # A script that stopped after freeing many lapsed leases: the batch goes on.
    got, calls = _run(ops.ClaimMany(claim, 3), [[1, *lease], [0, *lease * 2]])
    assert len(got) == 3
    assert [c[1][-2:] for c in calls] == [(2, ""), (2, "1000.5")]

    leases = [Lease(s, "g", Event(), "w", 1, 0.0) for s in (1, 2, 3)]
    settles: list[ops.Settling] = [
        ops.Ack(leases[0]),
        ops.Nack(leases[1], 2.5),
        ops.BuryLease(leases[2], "bad", "hold"),
    ]
    # The script names the stale items of its chunk by index: each maps to its lease.
    lost, calls = _run(ops.SettleMany(settles), [[1], [0]])
    assert [x.lease for x in lost] == [leases[1], leases[2]]
    assert [c[1] for c in calls] == [
        [2, "", "ack", "g", 1, "w", 1, "", "", "nack", "g", 2, "w", 1, "2.5", ""],
        [1, "", "bury", "g", 3, "w", 1, "buried: bad", "hold"],
    ]

    both = ops.AckAndClaim(ops.Ack(leases[0]), claim)
    assert both.first(7.5) == (scripts.ACK_AND_CLAIM, ("g", 1, "w", 1, *claim.first(7.5)[1]))
    with pytest.raises(LeaseLost):
        both.done(0, None)
    assert both.done([0, "100.5", ""], None) == ops.Idle(100.5, None)
    assert both.done([1, *lease], None) == Claimed(12, "g", "{}", "w", 1, 1000.5)


def test_a_waiter_claims_again_only_when_something_may_have_changed() -> None:
    claim = ops.Claim("w", 30, 2, None, "release")
    waiter = ops.Waiter(claim, ops.Idle(1000.0, 1000.5), at=10.0, recheck=5.0)
    assert waiter.floor == 2
    first = waiter.look()
    assert first.due == pytest.approx(10.5)  # the server's deadline, on the plan's clock
    assert waiter.claim() is None  # the plan's first claim: the call made it already
    # The BLPOP is cut at the reported end, and never asks to block for ever (0).
    assert waiter.timeout(5.0, at=10.0) == pytest.approx(0.5 + AFTER_DUE)
    assert waiter.timeout(1e-9, at=10.0) == 0.001
    # A timeout short of the recheck changes nothing; one at the recheck may have missed
    # a token (taken by a claim that never claimed).
    assert not waiter.woke(None, 0.5)
    assert waiter.look() == first
    assert not waiter.woke(None, 5.0)
    assert waiter.look() != first
    assert waiter.claim() is claim  # no token taken: none to pass on
    # A token: the next claim passes the wake-up on; only that one.
    assert waiter.woke("token", 1.0)
    passes_on = waiter.claim()
    assert passes_on is not None
    assert passes_on.first(None) == claim.woken().first(None) != claim.first(None)
    assert waiter.claim() is claim
    # A claim that reports a new end changes the look; a lease ends the wait.
    seen = waiter.look()
    assert waiter.found(ops.Idle(1001.0, 1003.0), at=11.0) is None
    assert waiter.look() != seen
    assert waiter.look().due == pytest.approx(13.0)
    leased = Claimed(1, "g", "{}", "w", 1, 1030.0)
    assert waiter.found(leased, at=11.0) is leased
    assert waiter.woke("close", 1.0)  # woken; the plan's closed() then ends it


def test_every_script_names_its_keys_and_arguments_once() -> None:
    for script in scripts.ALL:
        assert script.source.startswith("#!lua")
        assert len(set(script.keys)) == len(script.keys)
        body = script.body
        # Only the batches, whose items are variadic, and the upgrade, which is handed
        # the groups it has yet to walk, read ARGV by position.
        if script not in (
            scripts.PUBLISH_MANY,
            scripts.PUBLISH_MANY_KEYED,
            scripts.PUBLISH_MANY_WITH,
            scripts.SETTLE_MANY,
            scripts.UPGRADE,
        ):
            assert "ARGV[" not in body, script.name
        assert "KEYS[" not in body, script.name
        for name in re.findall(r"\bA\.(\w+)", body):
            assert name in script.args, (script.name, name)
        # What it sends, its helpers included (only those it reaches: see `shaken`).
        for name in re.findall(r"\bK\.(\w+)", script.source):
            assert name in script.keys, (script.name, name)
        for name in re.findall(r"\bK\.(\w+)", scripts.HELPERS):
            assert name in scripts.QUEUE_KEYS, name
        # Every key of a queue shares its hash tag, the keys' structures too.
        assert all(k.startswith("dt:{q}:") for k in ops.queue_keys("q", script))


def test_a_script_carries_only_the_helpers_it_reaches() -> None:
    code = scripts.shaken(
        "-- a note\nlocal function a() return 1 end\n-- b's\nlocal function b(x)\n"
        "  return a() + x\nend\nlocal function c()\n  return 3\nend\nreturn b(2)"
    )
    assert code.split("\n") == [
        "-- a note",
        "local function a() return 1 end",
        "-- b's",
        "local function b(x)",
        "  return a() + x",
        "end",
        "return b(2)",
    ]
    # The ack reaches the chain's helpers, not the dead letters' nor the keys'.
    assert "local function advance(" in scripts.ACK.source
    assert "local function unbury(" not in scripts.ACK.source
    assert "key" not in scripts.ACK.keys
    assert scripts.used_keys("K['r' .. p], K.g") == {"g", *scripts.READY_KEYS}


def _plan(
    first: rex.ResponseError,
    source: scripts.Script | scripts.Library | None = scripts.NOTHING,
    patience: float = 0.05,
) -> tuple[Any, Exchange, list[Node]]:
    """`Recover`'s steps after ``first``, and the first of them."""
    followed: list[Node] = []
    plan = Recover(
        first, b"CALL", source, ("h", 1), followed.append, "redis://h:1/0", "ack", patience
    ).steps(None)
    return plan, next(plan), followed


def test_error_replies_are_worked_around_only_where_the_call_did_not_run() -> None:
    script_load = command("SCRIPT", "LOAD", scripts.NOTHING.source)
    # MOVED with no host: the host the reply came from; the call goes to the new node.
    plan, step, followed = _plan(rex.ResponseError("MOVED 7 :2"))
    assert step == Exchange([b"CALL"])
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
    down = rex.ResponseError("CLUSTERDOWN The cluster is down")
    plan, _, _ = _plan(down, patience=0.01)
    with pytest.raises(TransportError, match=r"did not settle within 0\.01 s; nothing was done"):
        _again_and_again(plan, down)
    plan, _, _ = _plan(rex.MovedError("7 h:2"))
    with pytest.raises(TransportError, match="keep redirecting"):
        _again_and_again(plan, rex.MovedError("7 h:2"))
    no_script = rex.NoScriptError("No matching script")
    with pytest.raises(TransportError, match="ack: the server refused the call \\(NOSCRIPT"):
        _plan(no_script, source=None)  # a plain command has no script to load
    plan, _, _ = _plan(no_script)
    plan.send("sha")
    with pytest.raises(TransportError, match="NOSCRIPT"):  # loaded, yet gone again
        plan.send(rex.NoScriptError("No matching script"))
    with pytest.raises(TransportError, match="out of memory"):
        _plan(rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))


def test_a_missing_library_is_loaded_and_a_refused_one_falls_back_to_scripts() -> None:
    library = scripts.LIBRARY
    load = command("FUNCTION", "LOAD", "REPLACE", library.source)
    missing = rex.ResponseError("Function not found")
    plan, step, _ = _plan(missing, library)
    assert step == Exchange([load])
    assert plan.send(library.name) == Exchange([b"CALL"])
    with pytest.raises(TransportError, match="Function not found"):  # loaded, yet gone
        plan.send(missing)
    # Refused, by an ACL or a full server: the runner sends the call as EVALSHA instead.
    for refusal in (
        rex.ResponseError("NOPERM this user has no permissions to run the 'function' command"),
        rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    ):
        plan, _, _ = _plan(missing, library)
        with pytest.raises(FunctionsRefused):
            plan.send(refusal)
    with pytest.raises(FunctionsRefused):  # FCALL itself refused
        _plan(rex.ResponseError("NOPERM this user has no permissions to run 'fcall'"), library)
    # A server still loading its data set: the call's own wait applies, not a fallback.
    plan, _, _ = _plan(missing, library)
    with pytest.raises(TransportError, match="LOADING"):
        plan.send(rex.BusyLoadingError("Redis is loading the dataset in memory"))


def test_the_library_holds_every_script_once_its_helpers_made_at_load() -> None:
    library = scripts.LIBRARY
    assert library.source.startswith(f"#!lua name={library.name}\n")
    assert re.fullmatch(r"dt_[0-9a-f]{40}", library.name)
    names = re.findall(r"function_name = '(\w+)'", library.source)
    assert names == [library.function(script) for script in scripts.ALL]
    # Each shared helper once, ahead of the functions; each body only its own code.
    for helper in ("advance", "claim_one", "append_many", "put_helpers", "owner", "forget"):
        assert library.source.count(f"local function {helper}(") == 1, helper
    assert library.source.count("local function first_timer(") == 2  # and in claim's own
    assert "local function claim_one(" not in scripts._own(scripts.CLAIM.body)
    # Loading runs the library's top level, where Redis lets no library be called: its
    # values are literals.
    top = library.source.split("redis.register_function")[0]
    for line in top.split("\n"):
        if line.startswith("local ") and not line.startswith("local function"):
            assert not re.search(r"\b(string|math|table|redis|cmsgpack|struct)\.", line), line
