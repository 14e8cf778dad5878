"""What both workers share: argument checks, the handler's signature check, the worker
id, and the decision a finished handler leads to. No I/O.
"""

from __future__ import annotations

import inspect
import math
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from transports_core import LeaseLost
from transports_core.backend import check_worker_id

from ._outcomes import Bury, Cancelled, Outcome, Retry, RetryPolicy, failure_reason

__all__ = [
    "EXIT_DRAINED",
    "EXIT_HANDED_BACK",
    "Settle",
    "check_handler",
    "check_options",
    "decide",
    "default_worker_id",
]

EXIT_DRAINED: Final = 0
# EX_TEMPFAIL from sysexits.h: stopped before its work was done; that work is not lost.
EXIT_HANDED_BACK: Final = 75


@dataclass(frozen=True, slots=True)
class Settle:
    """What to do with a lease once its handler has ended."""

    action: Literal["ack", "nack", "bury", "none"]
    outcome: Outcome
    delay: float = 0.0
    reason: str = ""


ACK: Final = Settle("ack", "acked")


def decide(error: BaseException | None, attempt: int, policy: RetryPolicy) -> Settle:
    """The settle that a handler's return (``error`` None) or exception leads to."""
    if error is None:
        return ACK
    if isinstance(error, Retry):
        return Settle("nack", "retried", delay=error.delay)
    if isinstance(error, Bury):
        return Settle("bury", "buried", reason=error.reason)
    if isinstance(error, (LeaseLost, Cancelled)):
        return Settle("none", "lost")
    if policy.is_final(error, attempt):
        return Settle("bury", "buried", reason=failure_reason(error))
    return Settle("nack", "failed", delay=policy.backoff(attempt))


def default_worker_id() -> str:
    """Host, process and a random suffix: unique, and readable in ``transports inspect``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _seconds(name: str, value: object, *, allow_none: bool = False, positive: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'>' if positive else '>='} 0 seconds, got {value!r}")


def check_options(
    *,
    concurrency: object,
    visibility: object,
    timeout: object,
    grace: object,
    min_priority: object,
    worker_id: object,
    retry: object,
) -> None:
    """Refuse bad worker options with an error naming the value, before anything runs."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a whole number >= 1, got {concurrency!r}")
    _seconds("visibility", visibility)
    _seconds("timeout", timeout, allow_none=True)
    _seconds("grace", grace, positive=False)
    if isinstance(min_priority, bool) or not isinstance(min_priority, int) or min_priority < 0:
        raise ValueError(f"min_priority must be a whole number >= 0, got {min_priority!r}")
    if worker_id is not None:
        check_worker_id(worker_id)
    if not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")


def check_handler(handler: object, *, asynchronous: bool) -> None:
    """A handler is called as ``handler(event, ctx)``; a coroutine function for
    `AsyncWorker`, a plain one for `Worker`."""
    if not callable(handler):
        raise TypeError(f"the handler must be callable, got {handler!r}")
    name = getattr(handler, "__qualname__", repr(handler))
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(None, None)
        except TypeError:
            raise TypeError(
                f"handler {name} must take two arguments, (event, ctx); its signature is "
                f"{name}{signature}"
            ) from None
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    )
    if asynchronous and not is_async:
        raise TypeError(f"handler {name} is not an async function: run it with Worker")
    if not asynchronous and is_async:
        raise TypeError(f"handler {name} is an async function: run it with AsyncWorker")


def describe_handler(handler: Callable[..., object]) -> str:
    module = getattr(handler, "__module__", None)
    name = getattr(handler, "__qualname__", None) or repr(handler)
    return f"{module}:{name}" if module else name
