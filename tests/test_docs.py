"""The examples in README.md and docs/*.md run, as a reader would run them.

A page's ```python blocks are of three kinds:

- a plain block is a script: a page's plain blocks run in order, in one namespace;
- a block whose fence names a file (```python title="jobs.py"```) is a file the page asks
  the reader to save under that name. It is written there, and at its place in the page
  it is run as the reader would: ``python -m pytest NAME`` for a ``test_*.py`` file,
  ``python NAME`` for any other, each in a process of its own;
- a block with ``<!-- norun -->`` on the line before its fence is shown and never run.

Each page runs twice in a row in one fresh temporary directory, so an example that leaves
behind something its next run trips over (a table it creates, a queue it does not drain)
fails here (the test files of ``TEST_FILES_ONCE``'s pages run once, with why). A file
block must also do nothing but define things when it is imported (as ``transports worker
jobs:handle`` or a test runner imports it): its work belongs under ``if __name__ ==
"__main__":``. Every page is in the site's navigation (mkdocs.yml), so
none is built but unreachable. The two tables of docs/conformance.md keyed by slug have one
row for each capability and each property of the suite, and no other rows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from collections import Counter
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import pytest

from transports_core.conformance import CAPABILITIES, PROPERTIES

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages whose examples run a whole suite or real processes: left out of `-m 'not slow'`.
SLOW_PAGES = {"conformance.md"}
# Pages with no example of their own: generated from docstrings, or notes on the design.
NO_EXAMPLE_PAGES = {"reference.md", "design.md"}
BLOCK = re.compile(r'(<!-- norun -->\n)?```python(?: title="([^"\n]+)")?\n(.*?)```', re.S)
# Pages whose second run is known to fail, with why: the first run is still checked, and a
# second run that passes fails the test, so that the entry is removed.
SECOND_RUN_PENDING: dict[str, str] = {}
# Pages whose test files run in the first round only: each is the whole conformance suite,
# whose tests each get a directory of their own from pytest, so a second run of it would
# check nothing the first did not, for 36 s. The page's other blocks run twice.
TEST_FILES_ONCE = {"conformance.md"}
# How long one file of a page may run in its own process (the conformance suite included).
FILE_TIMEOUT = 900


@dataclass(frozen=True)
class Block:
    page: str
    number: int
    code: str
    file: str | None  # the name the page saves it under; None for a script block


def _blocks(page: Path) -> list[Block]:
    found = [
        (title or None, code) for norun, title, code in BLOCK.findall(page.read_text()) if not norun
    ]
    return [Block(page.name, n, code, title) for n, (title, code) in enumerate(found, 1)]


def _page_params(*, only_with_files: bool = False) -> list[object]:
    return [
        pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW_PAGES else [])
        for p in PAGES
        if p.name not in NO_EXAMPLE_PAGES
        and (not only_with_files or any(b.file for b in _blocks(p)))
    ]


def _run_file(block: Block, directory: Path) -> None:
    assert block.file is not None
    (directory / block.file).write_text(block.code)
    if Path(block.file).name.startswith("test_"):
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", block.file]
    else:
        command = [sys.executable, block.file]
    done = subprocess.run(
        command,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=FILE_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.page}[block {block.number}] {' '.join(command[1:])} exited with "
        f"{done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    )


def _run_page(blocks: list[Block], directory: Path, round_: int) -> None:
    # A registered module, as for a user's script: pydantic resolves models through it.
    module = types.ModuleType(f"docs_{blocks[0].page.split('.')[0].replace('-', '_')}")
    sys.modules[module.__name__] = module
    try:
        for block in blocks:
            if block.file is not None:
                once = block.page in TEST_FILES_ONCE and Path(block.file).name.startswith("test_")
                if round_ == 1 or not once:
                    _run_file(block, directory)
                continue
            name = f"{block.page}[block {block.number}, run {round_}]"
            exec(compile(block.code, name, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]


@pytest.mark.parametrize("page", _page_params())
def test_page_examples_run_twice_in_one_directory(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _blocks(page)
    assert blocks, f"{page.name} shows no runnable python example"
    monkeypatch.chdir(tmp_path)
    _run_page(blocks, tmp_path, 1)
    if page.name not in SECOND_RUN_PENDING:
        _run_page(blocks, tmp_path, 2)
        return
    try:
        _run_page(blocks, tmp_path, 2)
    except Exception as exc:  # any failure here is the known one, named below
        pytest.xfail(f"second run: {SECOND_RUN_PENDING[page.name]} ({exc!r})")
    pytest.fail(f"{page.name} now runs twice: remove it from SECOND_RUN_PENDING")


# Run in a child interpreter: imports one module from the current directory and reports, as
# JSON, what the import did that is more than defining things. Audit hooks cannot be
# removed, so they stay out of the test process.
IMPORT_PROBE = r"""
import ast, importlib, json, os, sys, threading

from transports_core import known_schemes

sys.dont_write_bytecode = True
sys.path.insert(0, os.getcwd())
name = sys.argv[1]
# What the module imports is imported first, unwatched: a library may do work when first
# imported (find a shared library, say); only the module's own statements are judged.
tree = ast.parse(open(name + ".py").read())
for node in tree.body:
    if isinstance(node, ast.Import):
        for alias in node.names:
            importlib.import_module(alias.name)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        imported = importlib.import_module(node.module)
        for alias in node.names:  # names a package loads lazily (PEP 562) load now too
            getattr(imported, alias.name, None)
WATCHED = ("sqlite3.connect", "socket.connect", "subprocess.Popen", "os.fork",
           "os.posix_spawn", "os.exec", "os.system")
seen = []
active = [False]

