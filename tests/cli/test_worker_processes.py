"""``transports worker --processes N`` as real processes: the supervisor starts another
child when one is killed, and SIGTERM drains every child, in-flight handlers finishing
before it exits 0. Handlers block on a FIFO of their own, so the test knows when one is in
flight (its open of the FIFO returns) and decides when it ends (by closing it)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from transports_core import Event, TransportAdmin, open_transport

from ._command import COMMAND

PATIENCE = 60.0

HANDLERS = """
import os, pathlib

GATES = pathlib.Path(os.environ["GATES"])

def gated(event, ctx):
    with open(GATES / event.gate) as fifo:
        fifo.read()
    (GATES / f"done-{event.gate}").touch()
"""


class Supervisor:
    """The running command and the lines of its stderr (its children's too)."""

    def __init__(self, cwd: Path, url: str, *args: str) -> None:
        self.place, self.url = cwd, url
        env = {**os.environ, "GATES": str(cwd / "gates"), "TRANSPORTS_URL": url}
        self.process = subprocess.Popen(
            [*COMMAND, "worker", "jobs:gated", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)

    def expect(self, pattern: str) -> re.Match[str]:
        """The next stderr line matching ``pattern`` (fails after PATIENCE seconds)."""
        while True:
            try:
                line = self.lines.get(timeout=PATIENCE)
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r}; saw:\n{''.join(self.seen)}")
            self.seen.append(line)
            if found := re.search(pattern, line):
                return found

    def rest(self) -> str:
        """Everything it wrote to stderr, once it has exited."""
        self._reader.join(PATIENCE)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(PATIENCE)
        assert self.process.stderr is not None
        self.process.stderr.close()


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(textwrap.dedent(HANDLERS))
    (tmp_path / "gates").mkdir()
    return tmp_path


@pytest.fixture
def started(place: Path) -> Iterator[tuple[Supervisor, dict[int, int]]]:
    url = f"sqlite:///{place / 'q.db'}"
    with open_transport(url):
        pass
    supervisor = Supervisor(place, url, "--processes", "2")
    try:
        pids = {}
        for _ in range(2):
            found = supervisor.expect(r"worker process (\d) started \(pid (\d+)\)")
            pids[int(found[1])] = int(found[2])
        yield supervisor, pids
    finally:
        supervisor.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_child_is_replaced_and_sigterm_then_exits_0(
    started: tuple[Supervisor, dict[int, int]],
) -> None:
    supervisor, pids = started
    assert sorted(pids) == [0, 1]
    assert len(set(pids.values())) == 2
    os.kill(pids[0], signal.SIGKILL)
    supervisor.expect(
        rf"worker process 0 \(pid {pids[0]}\) was killed by SIGKILL; starting another"
    )
    replaced = int(supervisor.expect(r"worker process 0 started \(pid (\d+)\)")[1])
    assert replaced not in pids.values()
    assert _alive(replaced)
    assert _alive(pids[1])
    # Two messages in flight at once, one handler per child: the new child works.
    opened = hold_two(supervisor.place, supervisor.url, ("a", "b"))
    supervisor.process.send_signal(signal.SIGTERM)
    supervisor.expect(r"SIGTERM: draining 2 worker processes")
    for fd in opened.values():
        os.close(fd)
    code = supervisor.process.wait(PATIENCE)
    ended = supervisor.rest()
    assert code == 0, ended
    assert f"(pid {replaced}) exited with 0" in ended
    assert f"(pid {pids[1]}) exited with 0" in ended


def _open_for_writing(path: Path, opened: dict[str, int]) -> None:
    opened[path.name] = os.open(path, os.O_WRONLY)  # returns once the handler opened it


def hold_two(place: Path, url: str, gates: tuple[str, str]) -> dict[str, int]:
    """Publish a gated message per gate and return once a handler has each in flight:
    the write ends of their FIFOs, which release the handlers when closed."""
    with open_transport(url) as store:
        for gate in gates:
            os.mkfifo(place / "gates" / gate)
            store.publish(f"group-{gate}", Event(gate=gate))
    opened: dict[str, int] = {}
    openers = [
        threading.Thread(target=_open_for_writing, args=(place / "gates" / g, opened), daemon=True)
        for g in gates
    ]
    for opener in openers:
        opener.start()
    for opener in openers:
        opener.join(PATIENCE)
    if sorted(opened) != sorted(gates):
        for fd in opened.values():
            os.close(fd)
        pytest.fail(f"handlers in flight: {sorted(opened)}, not {sorted(gates)}")
    return opened


def test_sigterm_drains_every_child_after_its_in_flight_message(place: Path) -> None:
    url = f"sqlite:///{place / 'q.db'}"
    with open_transport(url):
        pass
    supervisor = Supervisor(place, url, "--processes", "2", "--concurrency", "1")
    opened: dict[str, int] = {}
    try:
        # One handler at a time per child: two in flight means both children work.
        opened = hold_two(place, url, ("a", "b"))
        supervisor.process.send_signal(signal.SIGTERM)
        supervisor.expect(r"SIGTERM: draining 2 worker processes")
        supervisor.expect(r"transports_worker: SIGTERM: draining")
        supervisor.expect(r"transports_worker: SIGTERM: draining")
        assert supervisor.process.poll() is None  # still waiting for the handlers
        assert not list((place / "gates").glob("done-*"))
        for fd in opened.values():
            os.close(fd)  # the handler reads end of file and returns
        opened.clear()
        code = supervisor.process.wait(PATIENCE)
        assert code == 0, supervisor.rest()
    finally:
        for fd in opened.values():
            os.close(fd)
        supervisor.stop()
    assert sorted(p.name for p in (place / "gates").glob("done-*")) == ["done-a", "done-b"]
    with open_transport(url) as store:
        assert isinstance(store, TransportAdmin)
        stats = store.stats()
        assert (stats.ready, stats.in_flight, stats.parked, stats.dead) == (0, 0, 0, 0)
