"""The runtime's public surface and its refusals: exports, options, handlers, the retry
policy's arithmetic. No transport is opened here."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import transports_worker
from transports_core import Event, LeaseLost
from transports_worker import (
    AsyncContext,
    AsyncWorker,
    Bury,
    Context,
    Retry,
    RetryPolicy,
    Worker,
)

REPO = Path(__file__).resolve().parents[2]


def handle(event: Event, ctx: Context[Event]) -> None:
    pass


async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
    pass


def _sort_key(name: str) -> tuple[int, str]:
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_and_every_name_resolves() -> None:
    names = transports_worker.__all__
    assert names == sorted(names, key=_sort_key)
    for name in names:
        assert getattr(transports_worker, name) is not None


def test_importing_the_runtime_imports_neither_opentelemetry_nor_pytest() -> None:
    code = (
        "import sys, transports_worker; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'pytest')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"concurrency": 0}, ValueError, "concurrency must be >= 1, got 0"),
        ({"concurrency": True}, TypeError, "concurrency must be an int >= 1, got True"),
        ({"concurrency": 2.0}, TypeError, "got 2.0"),
        ({"visibility": 0}, ValueError, "visibility must be > 0 seconds, got 0"),
        ({"visibility": float("nan")}, ValueError, "visibility must be finite, got nan"),
        ({"visibility": "30"}, TypeError, "visibility must be a number of seconds, got '30'"),
        ({"timeout": -1}, ValueError, "timeout must be > 0 seconds, got -1"),
        ({"grace": -0.5}, ValueError, "grace must be >= 0 seconds, got -0.5"),
        ({"grace": None}, TypeError, "grace must be a number of seconds, got None"),
        ({"min_priority": -1}, ValueError, "min_priority must be from 0 to 4, got -1"),
        ({"min_priority": 9}, ValueError, "min_priority must be from 0 to 4, got 9"),
        ({"worker_id": "__mine"}, ValueError, "'__mine' is reserved"),
    ],
)
def test_bad_options_are_refused_naming_the_value(
    options: dict[str, Any], error: type[Exception], said: str
) -> None:
    # One error shape for the worker and the transports: ValueError for a bad value,
    # TypeError for a wrong type, each naming the option and the value.
    with pytest.raises(error, match=re.escape(said)) as sync_info:
        Worker("sqlite:///:memory:", handle, **options)
    with pytest.raises(error, match=re.escape(said)) as async_info:
        AsyncWorker("sqlite:///:memory:", ahandle, **options)
    assert type(sync_info.value) is type(async_info.value) is error


def test_a_handler_of_the_wrong_kind_or_shape_is_refused() -> None:
    with pytest.raises(TypeError, match="is an async function: run it with AsyncWorker"):
        Worker("sqlite:///:memory:", ahandle)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is not an async function: run it with Worker"):
        AsyncWorker("sqlite:///:memory:", handle)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must take two arguments, \(event, ctx\)"):
        Worker("sqlite:///:memory:", lambda event: None)  # type: ignore[arg-type,misc]
    with pytest.raises(TypeError, match="must be callable"):
        Worker("sqlite:///:memory:", 3)  # type: ignore[arg-type]


def _traced(fn: Any) -> Any:
    """A plain decorator, as logging or tracing middleware is: a plain function that
    returns what ``fn`` returns (a coroutine, for an async ``fn``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class _AsyncCallable:
    async def __call__(self, event: Event, ctx: AsyncContext[Event]) -> None:
        pass


def test_an_async_handler_behind_a_decorator_is_refused_by_worker_and_taken_by_async_worker() -> (
    None
):
    with pytest.raises(TypeError, match="is an async function: run it with AsyncWorker"):
        Worker("sqlite:///:memory:", _traced(ahandle))
    with pytest.raises(TypeError, match="is an async function: run it with AsyncWorker"):
        Worker("sqlite:///:memory:", _AsyncCallable())  # type: ignore[arg-type]
    AsyncWorker("sqlite:///:memory:", _traced(ahandle))
    AsyncWorker("sqlite:///:memory:", _AsyncCallable())
    with pytest.raises(TypeError, match="is not an async function: run it with Worker"):
        AsyncWorker("sqlite:///:memory:", _traced(handle))


def test_retry_policy_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(TypeError, match="max_attempts must be an int >= 1, got '3'"):
        RetryPolicy(max_attempts="3")  # type: ignore[arg-type]  # a wrong type, on purpose
    with pytest.raises(ValueError, match="jitter must be from 0 to 1, got 2"):
        RetryPolicy(jitter=2)
    with pytest.raises(ValueError, match="jitter must be from 0 to 1, got nan"):
        RetryPolicy(jitter=float("nan"))
    with pytest.raises(ValueError, match="base must be finite, got inf"):
        RetryPolicy(base=float("inf"))
    with pytest.raises(ValueError, match="cap must be >= 0 seconds, got -1"):
        RetryPolicy(cap=-1)
    with pytest.raises(TypeError, match="permanent must be a tuple of exception classes"):
        RetryPolicy(permanent=(int,))  # type: ignore[arg-type]


def test_backoff_doubles_up_to_the_cap_and_jitter_only_shortens() -> None:
    steady = RetryPolicy(base=1.0, cap=10.0, jitter=0.0)
    assert [steady.backoff(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert steady.backoff(10_000) == 10.0
    shaken = RetryPolicy(base=1.0, cap=10.0, jitter=0.5, random=lambda: 1.0)
    assert shaken.backoff(3) == 2.0
    assert RetryPolicy(jitter=0.5, random=lambda: 0.0).backoff(1) == 1.0


def test_the_last_attempt_and_permanent_errors_are_final() -> None:
    policy = RetryPolicy(max_attempts=3, permanent=(KeyError,))
    assert not policy.is_final(ValueError(), 2)
    assert policy.is_final(ValueError(), 3)
    assert policy.is_final(KeyError(), 1)
    assert not RetryPolicy(max_attempts=None).is_final(ValueError(), 10**6)


def test_retry_and_bury_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="Retry delay must be >= 0 seconds, got -1"):
        Retry(-1)
    with pytest.raises(TypeError, match="Retry delay must be a number of seconds, got '1'"):
        Retry("1")  # type: ignore[arg-type]  # a wrong type, on purpose
    with pytest.raises(ValueError, match="Bury needs a non-empty reason, got ' '"):
        Bury(" ")
    assert Retry(2).delay == 2.0
    assert Bury("why").reason == "why"


def test_a_url_password_never_shows_in_the_repr() -> None:
    worker = Worker("postgresql://me:s3cret@db/jobs", handle)
    assert "s3cret" not in repr(worker)
    assert "s3cret" not in repr(AsyncWorker("postgresql://me:s3cret@db/jobs", ahandle))


def test_lease_lost_is_what_check_raises() -> None:
    # The names a handler catches are the contract's own.
    assert issubclass(transports_worker.Cancelled, Exception)
    assert not issubclass(transports_worker.Cancelled, LeaseLost)
