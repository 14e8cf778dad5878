"""The console transcripts of docs/cli.md, run for real.

A transcript is a ```console block: lines starting with ``$ `` are commands (run by bash,
stderr merged into stdout as a terminal shows them), the lines after each are what it
printed. The blocks of a page run in order, in one new directory, so a block may use
what an earlier one made. A block whose output cannot repeat (timings, relative times)
is preceded by ``<!-- transcript: not checked: WHY -->`` and is neither run nor compared;
nor is a block that does not start with a command.

``python -m tests.cli._transcripts`` rewrites the checked blocks of the page with what
the commands print now.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_BLOCK = re.compile(
    r"(?P<note><!-- transcript: not checked: [^>]* -->\n)?```console\n(?P<body>.*?)```",
    re.S,
)


@dataclass(frozen=True)
class Step:
    command: str
    output: str


@dataclass(frozen=True)
class Block:
    start: int
    end: int  # of the body
    checked: bool
    steps: tuple[Step, ...]


def blocks(text: str) -> list[Block]:
    found = []
    for match in _BLOCK.finditer(text):
        steps: list[Step] = []
        command: str | None = None
        output: list[str] = []
        for line in match["body"].splitlines(keepends=True):
            if line.startswith("$ "):
                if command is not None:
                    steps.append(Step(command, "".join(output)))
                command, output = line[2:].rstrip("\n"), []
            else:
                output.append(line)
        if command is not None:
            steps.append(Step(command, "".join(output)))
        # A block that does not open with a command (a frame of the live view) is prose.
        checked = not match["note"] and match["body"].startswith("$ ")
        found.append(Block(match.start("body"), match.end("body"), checked, tuple(steps)))
    return found


def run(command: str, cwd: Path) -> str:
    """What ``command`` prints, as a terminal 80 columns wide without colour shows it."""
    environ = {k: v for k, v in os.environ.items() if k != "TRANSPORTS_URL"}
    bin_dir = str(Path(sys.executable).parent)
    environ.update(
        PATH=os.pathsep.join([bin_dir, environ.get("PATH", "")]), COLUMNS="80", NO_COLOR="1"
    )
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout


def regenerate(text: str) -> str:
    """``text`` with the output of every checked step replaced by a fresh run's."""
    pieces = []
    last = 0
    with tempfile.TemporaryDirectory() as place:
        for block in blocks(text):
            if not block.checked:
                continue
            body = "".join(f"$ {s.command}\n{run(s.command, Path(place))}" for s in block.steps)
            pieces += [text[last : block.start], body]
            last = block.end
    return "".join([*pieces, text[last:]])


if __name__ == "__main__":
    PAGE.write_text(regenerate(PAGE.read_text()))
