"""The README's two commands are what a new user runs first: keep them honest."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _shell_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    blocks = _shell_blocks((ROOT / "README.md").read_text())
    test_commands = [block for block in blocks if "pytest" in block]
    assert len(test_commands) == 1, blocks
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_commands[0] in ci_lines


def test_readme_main_command_runs_an_existing_script() -> None:
    blocks = _shell_blocks((ROOT / "README.md").read_text())
    main = next(block for block in blocks if "pytest" not in block)
    for script in re.findall(r"python (\S+\.py)", main):
        assert (ROOT / script).is_file(), script
