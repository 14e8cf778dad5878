"""Eight worker processes on one queue file, killed at random and restarted, then a drain;
the workers' journals must show every promise kept. And the process holding the write lock
killed in the middle of its transaction.

Seeded (``TORTURE_SEED``, ``TORTURE_ROUNDS``): the kill schedule and every worker's choices
follow from the seed; only the OS's timing varies.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.sqlite._support import chain_problems
from transports_core import Event, TransportAdmin, open_transport

from . import _journal

WORKER = Path(__file__).with_name("_worker.py")
WORKERS = 8
GROUPS = 12
SEED = int(os.environ.get("TORTURE_SEED", "20240601"))
ROUNDS = int(os.environ.get("TORTURE_ROUNDS", "40"))  # kills
CHAOS_SECONDS = 35.0  # the kills stop here even if fewer than ROUNDS landed


def _spawn(*args: object, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, str(WORKER), *map(str, args)], text=True, **kwargs
    )


def _seqs(db: Path) -> set[int]:
    """What the file holds, read with plain sqlite3, not through the transport."""
    with closing(sqlite3.connect(db)) as conn:
        return {seq for (seq,) in conn.execute("SELECT seq FROM messages")}


def _wait(proc: subprocess.Popen[str], deadline: float) -> int:
    return proc.wait(timeout=max(0.1, deadline - time.monotonic()))


@pytest.mark.slow
def test_sigkill_torture_keeps_every_promise(tmp_path: Path) -> None:
    db = tmp_path / "torture.db"
    logs = tmp_path / "journals"
    logs.mkdir()
    open_transport(f"sqlite:///{db}").close()  # create it once, before the crowd
    rng = random.Random(SEED)
    started = time.monotonic()

    incarnations = [0] * WORKERS
    journals: list[Path] = []
    lifetimes: list[int] = []

    def start(index: int) -> subprocess.Popen[str]:
        incarnations[index] += 1
        name = f"w{index}.{incarnations[index]}"
        journal = logs / f"{name}.log"
        journal.touch()
        journals[index : index + 1] = [journal]
        # Killed once its journal has grown this much: a point in its work, not in time, so
        # that a slow machine still sees kills land inside calls.
        lifetimes[index : index + 1] = [rng.randrange(200, 6000)]
        return _spawn(
            "chaos", db, journal, rng.randrange(2**32), name, GROUPS, stderr=subprocess.DEVNULL
        )

    procs = [start(i) for i in range(WORKERS)]
    kills = 0
    died_on_their_own: list[str] = []
    deadline = started + CHAOS_SECONDS
    try:
        while kills < ROUNDS and time.monotonic() < deadline:
            for index, proc in enumerate(procs):
                if journals[index].stat().st_size < lifetimes[index]:
                    continue
                if proc.poll() is not None:
                    died_on_their_own.append(journals[index].name)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                procs[index] = start(index)
            time.sleep(0.002)  # polling the journals' sizes
    finally:
        for index, proc in enumerate(procs):
            if proc.poll() is not None:
                died_on_their_own.append(journals[index].name)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    chaos_seconds = time.monotonic() - started

    chaos_logs = sorted(logs.glob("w*.log"))
    in_chaos = _journal.read(chaos_logs)
    acked_in_chaos = {seq for seq, n in in_chaos.acks_confirmed.items() if n}
    left_after_chaos = _seqs(db)
    # What the kills left behind is whole: every group's chain, head to tail.
    assert chain_problems(db) == []

    drainer = _spawn("drain", db, logs / "drain.log", SEED, "drainer")
    assert _wait(drainer, time.monotonic() + 60) == 0, (logs / "drain.log").read_text()[-2000:]

    everything = _journal.read([*chaos_logs, logs / "drain.log"])
    problems = _journal.check(everything, acked_in_chaos, left_after_chaos, _seqs(db))
    assert not problems, "\n".join(problems[:30])
    assert not died_on_their_own

    # The run must have been a real one: messages flowed, kills landed inside calls.
    killed_in = [kind for kind in in_chaos.last_kinds if kind.endswith("?")]
    summary = (
        f"seed {SEED}: {kills} kills ({len(killed_in)} inside a call: "
        f"{sorted(killed_in)}), {len(everything.published)} publishes confirmed, "
        f"{len(everything.leases)} deliveries, {everything.lines} journal lines, "
        f"chaos {chaos_seconds:.1f}s, total {time.monotonic() - started:.1f}s"
    )
    print(summary)
    assert kills >= ROUNDS // 2, summary
    assert len(everything.published) > 100, summary
    assert killed_in, summary
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


@pytest.mark.slow
def test_killing_the_write_lock_holder_loses_only_its_transaction(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with open_transport(f"sqlite:///{db}") as transport:
        transport.publish("before", Event(id="before.0"))

    holder = _spawn("hold", db, stdout=subprocess.PIPE)
    contenders: list[subprocess.Popen[str]] = []
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n"
        # It really holds the write lock, with its rows written but not committed.
        probe = sqlite3.connect(db, timeout=0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            probe.execute("BEGIN IMMEDIATE")
        probe.close()

        contenders = [_spawn("contend", db, f"c{i}", 20, stdout=subprocess.PIPE) for i in range(3)]
        for proc in contenders:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "started\n"
        holder.send_signal(signal.SIGKILL)
        assert holder.wait() == -signal.SIGKILL
        deadline = time.monotonic() + 30
        assert [_wait(proc, deadline) for proc in contenders] == [0, 0, 0]
    finally:
        for proc in [holder, *contenders]:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        groups = [g for (g,) in conn.execute("SELECT DISTINCT group_id FROM messages")]
    assert not [g for g in groups if g.startswith("half-")]
    # Everyone else's work is there: 'before' plus 3 x 20, less the 3 the contenders acked.
    with open_transport(f"sqlite:///{db}") as transport:
        assert isinstance(transport, TransportAdmin)
        assert transport.stats().ready == 1 + 3 * 20 - 3
        seen: dict[str, list[int]] = {}
        while (lease := transport.claim("checker", 30)) is not None:
            seen.setdefault(lease.group_id, []).append(int(lease.event.id.rpartition(".")[2]))
            transport.ack(lease)
    assert set(seen) <= {"before", "c0", "c1", "c2"}
    for group, numbers in seen.items():
        assert numbers == sorted(numbers), group


def test_journal_check_catches_broken_promises(tmp_path: Path) -> None:
    """The witness can fail: a made-up journal of a queue that breaks each promise."""
    (tmp_path / "w0.1.log").write_text(
        "P? 1 a g\nP 2 a g 1\n"  # message 1 (a) in group g
        "P? 3 b g\nP 4 b g 2\n"  # message 2 (b), published after 1
        "P? 5 c g\nP 6 c g 3\n"  # message 3 (c): never acked, not left in the queue
        "C 7 2 g 1 110.0 10.0 b\n"  # 2 delivered at 100, before 1
        "C 8 1 g 1 115.0 10.0 a\n"  # 1 delivered at 105, while 2's lease lives
        "A? 9 1 1 106.0\nA 10 1 1\n"
        "A? 11 2 1 107.0\nA 12 2 1\nA? 13 2 1 108.0\nA 14 2 1\n"  # 2 acked twice
        "X 15 OperationalError('database is locked')\n"
        "C 16 3 g 1 1"  # a half-written last line is ignored
    )
    problems = _journal.check(_journal.read([tmp_path / "w0.1.log"]), set(), set(), set())
    text = "\n".join(problems)
    assert "database is locked" in text
    assert "message 2 acked 2 times" in text
    assert "message 3 vanished" in text
    assert "lease 1/1 (w0.1) began at 105.000000 while 2/1 (w0.1) held" in text
    assert "message 2 delivered before 1 was done" in text
    assert "message 2 delivered before 1 was acked" in text
    assert len(problems) == 6, text


def test_journal_check_allows_what_a_cut_short_call_may_have_done(tmp_path: Path) -> None:
    """No false alarms: a kill during extend may have shortened the lease, and a kill during
    ack may have acked the message."""
    (tmp_path / "w0.1.log").write_text(
        "P? 1 a g\nP 2 a g 1\n"
        "C 3 1 g 1 120.0 20.0 a\n"  # leased from 100 to 120
        "E? 4 1 1 0.5 101.0\n"  # killed while extending by 0.5 s at 101: maybe ends 101.5
    )
    (tmp_path / "w1.1.log").write_text(
        "C 5 1 g 2 112.0 10.0 a\n"  # re-leased at 102
        "A? 6 1 2 103.0\n"  # killed while acking; the message is gone afterwards
    )
    journals = _journal.read(sorted(tmp_path.glob("*.log")))
    assert _journal.check(journals, set(), set(), set()) == []
    # Had the ack not happened, the message would still be queued after the chaos.
    assert _journal.check(journals, set(), {1}, {1}) == [
        "message 1 left in the queue after the drain"
    ]
