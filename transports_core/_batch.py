"""Many calls in one: the decisions of ``claim_many``, ``settle_many`` and
``ack_and_claim``, written once over any backend's operations.

Each is a generator of steps, like an `Operation`'s `steps`, that runs the steps of
several single operations one after another: a backend's operation for the batch
returns it from its own ``steps`` (or its PostgreSQL ``body``), so that the parts share
the batch's transaction and its one commit. ``part`` turns one single operation into its
steps as the backend runs it inside that transaction (`inline` unless the backend's
operations open a transaction of their own, which it then leaves out). A backend that
can do better than one single call after another (one statement for many groups, one
script for many leases) writes its own operation instead and keeps these for the cases
that statement does not cover.

Imports only ``_seam``, ``_codec``, ``_errors`` and ``_models``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._codec import Claimed
from ._errors import LeaseLost
from ._models import Settlement
from ._seam import More, Operation, Steps

__all__ = [
    "TURN_STEP",
    "Part",
    "claiming_many",
    "inline",
    "settle_op",
    "settling_many",
    "then_claiming",
]

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")

# How far apart in time a batch stamps its successive claims (seconds).
TURN_STEP = 1e-6

# How a backend runs one single operation inside a batch's transaction.
Part = Callable[[Operation[Any, Any, Any], "float | None"], Steps[Any, Any, Any]]


def inline(op: Operation[S, R, T], now: float | None) -> Steps[S, R, T]:
    """``op`` as one generator of steps: what `drive` does with it, without the I/O
    (`Operation.first` and `Operation.done`, then `More`'s operation or the steps)."""
    step = op.first(now)
    while step is not None:
        value = op.done((yield step), now)
        if not isinstance(value, More):
            return value
        if value.then is None:
            break
        op = value.then
        step = op.first(now)
    return (yield from op.steps(now))


def claiming_many(
    claim: Operation[Any, Any, Any],
    limit: int,
    now: float | None,
    part: Part = inline,
    ends: float | None = None,
) -> Steps[Any, Any, list[Claimed]]:
    """Up to ``limit`` successive ``claim``s, stopping at the first that leases nothing:
    what ``limit`` calls of ``claim`` would lease, in their order. A claim's value is a
    `Claimed` or anything else that says it found nothing (None, say).

    Each claim after the first reads the clock a microsecond later than the one before
    (when the backend's operations take the time from it): a group's turn is the time of
    its last claim, and the batch's groups must keep the order they were served in, not
    tie at one instant and fall back to the order of their messages. The batch ends
    before a claim whose time would be past its first lease's end (or ``ends``, that of
    leases the batch made before): with a visibility of a few microseconds, that claim
    would see the batch's own leases lapsed, and lease one of their groups again."""
    got: list[Claimed] = []
    while len(got) < limit:
        at = None if now is None else now + len(got) * TURN_STEP
        if got and ends is None:
            ends = got[0].expires_at
        if at is not None and ends is not None and at >= ends:
            break
        claimed = yield from part(claim, at)
        if not isinstance(claimed, Claimed):
            break
        got.append(claimed)
    return got


def settling_many(
    settles: Sequence[Operation[Any, Any, Any]], now: float | None, part: Part = inline
) -> Steps[Any, Any, list[LeaseLost]]:
    """Each of ``settles`` in turn; the `LeaseLost` of those whose lease was not current,
    in their order, while the others take effect. A settle that finds its lease stale
    changes nothing (the fence is the first thing it checks), so the batch goes on."""
    stale: list[LeaseLost] = []
    for settle in settles:
        try:
            yield from part(settle, now)
        except LeaseLost as lost:
            stale.append(lost)
    return stale


def then_claiming(
    settle: Operation[Any, Any, Any],
    claim: Operation[Any, Any, Any],
    now: float | None,
    part: Part = inline,
) -> Steps[Any, Any, Any]:
    """``settle`` (an ack), then ``claim``: `LeaseLost` from the settle ends it with
    nothing claimed."""
    yield from part(settle, now)
    return (yield from part(claim, now))


def settle_op(ops: Any, settlement: Settlement[Any], on_dead: str) -> Operation[Any, Any, None]:
    """The backend's single operation for one item of ``settle_many``, built and checked
    by its builder (``ops``: the backend's `Operations`)."""
    if settlement.action == "ack":
        op: Operation[Any, Any, None] = ops.Ack(settlement.lease)
    elif settlement.action == "nack":
        op = ops.Nack(settlement.lease, settlement.delay)
    else:
        op = ops.BuryLease(settlement.lease, settlement.reason, on_dead)
    return op
