"""The runtime's public surface and its refusals: exports, options, handlers, the retry
policy's arithmetic. No transport is opened here."""

from __future__ import annotations

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
    ("options", "said"),
    [
        ({"concurrency": 0}, "concurrency must be a whole number >= 1, got 0"),
        ({"concurrency": True}, "got True"),
        ({"visibility": 0}, "visibility must be > 0 seconds, got 0"),
        ({"visibility": float("nan")}, "visibility must be a finite number"),
        ({"timeout": -1}, "timeout must be > 0 seconds, got -1"),
        ({"grace": -0.5}, "grace must be >= 0 seconds, got -0.5"),
        ({"min_priority": -1}, "min_priority must be a whole number >= 0, got -1"),
        ({"worker_id": "__mine"}, "'__mine' is reserved"),
    ],
)
def test_bad_options_are_refused_naming_the_value(options: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        Worker("sqlite:///:memory:", handle, **options)
    with pytest.raises(ValueError, match=re.escape(said)):
        AsyncWorker("sqlite:///:memory:", ahandle, **options)


def test_a_handler_of_the_wrong_kind_or_shape_is_refused() -> None:
    with pytest.raises(TypeError, match="is an async function: run it with AsyncWorker"):
        Worker("sqlite:///:memory:", ahandle)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is not an async function: run it with Worker"):
        AsyncWorker("sqlite:///:memory:", handle)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must take two arguments, \(event, ctx\)"):
        Worker("sqlite:///:memory:", lambda event: None)  # type: ignore[arg-type,misc]
    with pytest.raises(TypeError, match="must be callable"):
        Worker("sqlite:///:memory:", 3)  # type: ignore[arg-type]


def test_retry_policy_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="max_attempts must be a whole number >= 1 or None"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="jitter must be between 0 and 1, got 2"):
        RetryPolicy(jitter=2)
    with pytest.raises(ValueError, match="base must be a finite number"):
        RetryPolicy(base=float("inf"))
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
    with pytest.raises(ValueError, match="Retry delay must be >= 0, got -1"):
        Retry(-1)
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
