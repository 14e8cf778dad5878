"""Observability hooks: what the worker tells the outside world about each delivery.

`Hooks` is the base class with a no-op for every event; `LoggingHooks`, the default, logs
one line per settled delivery at INFO and lost leases and failures at WARNING. The
OpenTelemetry hooks live in `_otel`, behind the ``otel`` extra. Hooks run on the worker's
own threads (or event loop): they must be quick and must not raise (an exception from a
hook is logged and ignored). Imports no transport.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from transports_core import Lease

from ._outcomes import Outcome

__all__ = ["Delivery", "Hooks", "LoggingHooks"]

LOGGER: Final = logging.getLogger("transports_worker")
_new: Final = tuple.__new__


class Delivery(NamedTuple):
    """One delivery as the hooks see it: which message, which attempt, which worker.
    (A named tuple: the worker makes one per delivery, and a frozen dataclass costs
    twice as much to make.)"""

    group_id: str
    seq: int
    attempt: int
    worker_id: str

    @classmethod
    def of(cls, lease: Lease[object]) -> Delivery:
        # tuple.__new__ directly: the named tuple's own __new__ is a Python function.
        return _new(cls, (lease.group_id, lease.seq, lease.attempt, lease.worker_id))


class Hooks:
    """Subclass and override what you need; every method does nothing here.

    For each delivery, `started` is called once, then `settled` once, whatever happens
    (``outcome`` says what). `renewed`, `renewal_failed` and `lost` report the lease
    keeper's work; `claimed_nothing`, a claim that returned no message.
    """

    def started(self, delivery: Delivery) -> None:
        """The handler is about to run."""

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        """The delivery ended after ``seconds``; ``error`` is what the handler raised."""

    def renewed(self, delivery: Delivery) -> None:
        """The lease keeper extended the lease."""

    def renewal_failed(self, delivery: Delivery, error: BaseException) -> None:
        """A renewal raised ``error`` (anything but `LeaseLost`, which `lost` reports):
        it is tried again, or the lease is lost if its end is too near."""

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        """The lease is gone (`LeaseLost`, or renewals failed until the lease's end)."""

    def claimed_nothing(self, worker_id: str) -> None:
        """A claim of worker ``worker_id`` returned no message."""


class LoggingHooks(Hooks):
    """Logs to the ``transports_worker`` logger: INFO per settled delivery, WARNING for
    failures and lost leases."""

    def __init__(self, logger: logging.Logger = LOGGER) -> None:
        self.logger = logger

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        level = logging.INFO if outcome in ("acked", "retried") else logging.WARNING
        if not self.logger.isEnabledFor(level):
            return
        why = "" if error is None else f": {type(error).__name__}: {error}"
        self.logger.log(
            level,
            "%s group=%s seq=%d attempt=%d in %.3fs%s",
            outcome,
            delivery.group_id,
            delivery.seq,
            delivery.attempt,
            seconds,
            why,
        )

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        self.logger.warning(
            "lease lost group=%s seq=%d attempt=%d: %s",
            delivery.group_id,
            delivery.seq,
            delivery.attempt,
            error,
        )


class Fanout:
    """Calls every hook in turn; an exception from one is logged, never raised. A hook
    that does not override an event is not called for it, so a worker whose hooks listen
    to nothing does no hook work per delivery."""

    EVENTS: Final = ("started", "settled", "renewed", "renewal_failed", "lost", "claimed_nothing")

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        for hook in hooks:
            if not isinstance(hook, Hooks):
                raise TypeError(f"hooks must be Hooks instances, got {hook!r}")
        self.hooks = tuple(hooks)
        self._calls: dict[str, tuple[Callable[..., None], ...]] = {
            event: tuple(
                getattr(hook, event)
                for hook in self.hooks
                if getattr(type(hook), event) is not getattr(Hooks, event)
            )
            for event in self.EVENTS
        }
        self._started = self._calls["started"]
        self._settled = self._calls["settled"]
        self._empty = bool(self._calls["claimed_nothing"])

    def _each(self, event: str, *args: object) -> None:
        for call in self._calls[event]:
            try:
                call(*args)
            except Exception:
                _failed(call, event)

    # `started` and `settled` come with every delivery: their loops are written out.

    def started(self, delivery: Delivery) -> None:
        for call in self._started:
            try:
                call(delivery)
            except Exception:
                _failed(call, "started")

    def settled(
        self, delivery: Delivery, outcome: Outcome, seconds: float, error: BaseException | None
    ) -> None:
        for call in self._settled:
            try:
                call(delivery, outcome, seconds, error)
            except Exception:
                _failed(call, "settled")

    def renewed(self, delivery: Delivery) -> None:
        self._each("renewed", delivery)

    def renewal_of(self, delivery: Delivery) -> Callable[[object], None] | None:
        """A keeper's ``on_renewed`` for ``delivery``: None when no hook listens."""
        if not self._calls["renewed"]:
            return None
        return lambda _: self.renewed(delivery)

    def renewal_failure_of(self, delivery: Delivery) -> Callable[[BaseException], None] | None:
        """A keeper's ``on_failed`` for ``delivery``: None when no hook listens."""
        if not self._calls["renewal_failed"]:
            return None
        return lambda error: self._each("renewal_failed", delivery, error)

    def lost(self, delivery: Delivery, error: BaseException) -> None:
        self._each("lost", delivery, error)

    def claimed_nothing(self, worker_id: str) -> None:
        if self._empty:
            self._each("claimed_nothing", worker_id)


def _failed(call: Callable[..., None], event: str) -> None:
    LOGGER.exception("hook %r failed in %s", getattr(call, "__self__", call), event)
