"""The demo's verdict, drawn from its workers' journals.

The journals are in the one format of `transports_core.conformance.journal`: a line per
delivery that reached its settle, with the time read as the handler started (just after
the claim returned) and as it ended (just before the worker settled), and the outcome:
``ack``, or the runtime's name for the rest (``retried`` for a park, ``failed`` for a
retry, ``lost``). `transports_core.conformance.journal.check` says whether each group was
handled in order, one at a time, with nothing lost or duplicated; this module adds only
what is the demo's own: the priority floor, and that no lease was lost (the demo's leases
are renewed, so a loss is a fault, not a chance).

Pure: no transport, no processes, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from transports_core.conformance.journal import Entry, check

__all__ = ["Plan", "Verdict", "verify"]

PARKED = "retried"  # the handler raised Retry(delay)
RETRIED = "failed"  # the handler raised; the policy's backoff is 0, so it comes back at once


@dataclass(frozen=True)
class Plan:
    """What the demo published, and which worker had a priority floor."""

    published: Mapping[int, str]  # seq -> group, as publish_many returned them
    events: Mapping[str, int]  # group -> number of events (steps 0..n-1)
    priorities: Mapping[str, int]  # group -> priority
    floors: Mapping[str, int] = field(default_factory=dict)  # worker -> min_priority

    @property
    def total(self) -> int:
        return len(self.published)


@dataclass(frozen=True)
class Verdict:
    executions: int
    published: int
    acked: int
    parked: int
    retried: int
    span_ns: int  # from the first claim to the last release
    problems: Sequence[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def events_per_second(self) -> float:
        return self.acked / (self.span_ns / 1e9) if self.span_ns > 0 else 0.0


def verify(plan: Plan, entries: Sequence[Entry], problems: Iterable[str] = ()) -> Verdict:
    """Check ``entries`` against ``plan``; ``problems`` found elsewhere are kept."""
    found = [*problems, *check(plan.published, entries)]
    for entry in entries:
        if entry.outcome not in ("ack", PARKED, RETRIED):
            found.append(
                f"group {entry.group!r}: seq {entry.seq} attempt {entry.attempt} ended "
                f"{entry.outcome} at {entry.worker}"
            )
        floor = plan.floors.get(entry.worker, 0)
        priority = plan.priorities.get(entry.group)
        if priority is not None and priority < floor:
            found.append(
                f"group {entry.group!r}: priority {priority} served by {entry.worker}, "
                f"whose floor is {floor}"
            )
    return Verdict(
        executions=len(plan.events),
        published=plan.total,
        acked=sum(e.outcome == "ack" and e.seq in plan.published for e in entries),
        parked=sum(e.outcome == PARKED for e in entries),
        retried=sum(e.outcome == RETRIED for e in entries),
        span_ns=(
            max(e.released_ns for e in entries) - min(e.claimed_ns for e in entries)
            if entries
            else 0
        ),
        problems=found,
    )
