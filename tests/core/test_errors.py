"""The library's errors survive pickling with everything they carry: a handler that runs
in a process pool, or any code that sends an error between processes, hands its caller
the same error. Python's default rebuilds an exception by calling its class with its
message, which none of ours takes."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from transports_core import (
    Event,
    EventDecodeError,
    Lease,
    LeaseLost,
    OutcomeUnknown,
    RequeueRefused,
    TransportError,
    UnknownBackend,
    Unsupported,
)
from transports_redis._errors import NotReplicated

LEASE = Lease(7, "order-7", Event(step=2), "worker-1", 3, 1_000.0)


def _decode_error() -> EventDecodeError:
    error = EventDecodeError(Lease(8, "order-8", '{"step": "x"}', "worker-1", 1, 1_000.0), "bad")
    error.others.append(LEASE)
    return error


ERRORS: list[TransportError] = [
    LeaseLost(LEASE, "redelivered"),
    LeaseLost(LEASE),
    _decode_error(),
    RequeueRefused(9, "order-9", "worker-2"),
    RequeueRefused(9, "order-9", None, held_by=4),
    Unsupported("timers", "example"),
    OutcomeUnknown("ack", "connection reset"),
    NotReplicated("publish", "1 of 2 replicas"),
    UnknownBackend("nosuch", ["sqlite", "redis"], asynchronous=True),
]


def _same(a: BaseException, b: BaseException) -> None:
    assert type(a) is type(b)
    assert str(a) == str(b)
    assert a.args == b.args
    assert a.__dict__ == b.__dict__


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_pickling_keeps_the_error_whole(error: TransportError) -> None:
    _same(pickle.loads(pickle.dumps(error)), error)


def test_notes_survive_too() -> None:
    error = LeaseLost(LEASE, "gone")
    error.__notes__ = ["seen by the keeper"]
    back = pickle.loads(pickle.dumps(error))
    assert back.__notes__ == ["seen by the keeper"]
    assert back.reason == "gone"


def _raise(index: int) -> Any:
    raise ERRORS[index]


def test_an_error_raised_in_a_process_pool_reaches_the_caller_whole() -> None:
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        for index, error in enumerate(ERRORS):
            with pytest.raises(TransportError) as raised:
                pool.submit(_raise, index).result(timeout=60)
            _same(raised.value, error)
    lost = ERRORS[0]
    assert isinstance(lost, LeaseLost)
    assert lost.lease.event == Event(step=2)
