"""Every ```python block in README.md and docs/*.md runs, in order per file, in a fresh
namespace and a temporary working directory. A block that should not run is marked by
putting ``<!-- norun -->`` on the line before its fence. Every page is in the site's
navigation (mkdocs.yml), so none is built but unreachable."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages whose examples run a whole suite or real processes: left out of `-m 'not slow'`.
SLOW_PAGES = {"conformance.md"}
# Pages with no example of their own: generated from docstrings, or notes on the design.
NO_EXAMPLE_PAGES = {"reference.md", "design.md"}
BLOCK = re.compile(r"(<!-- norun -->\n)?```python\n(.*?)```", re.S)


def _blocks(page: Path) -> list[str]:
    return [code for norun, code in BLOCK.findall(page.read_text()) if not norun]


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW_PAGES else [])
        for p in PAGES
        if p.name not in NO_EXAMPLE_PAGES
    ],
)
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks(page)
    assert blocks, f"{page.name} shows no runnable python example"
    monkeypatch.chdir(tmp_path)
    # A registered module, as for a user's script: pydantic resolves models through it.
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for number, code in enumerate(blocks, 1):
        compiled = compile(code, f"{page.name}[block {number}]", "exec")
        exec(compiled, module.__dict__)


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r":\s+(\S+\.md)$", nav, re.M))
    pages = {p.name for p in PAGES[1:]}
    assert listed == pages, f"in docs/ only: {pages - listed}; in nav only: {listed - pages}"
