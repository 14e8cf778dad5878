"""What the failover tests (`test_cluster`, `test_sentinel`) run in their children, and how
their journals are checked. A publisher (sync twin) and a consumer (async twin) run
while the test kills or fails over the queue's primary; each journals only what a call
that returned told it. Imports only core, so that a spawned child starts fast.

Publisher lines: ``seq n time`` for a publish that returned, ``- n time ERROR`` for one
that raised. Consumer lines: ``seq n`` for an ack that returned, ``? seq n`` for one
whose outcome is unknown (it may have taken effect: its message may be gone).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from transports_core import (
    Event,
    OutcomeUnknown,
    TransportError,
    open_async_transport,
    open_transport,
)

GROUPS = 5
VISIBILITY = 3.0


def publish(url: str, journal: str, count: int, seconds: float) -> None:
    """Publish until ``count`` publishes returned or ``seconds`` passed."""
    deadline = time.time() + seconds
    done = n = 0
    with open(journal, "a", encoding="utf-8") as out, open_transport(url) as transport:
        while done < count and time.time() < deadline:
            try:
                seq = transport.publish(f"g{n % GROUPS}", Event(n=n))
            except TransportError as exc:
                out.write(f"- {n} {time.time()} {type(exc).__name__}\n")
            else:
                out.write(f"{seq} {n} {time.time()}\n")
                done += 1
            out.flush()
            n += 1


def consume(url: str, journal: str, stop: str, seconds: float) -> None:
    """Claim and ack on the async twin until the file ``stop`` exists and a claim that
    waited found nothing, or ``seconds`` passed."""

    async def run() -> None:
        deadline = time.time() + seconds
        with open(journal, "a", encoding="utf-8") as out:
            async with open_async_transport(url) as transport:
                while time.time() < deadline:
                    try:
                        lease = await transport.claim("consumer", VISIBILITY, wait=0.3)
                    except TransportError:
                        continue
                    if lease is None:
                        if Path(stop).exists():
                            return
                        continue
                    try:
                        await transport.ack(lease)
                    except OutcomeUnknown:
                        out.write(f"? {lease.seq} {lease.event.n}\n")
                        continue
                    except TransportError:
                        continue  # it comes back when its lease lapses: drained later
                    out.write(f"{lease.seq} {lease.event.n}\n")
                    out.flush()

    asyncio.run(run())


@dataclass
class Outcome:
    published: dict[int, int]  # seq -> n, of the publishes that returned
    failed: int  # publishes that raised
    # Seconds from the kill to the first publish after it that ran on the new primary:
    # it returned, or raised NotReplicated (ran, but no replica confirmed it).
    recovered_after: float
    before: int  # publishes that returned before the kill
    longest_gap: float  # seconds, the longest time between two publishes that ran


def read_publisher(journal: Path, killed_at: float) -> Outcome:
    published: dict[int, int] = {}
    failed = before = 0
    first_after = None
    last_ran, longest_gap = None, 0.0
    for line in journal.read_text().splitlines():
        seq, n, at, *error = line.split()
        ran = seq != "-" or error == ["NotReplicated"]
        if ran:
            if last_ran is not None:
                longest_gap = max(longest_gap, float(at) - last_ran)
            last_ran = float(at)
        if float(at) >= killed_at and first_after is None and ran:
            first_after = float(at)
        if seq == "-":
            failed += 1
            continue
        assert int(seq) not in published, f"seq {seq} was handed out twice"
        published[int(seq)] = int(n)
        if float(at) < killed_at:
            before += 1
    assert first_after is not None, "no publish reached a primary after the kill"
    return Outcome(published, failed, first_after - killed_at, before, longest_gap)


def check_nothing_acknowledged_lost(
    outcome: Outcome, consumer: Path, drained: list[tuple[int, int]]
) -> None:
    """Every publish that returned was acked (or had an ack whose outcome is unknown)
    or is still in the queue; no ack that returned came back; no seq stands for two
    messages."""
    lines = [line.split() for line in consumer.read_text().splitlines()]
    acked = [(int(seq), int(n)) for seq, n in (line for line in lines if len(line) == 2)]
    # An ack whose outcome is unknown may have removed its message: not lost, if gone.
    maybe_acked = {int(line[1]) for line in lines if line[0] == "?"}
    acked_seqs = {seq for seq, _ in acked}
    assert len(acked_seqs) == len(acked), "an acked message was delivered and acked twice"
    drained_seqs = {seq for seq, _ in drained}
    assert not acked_seqs & drained_seqs, "a message whose ack returned came back"
    for seq, n in [*acked, *drained]:
        if seq in outcome.published:
            assert outcome.published[seq] == n, f"seq {seq} stands for two messages"
    lost = set(outcome.published) - acked_seqs - drained_seqs - maybe_acked
    assert not lost, f"{len(lost)} published messages were lost: {sorted(lost)[:10]}"
