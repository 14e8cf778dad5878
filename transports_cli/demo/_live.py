"""The demo's live view: a progress bar over events acked and a small table of groups.

Fed with the workers' progress messages (see `_worker`); knows nothing of
transports. Used only when stdout is a terminal.
"""

from __future__ import annotations

import time
from collections import Counter

from rich.console import Group, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from ._journal import Plan

__all__ = ["DemoView"]

STATES = ("waiting", "in flight", "parked", "done")
STYLES = {"waiting": "dim", "in flight": "cyan", "parked": "yellow", "done": "green"}


class _RateColumn(ProgressColumn):
    """The rate the verdict reports too: events acked over the time since the first
    claim (not rich's moving average of recent advances, a different figure)."""

    def render(self, task: Task) -> Text:
        rate = task.fields.get("rate", 0.0)
        return Text(f"{rate:,.0f} events/s", style="progress.data.speed")


class DemoView:
    """Rich renderable state of a demo run; `apply` each progress message to it."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._state = dict.fromkeys(plan.events, "waiting")
        self._step: dict[str, str] = {}
        self._acked: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()
        self.progress = Progress(
            TextColumn("[bold]events acked"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
        )
        self._task = self.progress.add_task("acked", total=plan.total, rate=0.0)
        self._first_claim: int | None = None
        self._final_rate: float | None = None

    def finish(self, events_per_second: float) -> None:
        """Show the verdict's rate, worked out from the journals, in the last frame."""
        self._final_rate = events_per_second

    def apply(self, message: tuple[str, ...]) -> None:
        kind, *rest = message
        if kind in ("ready", "error", "foreign"):
            self._counts[kind] += 1
            return
        _worker, group, step = rest
        self._step[group] = step
        if kind == "claim":
            if self._first_claim is None:
                self._first_claim = time.monotonic_ns()
            self._state[group] = "in flight"
        elif kind == "park":
            self._state[group] = "parked"
            self._counts["parked"] += 1
        elif kind == "ack":
            self._acked[group] += 1
            done = self._acked[group] >= self._plan.events[group]
            self._state[group] = "done" if done else "waiting"
            self.progress.advance(self._task)
        else:  # retry, lost: back in the queue
            self._state[group] = "waiting"
            self._counts["retried"] += 1

    def _table(self) -> Table:
        by_state: dict[str, list[str]] = {state: [] for state in STATES}
        for group, state in self._state.items():
            by_state[state].append(group)
        table = Table(box=None, pad_edge=False, show_edge=False)
        table.add_column("groups", no_wrap=True)
        table.add_column("", justify="right")
        table.add_column("for example (group: step)", no_wrap=True, overflow="ellipsis")
        for state in STATES:
            groups = by_state[state]
            shown = ", ".join(f"{g}: {self._step[g]}" for g in groups[:3] if g in self._step)
            table.add_row(Text(state, style=STYLES[state]), str(len(groups)), shown)
        table.caption = (
            f"{self._counts['ready']} workers running; so far {self._counts['parked']} parks, "
            f"{self._counts['retried']} retries"
        )
        return table

    def _rate(self) -> float:
        if self._final_rate is not None:
            return self._final_rate
        if self._first_claim is None:
            return 0.0
        span = (time.monotonic_ns() - self._first_claim) / 1e9
        return self._acked.total() / span if span > 0 else 0.0

    def __rich__(self) -> RenderableType:
        self.progress.update(self._task, rate=self._rate())
        return Group(self.progress, self._table())
