"""The metrics both exporters serve, written down once: `METRICS`, the catalogue (name,
type, labels, meaning, and the OpenTelemetry instrument that carries the same numbers),
and `QueueBacklog`, which reads a queue's backlog through the admin interface at most once
per ``cache`` seconds, so that scrapes never hammer the store.

The Prometheus exporter (`_prometheus`) and the OpenTelemetry hooks (`_otel`) build their
instruments from this catalogue; docs/metrics.md lists it, and a test holds the page to
what a worker really serves. Imports the public contract only: no exporter library.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from transports_core import (
    LeaseLost,
    LostReason,
    TransportAdmin,
    open_transport,
    redact_url,
)
from transports_core.backend import check_count, check_seconds

from ._outcomes import Outcome

__all__ = [
    "BACKLOG_STATES",
    "DURATION_BUCKETS",
    "LOST_REASONS",
    "METRICS",
    "OUTCOMES",
    "BacklogSample",
    "MetricSpec",
    "QueueBacklog",
    "lost_reason",
]

LOGGER: Final = logging.getLogger("transports_worker")

Kind = Literal["counter", "gauge", "histogram"]
OUTCOMES: Final[tuple[str, ...]] = get_args(Outcome)
# Why a lease was lost (`LeaseLost.reason`), ``unknown`` where it is None.
LOST_REASONS: Final[tuple[str, ...]] = (*get_args(LostReason), "unknown")
# The states of `QueueStats`; ``delayed`` only where a backend reports it.
BACKLOG_STATES: Final = ("ready", "in_flight", "parked", "dead", "delayed")
# Handlers run from milliseconds to minutes: the default buckets of prometheus_client stop
# at ten seconds.
DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0
)  # fmt: skip


def lost_reason(error: BaseException) -> str:
    """The ``reason`` label of a lost lease's error (see `LOST_REASONS`)."""
    reason = error.reason if isinstance(error, LeaseLost) else None
    return reason or "unknown"


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its Prometheus name (as served, with ``_total`` on a counter), type,
    label names, help text, and the OpenTelemetry instrument of the same numbers (with its
    attribute names, in the order of ``labels``)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    otel: str
    otel_attributes: tuple[str, ...] = ()

    @property
    def base(self) -> str:
        """The name prometheus_client is given: a counter's without ``_total``."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


METRICS: Final = (
    # -- the runtime's own work, counted by the hooks --------------------------------
    MetricSpec(
        "transports_worker_deliveries_total",
        "counter",
        ("outcome",),
        "Deliveries ended, by outcome.",
        "transports.worker.deliveries",
        ("transports.outcome",),
    ),
    MetricSpec(
        "transports_worker_handler_duration_seconds",
        "histogram",
        ("outcome",),
        "Seconds from a handler's start to its delivery's settle, by outcome.",
        "transports.worker.duration",
        ("transports.outcome",),
    ),
    MetricSpec(
        "transports_worker_in_flight",
        "gauge",
        (),
        "Deliveries started and not yet settled.",
        "transports.worker.in_flight",
    ),
    MetricSpec(
        "transports_worker_claimed_total",
        "counter",
        (),
        "Claims that leased a message (deliveries started).",
        "transports.worker.claimed",
    ),
    MetricSpec(
        "transports_worker_empty_claims_total",
        "counter",
        (),
        "Claims that returned no message.",
        "transports.worker.empty_claims",
    ),
    MetricSpec(
        "transports_worker_lost_leases_total",
        "counter",
        ("reason",),
        "Leases lost while their handler ran, by LeaseLost.reason.",
        "transports.worker.lost",
        ("transports.reason",),
    ),
    MetricSpec(
        "transports_worker_renewals_total",
        "counter",
        (),
        "Leases extended by the lease keeper.",
        "transports.worker.renewals",
    ),
    MetricSpec(
        "transports_worker_renewal_failures_total",
        "counter",
        (),
        "Lease renewals that raised (a lost lease is counted apart).",
        "transports.worker.renewal_failures",
    ),
    # -- the queue's backlog, read through the admin interface on scrape -------------
    MetricSpec(
        "transports_queue_up",
        "gauge",
        (),
        "1 if the last read of the queue's backlog succeeded, else 0.",
        "transports.queue.up",
    ),
    MetricSpec(
        "transports_queue_messages",
        "gauge",
        ("state",),
        "Messages in the queue, by state (ready, in_flight, parked, dead; delayed where "
        "the backend reports it).",
        "transports.queue.messages",
        ("transports.state",),
    ),
    MetricSpec(
        "transports_queue_priority_messages",
        "gauge",
        ("priority", "state"),
        "Messages in the queue, by priority and state.",
        "transports.queue.priority_messages",
        ("transports.priority", "transports.state"),
    ),
    MetricSpec(
        "transports_queue_oldest_ready_age_seconds",
        "gauge",
        (),
        "Seconds since the oldest ready message became ready (published, came due, or "
        "was requeued); 0 when none is ready.",
        "transports.queue.oldest_ready_age",
    ),
    MetricSpec(
        "transports_queue_priority_oldest_ready_age_seconds",
        "gauge",
        ("priority",),
        "The same age, by priority (only priorities with ready messages).",
        "transports.queue.priority_oldest_ready_age",
        ("transports.priority",),
    ),
    MetricSpec(
        "transports_queue_groups",
        "gauge",
        ("state",),
        "Groups with queued messages, by state: ready (a claim could serve one now) or "
        "busy (head in flight, parked, held by a delay or a dead letter, or paused).",
        "transports.queue.groups",
        ("transports.state",),
    ),
    MetricSpec(
        "transports_queue_priority_groups",
        "gauge",
        ("priority", "state"),
        "Ready and busy groups, by priority.",
        "transports.queue.priority_groups",
        ("transports.priority", "transports.state"),
    ),
    MetricSpec(
        "transports_queue_keys",
        "gauge",
        (),
        "Idempotency keys the queue remembers.",
        "transports.queue.keys",
    ),
    MetricSpec(
        "transports_queue_held_groups",
        "gauge",
        (),
        "Groups held by a dead letter.",
        "transports.queue.held_groups",
    ),
    MetricSpec(
        "transports_queue_group_depth",
        "gauge",
        ("group_id",),
        "Queued messages of the deepest groups (only the few deepest: a bounded top N).",
        "transports.queue.group_depth",
        ("transports.group_id",),
    ),
)


@dataclass(frozen=True)
class BacklogSample:
    """One read of a queue's backlog; ``ok`` False (and ``error``) when the read failed,
    and then every count is empty."""

    ok: bool
    totals: dict[str, int] = field(default_factory=dict)
    by_priority: dict[tuple[int, str], int] = field(default_factory=dict)
    keys: int | None = None
    held_groups: int | None = None
    deepest: tuple[tuple[str, int], ...] = ()
    error: str = ""
    oldest_ready_age: float | None = None
    age_by_priority: dict[int, float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    groups_by_priority: dict[tuple[int, str], int] = field(default_factory=dict)


def _counts(stats: object) -> dict[str, int]:
    """The message counts of a `QueueStats` or `PriorityStats`, ``delayed`` if present."""
    found = {}
    for state in BACKLOG_STATES:
        value = getattr(stats, state, None)
        if isinstance(value, int):
            found[state] = value
    return found


class QueueBacklog:
    """A queue's backlog, for metrics: `sample` reads `stats`, `held_groups` and the
    ``groups`` deepest through the admin interface, at most once per ``cache`` seconds
    (a failed read too, so that a store that is down is not asked again at every scrape).
    Concurrent callers share one read. ``source`` is a URL (opened on first use, on a
    handle of its own, reopened after a failure) or a factory of admin handles.
    """

    def __init__(
        self,
        source: str | Callable[[], TransportAdmin],
        *,
        groups: int = 10,
        cache: float = 5.0,
    ) -> None:
        self.groups = check_count(groups, "groups", low=0)
        self.cache = check_seconds(cache, "cache", zero=True)
        if isinstance(source, str):
            url = source

            def opener() -> TransportAdmin:
                handle = open_transport(url)
                if not isinstance(handle, TransportAdmin):
                    handle.close()
                    raise TypeError(
                        f"{redact_url(url)} has no admin interface: its backlog cannot be read"
                    )
                return handle

            self._open: Callable[[], TransportAdmin] = opener
        elif callable(source):
            self._open = source
        else:
            raise TypeError(f"source must be a URL or a factory, got {source!r}")
        self._handle: TransportAdmin | None = None
        self._lock = threading.Lock()
        self._sample: BacklogSample | None = None
        self._taken = 0.0

    def sample(self) -> BacklogSample:
        """The latest read, made now if the one before is older than ``cache``."""
        with self._lock:
            sample = self._sample
            if sample is not None and time.monotonic() - self._taken < self.cache:
                return sample
            sample = self._read()
            self._sample, self._taken = sample, time.monotonic()
            return sample

    def _read(self) -> BacklogSample:
        try:
            if self._handle is None:
                self._handle = self._open()
            admin = self._handle
            stats = admin.stats()
            held = len(admin.held_groups())
            deepest = admin.groups(limit=self.groups) if self.groups else []
        except Exception as exc:
            LOGGER.warning("reading the queue's backlog failed: %s", exc)
            self._drop()
            return BacklogSample(ok=False, error=str(exc) or type(exc).__name__)
        by_priority = {
            (row.priority, state): count
            for row in stats.by_priority
            for state, count in _counts(row).items()
        }
        return BacklogSample(
            ok=True,
            totals=_counts(stats),
            by_priority=by_priority,
            keys=stats.keys,
            held_groups=held,
            deepest=tuple((g.group_id, g.depth) for g in deepest),
            oldest_ready_age=stats.oldest_ready_age,
            age_by_priority={
                row.priority: row.oldest_ready_age
                for row in stats.by_priority
                if row.oldest_ready_age is not None
            },
            groups={"ready": stats.ready_groups, "busy": stats.busy_groups},
            groups_by_priority={
                (row.priority, state): count
                for row in stats.by_priority
                for state, count in (("ready", row.ready_groups), ("busy", row.busy_groups))
            },
        )

    def _drop(self) -> None:
        handle, self._handle = self._handle, None
        close = getattr(handle, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                LOGGER.debug("closing the backlog's handle failed", exc_info=True)

    def close(self) -> None:
        """Close the handle opened from the URL or factory."""
        with self._lock:
            self._drop()
