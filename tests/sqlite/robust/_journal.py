"""Reading the torture workers' journals and checking the queue's promises against them.

The journals are the independent witness: they say what callers were told, not what the
transport stored. `check` returns every violation found, as readable sentences.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# Float noise between a lease's start computed as expires_at - visibility and the `now` it
# was computed from is below a microsecond; real violations are far larger.
EPS = 1e-4


@dataclass
class LeaseRecord:
    seq: int
    group: str
    attempt: int
    start: float  # the claim's `now` (wall clock)
    expires: float  # after confirmed extends
    event_id: str
    who: str  # the journal it came from
    settled_before: float = float("inf")  # wall time before the ack/nack call
    park: float = 0.0  # delay of a nack that succeeded
    # An extend cut short by a kill may or may not have happened; if it did, it moved the
    # expiry to at least (time before the call + its visibility), maybe earlier than before.
    extend_bound: float = float("inf")

    @property
    def end(self) -> float:
        return min(self.expires, self.settled_before, self.extend_bound)


@dataclass
class Journals:
    errors: list[str] = field(default_factory=list)
    leases: dict[tuple[int, int], LeaseRecord] = field(default_factory=dict)
    published: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> group, seq
    publish_times: list[tuple[int, int, int]] = field(default_factory=list)  # intent, done, seq
    acks_confirmed: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    acks_attempted: dict[int, float] = field(default_factory=dict)  # seq -> earliest before
    last_kinds: list[str] = field(default_factory=list)  # last complete line per journal
    lines: int = 0


def read(paths: Iterable[Path]) -> Journals:
    j = Journals()
    for path in sorted(paths):
        text = path.read_text(encoding="utf-8")
        complete = text[: text.rfind("\n") + 1]  # a killed writer may leave half a line
        pending_publish: dict[str, int] = {}
        parks: dict[tuple[int, int], float] = {}
        last = ""
        for line in complete.splitlines():
            j.lines += 1
            kind, t, *f = line.split(" ")
            last = kind
            if kind == "X":
                j.errors.append(f"{path.name}: {' '.join(f)}")
            elif kind == "P?":
                pending_publish[f[0]] = int(t)
            elif kind == "P":
                event_id, group, seq = f[0], f[1], int(f[2])
                j.published[event_id] = (group, seq)
                j.publish_times.append((pending_publish.pop(event_id), int(t), seq))
            elif kind == "C":
                seq, group, attempt = int(f[0]), f[1], int(f[2])
                expires, visibility = float(f[3]), float(f[4])
                if (seq, attempt) in j.leases:
                    j.errors.append(
                        f"{path.name}: message {seq} delivered twice as attempt {attempt}"
                    )
                j.leases[seq, attempt] = LeaseRecord(
                    seq, group, attempt, expires - visibility, expires, f[5], path.stem
                )
            elif kind == "E?":
                lease = j.leases[int(f[0]), int(f[1])]
                lease.extend_bound = float(f[3]) + float(f[2])
            elif kind == "E":
                lease = j.leases[int(f[0]), int(f[1])]
                lease.expires, lease.extend_bound = float(f[2]), float("inf")
            elif kind in ("A?", "K?"):
                lease = j.leases[int(f[0]), int(f[1])]
                before = float(f[-1])
                lease.settled_before = min(lease.settled_before, before)
                if kind == "K?":
                    parks[int(f[0]), int(f[1])] = float(f[2])
                else:
                    seq = int(f[0])
                    j.acks_attempted[seq] = min(j.acks_attempted.get(seq, before), before)
            elif kind == "K":
                j.leases[int(f[0]), int(f[1])].park = parks.pop((int(f[0]), int(f[1])))
            elif kind == "A":
                j.acks_confirmed[int(f[0])] += 1
        j.last_kinds.append(last)
    return j


def check(
    j: Journals, acked_in_chaos: set[int], left_after_chaos: set[int], left_at_end: set[int]
) -> list[str]:
    """Every violation of the queue's promises that the journals prove.

    ``acked_in_chaos``: seqs whose ack a chaos worker saw succeed;
    ``left_after_chaos``: seqs still in the database when the last chaos worker was
    killed (it decides whether an ack cut short by a kill happened);
    ``left_at_end``: seqs left after the drain (must be none).
    """
    problems = [f"a caller saw an error: {e}" for e in j.errors]
    problems += [f"message {seq} left in the queue after the drain" for seq in left_at_end]

    # Every message anyone heard of, with its group and event id.
    messages: dict[int, tuple[str, str]] = {}
    for event_id, (group, seq) in j.published.items():
        messages[seq] = (group, event_id)
    for lease in j.leases.values():
        if messages.setdefault(lease.seq, (lease.group, lease.event_id)) != (
            lease.group,
            lease.event_id,
        ):
            problems.append(
                f"message {lease.seq} was published as {messages[lease.seq]} "
                f"but delivered as {(lease.group, lease.event_id)}"
            )

    # Acked exactly once; none vanishes without an ack.
    for seq in messages:
        confirmed = j.acks_confirmed.get(seq, 0)
        if confirmed > 1:
            problems.append(f"message {seq} acked {confirmed} times")
        if seq in acked_in_chaos and seq in left_after_chaos:
            problems.append(f"message {seq} was acked, yet still queued after the chaos")
        acked = confirmed > 0 or (seq in j.acks_attempted and seq not in left_after_chaos)
        if not acked and seq not in left_at_end:
            problems.append(f"message {seq} vanished: never acked, and not in the queue")

    # Publish order is seq order: a publish confirmed before another began has a lower seq.
    done = sorted((t_done, seq) for _, t_done, seq in j.publish_times)
    done_times = [t for t, _ in done]
    best = [0] * (len(done) + 1)
    for i, (_, seq) in enumerate(done):
        best[i + 1] = max(best[i], seq)
    for t_intent, _, seq in j.publish_times:
        earlier = best[bisect.bisect_left(done_times, t_intent)]
        if earlier > seq:
            problems.append(
                f"message {seq} was published after message {earlier} had been, but got a lower seq"
            )

    by_group: dict[str, list[LeaseRecord]] = defaultdict(list)
    for lease in j.leases.values():
        by_group[lease.group].append(lease)

    for group, leases in by_group.items():
        # Never two live leases (nor a lease during a park) in one group.
        leases.sort(key=lambda lease: lease.start)
        busy_until, holder = float("-inf"), None
        for lease in leases:
            if lease.start < busy_until - EPS:
                problems.append(
                    f"group {group}: lease {lease.seq}/{lease.attempt} ({lease.who}) began at "
                    f"{lease.start:.6f} while {holder} held the group until {busy_until:.6f}"
                )
            end = lease.end
            if lease.park:
                end = max(end, lease.settled_before + lease.park)
            if end > busy_until:
                busy_until, holder = end, f"{lease.seq}/{lease.attempt} ({lease.who})"

        # FIFO: every delivery of a message comes after the last delivery, and after the
        # ack, of every earlier message of its group.
        seqs = sorted({seq for seq, (g, _) in messages.items() if g == group})
        starts: dict[int, list[float]] = defaultdict(list)
        for lease in leases:
            starts[lease.seq].append(lease.start)
        for a, b in itertools.pairwise(seqs):
            if not starts[b]:
                continue
            first_b = min(starts[b])
            if starts[a] and max(starts[a]) > first_b:
                problems.append(f"group {group}: message {b} delivered before {a} was done")
            acked_a = j.acks_attempted.get(a)
            if acked_a is not None and first_b < acked_a - EPS:
                problems.append(f"group {group}: message {b} delivered before {a} was acked")
    return problems
