"""The dashboard as a real subprocess on a free port (``--port 0``: it binds, then prints
where), stopped with Ctrl-C's signal at the end, its whole output kept for checks."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.cli._command import COMMAND

STARTUP = 60.0  # seconds to wait for the first line (a cold import on a loaded machine)


@dataclass
class Running:
    address: str  # http://127.0.0.1:PORT/ (with the trailing slash)
    lines: list[str]  # what it printed before serving
    output: str = ""  # everything it printed, stdout and stderr, once stopped
    returncode: int | None = None
    process: subprocess.Popen[str] | None = field(default=None, repr=False)

    def at(self, path: str) -> str:
        return self.address.rstrip("/") + path


class _Lines:
    """The lines a process prints, read by a thread of their own, so that waiting for
    one can time out (a select on a buffered text stream may miss lines already read)."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put("")  # end of output

    def next(self, deadline: float) -> str:
        try:
            return self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("the dashboard printed nothing in time") from None

    def rest(self) -> str:
        """Everything after the lines taken, once the process has exited."""
        self._thread.join(timeout=30)
        return "".join(iter(self._lines.get_nowait, ""))


@contextmanager
def dashboard(
    url: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[Running]:
    """Run ``transports dashboard URL --port 0 ARGS`` (in ``cwd``); yields once it listens."""
    environ = {**os.environ, **(env or {})}
    process = subprocess.Popen(
        [*COMMAND, "dashboard", url, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environ,
        cwd=cwd,
    )
    assert process.stdout is not None
    lines = _Lines(process.stdout)
    running: Running | None = None
    try:
        deadline = time.monotonic() + STARTUP
        first = lines.next(deadline)
        found = re.search(r" at (http://\S+/) ", first)
        if found is None:
            process.wait(timeout=30)
            raise AssertionError(f"the dashboard did not start: {first}{lines.rest()}")
        printed = [first]
        if "--allow-actions" in args:
            printed.append(lines.next(deadline))
        running = Running(found.group(1), printed, process=process)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        rest = lines.rest()
        process.stdout.close()
        if running is not None:
            running.output = "".join(running.lines) + rest
            running.returncode = process.returncode


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    headers: dict[str, str]


def request(
    url: str,
    form: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """GET ``url``, or POST ``form`` to it (urlencoded); redirects are not followed."""

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    data = None
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
    sent = urllib.request.Request(url, data=data, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(sent, timeout=30) as response:
            return Answer(response.status, response.read().decode(), dict(response.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(), dict(exc.headers))


def inspect_json(url: str) -> dict[str, object]:
    """What ``transports inspect URL --json`` reports."""
    from tests.cli._command import transports

    done = transports("inspect", url, "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, object] = json.loads(done.stdout)
    return document
