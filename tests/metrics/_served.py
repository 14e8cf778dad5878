"""A real ``transports worker --metrics-port 0`` process, and what it serves over HTTP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
PATIENCE = 60.0
HANDLERS = """
from transports_worker import Bury

def handle(event, ctx):
    if event.kind == "bury":
        raise Bury("unwanted")
"""
SERVING = re.compile(r"serving metrics on http://([\d.]+):(\d+)/metrics")


@dataclass
class Scrape:
    """One scrape: each family's type as served (``# TYPE`` lines, by the name on them),
    and every sample as ``(name, labels) -> value``."""

    types: dict[str, str]
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    labels: dict[str, set[str]]  # the label names each family's samples carry

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))


def parse(text: str) -> Scrape:
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
    samples = {}
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
            labels.setdefault(family.name, set()).update(set(sample.labels) - {"le"})
    return Scrape(types, samples, labels)


class ServingWorker:
    """``transports worker`` with ``--metrics-port 0`` in ``cwd``, logging to a file."""

    def __init__(self, cwd: Path, url: str, *options: str) -> None:
        (cwd / "jobs.py").write_text(textwrap.dedent(HANDLERS))
        self.log = cwd / "worker.log"
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "transports_cli", "worker", "jobs:handle", url]
        serving = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [*command, *serving, *options],
                cwd=cwd,
                env={**os.environ, "PYTHONPATH": path},
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        self.address = self._address()

    def _address(self) -> str:
        deadline = time.monotonic() + PATIENCE
        while (found := SERVING.search(self.log.read_text())) is None:
            if self.process.poll() is not None:
                raise AssertionError(f"the worker exited {self.process.returncode}: {self.text}")
            assert time.monotonic() < deadline, f"no metrics address logged: {self.text}"
            time.sleep(0.05)
        return f"http://{found[1]}:{found[2]}/metrics"

    @property
    def text(self) -> str:
        return self.log.read_text()

    def scrape(self) -> Scrape:
        with urllib.request.urlopen(self.address, timeout=10) as response:
            assert response.status == 200
            kind = response.headers["Content-Type"]
            assert kind.startswith("text/plain"), kind
            return parse(response.read().decode())

    def scrape_until(self, done: Callable[[Scrape], bool]) -> Scrape:
        """Scrape until ``done`` holds of a scrape (the worker and the backlog's cache
        get there in their own time); fail after `PATIENCE`."""
        deadline = time.monotonic() + PATIENCE
        while not done(scrape := self.scrape()):
            assert time.monotonic() < deadline, f"never reached: {scrape.samples}"
            time.sleep(0.2)
        return scrape

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=PATIENCE)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
