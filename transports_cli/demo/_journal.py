"""The demo's journal and the verdict drawn from it.

Each worker appends one line per lease it settled: what it did (``ack``, ``park``,
``retry``, or ``lost`` when the transport said the lease was gone), the group, the event's
step, the attempt, the claim time read *after* ``claim`` returned, the release time read
*before* ``ack``/``nack`` was called (both ``time.monotonic_ns()``, one clock for every
process on Linux and macOS), how often the lease was extended, and the worker. So if the
transport keeps its promises, a group's intervals never overlap and its steps are acked
in order, each exactly once. `verify` checks that against the plan of what was published.

Pure: no transport, no processes, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

__all__ = ["Plan", "Record", "Verdict", "parse_journal", "verify"]

Kind = Literal["ack", "park", "retry", "lost"]
KINDS: tuple[str, ...] = get_args(Kind)


@dataclass(frozen=True, slots=True)
class Record:
    kind: Kind
    group: str
    step: int
    attempt: int
    claimed_ns: int
    released_ns: int
    extended: int
    worker: str

    def line(self) -> str:
        return "\t".join(
            map(
                str,
                (
                    self.kind,
                    self.group,
                    self.step,
                    self.attempt,
                    self.claimed_ns,
                    self.released_ns,
                    self.extended,
                    self.worker,
                ),
            )
        )


def parse_journal(lines: Iterable[str], source: str) -> tuple[list[Record], list[str]]:
    """Records from journal ``lines``, and a problem for each line that does not parse."""
    records: list[Record] = []
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        fields = line.rstrip("\n").split("\t")
        try:
            kind, group, step, attempt, claimed, released, extended, worker = fields
            if kind not in KINDS:
                raise ValueError(kind)
            records.append(
                Record(
                    kind,  # type: ignore[arg-type]  # checked against KINDS just above
                    group,
                    int(step),
                    int(attempt),
                    int(claimed),
                    int(released),
                    int(extended),
                    worker,
                )
            )
        except ValueError:
            problems.append(f"{source} line {number} is unreadable: {line.strip()[:80]!r}")
    return records, problems


@dataclass(frozen=True)
class Plan:
    """What the demo published, and which worker had a priority floor."""

    events: Mapping[str, int]  # group -> number of events (steps 0..n-1)
    priorities: Mapping[str, int]  # group -> priority
    floors: Mapping[str, int] = field(default_factory=dict)  # worker -> min_priority

    @property
    def total(self) -> int:
        return sum(self.events.values())


@dataclass(frozen=True)
class Verdict:
    executions: int
    published: int
    acked: int
    parked: int
    retried: int
    extended: int
    span_ns: int  # from the first claim to the last release
    problems: Sequence[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def events_per_second(self) -> float:
        return self.acked / (self.span_ns / 1e9) if self.span_ns > 0 else 0.0


def verify(
    plan: Plan, records: Sequence[Record], problems: Iterable[str] = (), finished: bool = True
) -> Verdict:
    """Check ``records`` against ``plan``: per group, intervals never overlap and steps
    are acked in order, each exactly once. ``problems`` found elsewhere are kept.

    A run that did not finish (it timed out, or a worker failed) is still checked for
    order and overlaps, but its unacked events are counted once rather than reported,
    group by group, as lost."""
    found = list(problems)
    by_group: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record.group in plan.events:
            by_group[record.group].append(record)
        else:
            found.append(f"{record.group}: handled by {record.worker} but never published")

    for group, count in plan.events.items():
        found.extend(_check_group(group, count, by_group.get(group, []), finished))
    acked = sum(r.kind == "ack" and r.group in plan.events for r in records)
    if not finished:
        found.append(f"{plan.total - acked} of {plan.total} events not acked when the run stopped")

    for record in records:
        floor = plan.floors.get(record.worker, 0)
        priority = plan.priorities.get(record.group)
        if priority is not None and priority < floor:
            found.append(
                f"{record.group}: priority {priority} served by {record.worker}, "
                f"whose floor is {floor}"
            )

    return Verdict(
        executions=len(plan.events),
        published=plan.total,
        acked=acked,
        parked=sum(r.kind == "park" for r in records),
        retried=sum(r.kind == "retry" for r in records),
        extended=sum(r.extended for r in records),
        span_ns=(
            max(r.released_ns for r in records) - min(r.claimed_ns for r in records)
            if records
            else 0
        ),
        problems=found,
    )


def _check_group(group: str, count: int, records: list[Record], finished: bool) -> list[str]:
    problems: list[str] = []
    holder: Record | None = None  # the interval that ends last so far
    acked: set[int] = set()
    pending = 0  # the lowest step not yet acked: the only one that may be handled
    for record in sorted(records, key=lambda r: (r.claimed_ns, r.released_ns)):
        if holder is not None and record.claimed_ns <= holder.released_ns:
            problems.append(
                f"{group}: step {record.step} was claimed by {record.worker} while "
                f"{holder.worker} still held step {holder.step} (overlap)"
            )
        if holder is None or record.released_ns > holder.released_ns:
            holder = record
        if record.kind == "lost":
            problems.append(f"{group}: {record.worker} lost its lease on step {record.step}")
        elif record.step in acked:
            problems.append(
                f"{group}: step {record.step} was handled again after it was acked (duplicate)"
            )
        elif record.step != pending:
            problems.append(
                f"{group}: step {record.step} was handled before step {pending} "
                "was acked (out of order)"
            )
        if record.kind == "ack":
            acked.add(record.step)
            while pending in acked:
                pending += 1
    missing = [step for step in range(count) if step not in acked]
    if missing and finished:
        listed = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        problems.append(
            f"{group}: step{'s' if len(missing) > 1 else ''} {listed} never acked (lost)"
        )
    return problems
