"""One journal format for workers that race on a store, and one checker for it.

A worker appends one line per lease it held, at the moment it lets go of it: which message
(seq, group), which delivery (attempt), when it held it (``claimed_ns`` just after claim
returned, ``released_ns`` just before the ack or nack, both from `time.monotonic_ns`,
which is one clock for every process of a host) and how it let go (``outcome``: ``ack``,
``nack``, or anything else the writer means, say ``bury``). Lines are JSON objects, written
and flushed one at a time, so a worker killed mid-run leaves every finished line readable.

`check` then says what went wrong, as sentences, from every worker's lines together:
messages never acked, acked twice, or unknown; a group held by two leases at once; a
group's messages acked out of publish order. The suite's contention scenarios use it, and
so can demos and torture tests. Imports only the standard library and core's `Closing`,
neither pytest nor the suite, so a spawned worker can import it cheaply::

    with Journal(path) as journal:
        lease = transport.claim("w1", 30)
        claimed = time.monotonic_ns()
        ...
        journal.record(lease, claimed, time.monotonic_ns(), "ack")
        transport.ack(lease)

    problems = check(published, read(paths))   # published: {seq: group_id}
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Protocol

from transports_core.backend import Closing

__all__ = ["Entry", "Journal", "check", "read"]


class _Held(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def group_id(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Entry:
    """One lease as a worker held it."""

    worker: str
    seq: int
    group: str
    attempt: int
    claimed_ns: int
    released_ns: int
    outcome: str


class Journal(Closing):
    """Appends entries to one file; use one per worker (per process or thread)."""

    def __init__(self, path: str | Path) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def record(self, lease: _Held, claimed_ns: int, released_ns: int, outcome: str) -> Entry:
        entry = Entry(
            lease.worker_id,
            lease.seq,
            lease.group_id,
            lease.attempt,
            claimed_ns,
            released_ns,
            outcome,
        )
        self._file.write(json.dumps(asdict(entry)) + "\n")
        self._file.flush()
        return entry

    def close(self) -> None:
        self._file.close()


def read(paths: Iterable[str | Path]) -> list[Entry]:
    """Every complete entry of the journals at ``paths`` (a missing file has none; a torn
    last line, from a worker killed while writing it, is skipped)."""
    entries = []
    for path in map(Path, paths):
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(Entry(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    return entries


def check(published: Mapping[int, str], entries: Iterable[Entry]) -> list[str]:
    """What the entries show went wrong, given every published ``{seq: group_id}``; an
    empty list when nothing did. Exclusivity is judged from the claim-to-release spans: a
    group's next lease must be claimed after its previous one was released."""
    entries = list(entries)
    problems = []
    acked = Counter(e.seq for e in entries if e.outcome == "ack")
    lost = sorted(set(published) - set(acked))
    if lost:
        problems.append(f"{len(lost)} of {len(published)} messages were never acked: {lost[:20]}")
    twice = sorted(seq for seq, count in acked.items() if count > 1)
    if twice:
        problems.append(f"messages acked more than once: seqs {twice[:20]}")
    unknown = sorted({e.seq for e in entries} - set(published))
    if unknown:
        problems.append(f"leases on seqs that were never published: {unknown[:20]}")
    wrong = sorted(e.seq for e in entries if e.seq in published and published[e.seq] != e.group)
    if wrong:
        problems.append(f"leases naming the wrong group for seqs {wrong[:20]}")
    by_group: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_group[entry.group].append(entry)
    for group, held in sorted(by_group.items()):
        held.sort(key=lambda e: (e.claimed_ns, e.released_ns))
        for before, after in itertools.pairwise(held):
            if after.claimed_ns <= before.released_ns:
                problems.append(
                    f"group {group!r} was leased twice at once: seq {before.seq} to "
                    f"{before.worker} and seq {after.seq} to {after.worker} overlap by "
                    f"{(before.released_ns - after.claimed_ns) / 1e6:.3f} ms"
                )
                break
        order = [e.seq for e in held if e.outcome == "ack"]
        if order != sorted(order):
            problems.append(f"group {group!r} was acked out of publish order: {order[:20]}")
    return problems