def hook(event, args):
    if not active[0]:
        return
    if event in WATCHED:
        seen.append(f"{event}{tuple(map(str, args[:2]))}")
    elif event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
        if (mode and any(c in mode for c in "wax+")) or (flags & writes):
            seen.append(f"open for writing {args[0]}")

sys.addaudithook(hook)
threads = set(threading.enumerate())
schemes = known_schemes()
before = {p: os.stat(p).st_mtime_ns for p in os.listdir()}
active[0] = True
try:
    module = __import__(name)
finally:
    active[0] = False
after = {p: os.stat(p).st_mtime_ns for p in os.listdir()}
seen += [f"wrote {p}" for p in sorted(after) if before.get(p) != after[p]]
seen += [f"left thread {t.name} running" for t in set(threading.enumerate()) - threads]
seen += [f"registered {s}" for s in sorted(set(known_schemes()) - set(schemes))]
print(json.dumps({"did": seen, "names": sorted(vars(module))}))
"""


def _import_probe(directory: Path, module: str) -> tuple[list[str], list[str]]:
    """What importing ``module`` from ``directory`` did beyond defining things, and the
    names it defined."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, module],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"import {module} failed:\n{done.stderr[-6000:]}"
    report = json.loads(done.stdout.splitlines()[-1])
    return report["did"], report["names"]


@pytest.mark.parametrize("page", _page_params(only_with_files=True))
def test_page_files_do_nothing_on_import(page: Path, tmp_path: Path) -> None:
    files = [b for b in _blocks(page) if b.file is not None]
    for block in files:
        assert block.file is not None
        (tmp_path / block.file).write_text(block.code)
    # `transports worker jobs:handle` on the page names a function the import must define.
    wanted = re.findall(r"transports worker (\w+):(\w+)", page.read_text())
    for block in files:
        assert block.file is not None
        module = Path(block.file).stem
        did, names = _import_probe(tmp_path, module)
        assert did == [], f"{page.name}: importing {block.file} did more than define: {did}"
        for function in (f for m, f in wanted if m == module):
            assert function in names, f"{page.name}: {block.file} defines no {function}"


def test_import_probe_reports_work_done_on_import(tmp_path: Path) -> None:
    """The check above can fail: a module that opens a queue, starts a thread or registers
    a scheme when imported is reported, and one that only defines is not."""
    (tmp_path / "eager.py").write_text(
        "from transports_core import Event, open_transport\n"
        "with open_transport('sqlite:///eager.db') as queue:\n"
        "    queue.publish('g', Event(kind='now'))\n"
    )
    (tmp_path / "spawning.py").write_text(
        "import threading\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait, name='busy', daemon=True).start()\n"
    )
    (tmp_path / "lazy.py").write_text(
        "from transports_core import Event, open_transport\n"
        "def main() -> None:\n"
        "    with open_transport('sqlite:///lazy.db') as queue:\n"
        "        queue.publish('g', Event(kind='later'))\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    eager, _ = _import_probe(tmp_path, "eager")
    assert "wrote eager.db" in eager
    assert any(e.startswith("sqlite3.connect") for e in eager)
    (tmp_path / "registering.py").write_text(
        "from transports_core import register_backend\n"
        "from transports_sqlite import backend\n"
        "register_backend('eagerqueue', backend)\n"
    )
    registering, _ = _import_probe(tmp_path, "registering")
    assert registering == ["registered eagerqueue"]
    spawning, _ = _import_probe(tmp_path, "spawning")
    assert spawning == ["left thread busy running"]
    lazy, names = _import_probe(tmp_path, "lazy")
    assert lazy == []
    assert "main" in names
    assert not (tmp_path / "lazy.db").exists()


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r":\s+(\S+\.md)$", nav, re.M))
    pages = {p.name for p in PAGES[1:]}
    assert listed == pages, f"in docs/ only: {pages - listed}; in nav only: {listed - pages}"


# The tables of docs/conformance.md whose rows are keyed by a slug, each by its header
# row: every slug of the set has one row, and no row names anything else.
SLUG_TABLES = {
    "| capability | what the backend promises | without it |": ("capability", CAPABILITIES),
    "| property | the promise |": ("property", frozenset(PROPERTIES)),
}


def _table_slugs(lines: list[str], header: str) -> list[str]:
    """The slug of each row of the one table headed ``header``: its first cell, which must
    be one slug in backticks."""
    starts = [i for i, line in enumerate(lines) if line == header]
    assert len(starts) == 1, f"conformance.md has {len(starts)} tables headed {header!r}"
    table = list(takewhile(lambda line: line.startswith("|"), lines[starts[0] + 1 :]))
    rule, *rows = table or [""]
    assert rule.startswith("|---"), f"the table headed {header!r} has no |---| line under it"
    cells = [row.split("|")[1].strip() for row in rows]
    bad = [cell for cell in cells if not re.fullmatch(r"`[a-z0-9-]+`", cell)]
    assert bad == [], f"rows of the table headed {header!r} not keyed by a slug: {bad}"
    return [cell.strip("`") for cell in cells]


def test_conformance_tables_have_one_row_for_each_property_and_capability() -> None:
    lines = (ROOT / "docs" / "conformance.md").read_text().splitlines()
    problems = []
    for header, (kind, known) in SLUG_TABLES.items():
        rows = Counter(_table_slugs(lines, header))
        if missing := sorted(known - set(rows)):
            problems.append(f"no row for the {kind} slugs {missing}")
        if unknown := sorted(set(rows) - known):
            problems.append(f"{kind} rows for {unknown}, which name no {kind}")
        if twice := sorted(slug for slug, n in rows.items() if n > 1):
            problems.append(f"more than one {kind} row for {twice}")
    assert problems == [], f"docs/conformance.md: {'; '.join(problems)}"
