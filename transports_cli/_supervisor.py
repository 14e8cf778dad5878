"""``transports worker --processes N``: N worker processes under one supervisor.

The supervisor runs no handler. It starts each child as ``transports worker`` with
``--processes 1`` (the URL handed over in ``TRANSPORTS_URL``, so that it never shows in
the process list), starts again a child that ends while no stop was asked for, and on
SIGTERM or SIGINT passes SIGTERM on to every child and waits for them: a second signal
passes on a second SIGTERM (the children hand their leases back), a third kills them.

Children run in their own session, so a Ctrl-C on the terminal reaches the supervisor
only, which passes it on once. Imports nothing from the worker runtime.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["supervise"]

LOGGER = logging.getLogger("transports_cli.supervisor")

EXIT_DRAINED: Final = 0
EXIT_HANDED_BACK: Final = 75
# A child that ends sooner than this after it started is restarted after a pause that
# doubles with each such end, up to MAX_PAUSE: a child that cannot run is not restarted
# in a tight loop. One that ran longer is restarted at once.
QUICK_END: Final = 5.0
FIRST_PAUSE: Final = 0.5
MAX_PAUSE: Final = 30.0


@dataclass
class _Child:
    number: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_ends: int = 0
    due: float | None = None  # when to start it again, after a crash
    code: int | None = None  # its exit code, once it ended after a stop


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


class _Supervisor:
    def __init__(self, commands: Sequence[Sequence[str]], env: dict[str, str]) -> None:
        self.commands = [list(c) for c in commands]
        self.env = env
        self.children = [_Child(n) for n in range(len(commands))]
        self.stops = 0

    def start(self, child: _Child) -> None:
        child.process = subprocess.Popen(
            self.commands[child.number], env=self.env, start_new_session=True
        )
        child.started = time.monotonic()
        child.due = None
        LOGGER.info("worker process %d started (pid %d)", child.number, child.process.pid)

    def signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signum)

    def stop(self, name: str) -> None:
        self.stops += 1
        running = sum(c.process is not None and c.process.poll() is None for c in self.children)
        if self.stops == 1:
            LOGGER.warning("%s: draining %d worker processes", name, running)
            self.signal_all(signal.SIGTERM)
        elif self.stops == 2:
            LOGGER.warning("%s: the worker processes hand their leases back", name)
            self.signal_all(signal.SIGTERM)
        else:
            LOGGER.warning("%s: killing the worker processes", name)
            self.signal_all(signal.SIGKILL)

    def reap(self) -> None:
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if process is None or (code := process.poll()) is None:
                continue
            child.process = None
            if self.stops:
                # Ended by the SIGTERM passed on before it set its own handler: it was
                # still starting, and had claimed nothing.
                child.code = EXIT_DRAINED if code == -signal.SIGTERM else code
                LOGGER.info("worker process %d (pid %d) %s", child.number, process.pid, _how(code))
                continue
            if now - child.started < QUICK_END:
                child.quick_ends += 1
                pause = min(FIRST_PAUSE * 2 ** (child.quick_ends - 1), MAX_PAUSE)
            else:
                child.quick_ends = 0
                pause = 0.0
            child.due = now + pause
            LOGGER.warning(
                "worker process %d (pid %d) %s; starting another%s",
                child.number,
                process.pid,
                _how(code),
                f" in {pause:g} s" if pause else "",
            )

    def restart_due(self) -> float | None:
        """Start the children whose pause is over; seconds until the next one is due."""
        if self.stops:
            return None
        now = time.monotonic()
        waits: list[float] = []
        for child in self.children:
            if child.due is None:
                continue
            if child.due <= now:
                self.start(child)
            else:
                waits.append(child.due - now)
        return min(waits, default=None)

    def finished(self) -> bool:
        return self.stops > 0 and all(c.process is None for c in self.children)

    def exit_code(self) -> int:
        codes = [c.code for c in self.children if c.code is not None]
        if all(code == EXIT_DRAINED for code in codes):
            return EXIT_DRAINED
        if all(code in (EXIT_DRAINED, EXIT_HANDED_BACK) for code in codes):
            return EXIT_HANDED_BACK
        return 1


def supervise(commands: Sequence[Sequence[str]], env: dict[str, str]) -> int:
    """Run a child of each of ``commands`` until a stop signal; return 0 when every
    child drained, 75 when some handed leases back, 1 when one ended otherwise."""
    supervisor = _Supervisor(commands, env)
    reader, writer = os.pipe()
    os.set_blocking(reader, False)
    os.set_blocking(writer, False)
    # The signal handlers do nothing; the wakeup fd carries each signal's number to the
    # loop below, which acts on it outside of signal context.
    watched = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
    previous = {sig: signal.signal(sig, lambda signum, frame: None) for sig in watched}
    previous_fd = signal.set_wakeup_fd(writer)
    try:
        for child in supervisor.children:
            supervisor.start(child)
        while not supervisor.finished():
            timeout = supervisor.restart_due()
            readable, _, _ = select.select([reader], [], [], timeout)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    for signum in os.read(reader, 512):
                        if signum in (signal.SIGTERM, signal.SIGINT):
                            supervisor.stop(signal.Signals(signum).name)
            supervisor.reap()
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(reader)
        os.close(writer)
        supervisor.signal_all(signal.SIGKILL)  # only if this loop itself failed
    return supervisor.exit_code()
