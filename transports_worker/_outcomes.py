"""What a handler can say about a delivery besides returning: `Retry`, `Bury`, and the
`RetryPolicy` that decides what an unexpected exception means. Also `Cancelled`, what
``ctx.check()`` raises once the worker stops waiting for a handler.

Pure values: no I/O, no clock but the one passed in, no transport.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from transports_core.backend import MAX_REASON, check_count, check_seconds

__all__ = ["Bury", "Cancelled", "Outcome", "Retry", "RetryPolicy"]

Outcome = Literal["acked", "retried", "failed", "buried", "lost", "handed_back"]
"""How a delivery ended: ``acked`` (the handler returned, or its ``ctx.ack_within``
committed), ``retried`` (it raised `Retry`), ``failed`` (an exception, nacked with the
policy's backoff), ``buried`` (a dead letter), ``lost`` (the lease was lost: nothing was
settled), ``handed_back`` (cancelled at shutdown and nacked at once for another worker)."""


class Retry(Exception):
    """Raise from a handler to have the message delivered again after ``delay`` seconds.

    The message is nacked with that delay: its group waits, so order is kept. Retry is
    the handler's own decision: the policy never buries for it. But each delivery it
    ends counts as an attempt, toward `RetryPolicy.max_attempts` and its backoff as
    toward the transport's ``max_attempts`` (see docs/worker.md).
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = check_seconds(delay, "Retry delay", zero=True)
        super().__init__(f"retry in {self.delay:g}s")


class Bury(Exception):
    """Raise from a handler to make the message a dead letter now, with ``reason``. The
    reason is stored as `storable_reason` makes it: a NUL or a lone surrogate escaped,
    and cut to the transport's longest reason."""

    def __init__(self, reason: str) -> None:
        given: object = reason
        if not isinstance(given, str) or not given.strip():
            raise ValueError(f"Bury needs a non-empty reason, got {given!r}")
        self.reason = given
        super().__init__(reason)


class Cancelled(Exception):
    """Raised by ``ctx.check()`` and ``ctx.sleep()`` once the worker has stopped waiting
    for the handler: its ``timeout`` passed, or shutdown's ``grace`` ran out. The delivery
    is already settled (or handed back) when a sync handler sees it; nothing the handler
    does afterwards is settled. ``why`` is ``"timeout"`` or ``"shutdown"``."""

    def __init__(self, why: Literal["timeout", "shutdown"]) -> None:
        self.why = why
        super().__init__(f"handler cancelled: {why}")


@dataclass(frozen=True)
class RetryPolicy:
    """What an exception from a handler (other than `Retry` and `Bury`) leads to.

    * an instance of one of ``permanent``, or a failure on delivery ``max_attempts``:
      a dead letter whose reason is the exception's type and message;
    * anything else: ``nack`` with an exponential backoff, ``base * 2 ** (attempt - 1)``
      capped at ``cap`` seconds, of which a random share up to ``jitter`` is taken off
      (so that failures of many groups do not come back at one moment).

    ``max_attempts=None`` never buries for running out of attempts.
    """

    max_attempts: int | None = 10
    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5
    permanent: tuple[type[BaseException], ...] = ()
    random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts is not None:
            check_count(self.max_attempts, "max_attempts")
        check_seconds(self.base, "base", zero=True)
        check_seconds(self.cap, "cap", zero=True)
        jitter: object = self.jitter
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
            raise TypeError(f"jitter must be a number from 0 to 1, got {jitter!r}")
        if not 0 <= jitter <= 1:  # nan too
            raise ValueError(f"jitter must be from 0 to 1, got {jitter!r}")
        permanent: object = self.permanent
        if not isinstance(permanent, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in permanent
        ):
            raise TypeError(
                f"permanent must be a tuple of exception classes, got {self.permanent!r}"
            )

    def is_final(self, error: BaseException, attempt: int) -> bool:
        """Whether a failure of delivery ``attempt`` with ``error`` makes a dead letter."""
        if isinstance(error, self.permanent):
            return True
        return self.max_attempts is not None and attempt >= self.max_attempts

    def backoff(self, attempt: int) -> float:
        """Seconds to park the message after its delivery ``attempt`` failed."""
        # Capping the exponent first keeps 2 ** n finite for any attempt count.
        delay = min(self.cap, self.base * 2.0 ** min(max(attempt - 1, 0), 64))
        return delay * (1.0 - self.jitter * self.random())


def storable_reason(text: str) -> str:
    """``text`` as a reason every transport takes: a NUL character and lone surrogates
    (which no store keeps) written as their escapes, and at most `MAX_REASON` characters
    (a traceback belongs in the log, not here)."""
    text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def failure_reason(error: BaseException) -> str:
    """The dead letter reason for a handler's exception: its type and message, made
    storable (`storable_reason`)."""
    text = str(error)
    name = type(error).__qualname__
    return storable_reason(f"{name}: {text}" if text.strip() else name)
