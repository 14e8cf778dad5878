"""Run the real, installed ``transports`` command in a subprocess (or under a pty)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "transports"
# The console script pip installed next to this interpreter; `python -m` where there is
# none (an interpreter outside a virtualenv), so the tests still run the installed package.
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "transports_cli"]


def transports(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, input: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run the command with ``input`` on stdin (default: none, so a prompt reads EOF)."""
    return subprocess.run(
        [*COMMAND, *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def transports_on_a_terminal(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, str]:
    """Run the command with stdin, stdout and stderr on a pseudo-terminal; return its
    exit code and everything it wrote there."""
    environ = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    environ.pop("NO_COLOR", None)
    environ.update(env or {})
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*COMMAND, *args], stdin=terminal, stdout=terminal, stderr=terminal, env=environ
    )
    os.close(terminal)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            output += chunk
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, output.decode(errors="replace")
