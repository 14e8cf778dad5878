"""The README's two commands are what a new user runs first: keep them honest."""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

import transports_cli
from transports_cli import cli

ROOT = Path(__file__).resolve().parent.parent


def _shell_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    blocks = _shell_blocks((ROOT / "README.md").read_text())
    test_commands = [block for block in blocks if "pytest" in block]
    assert len(test_commands) == 1, blocks
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_commands[0] in ci_lines


def test_readme_main_command_runs_an_installed_subcommand() -> None:
    blocks = _shell_blocks((ROOT / "README.md").read_text())
    main = next(block for block in blocks if "pytest" not in block)
    scripts = {
        ep.name: ep
        for ep in distribution("durable-transports").entry_points
        if ep.group == "console_scripts"
    }
    invoked = re.findall(r"\.venv/bin/(\S+)(?: (\S+))?", main)
    commands = [(script, word) for script, word in invoked if script not in ("pip", "python")]
    assert commands, main
    for script, subcommand in commands:
        assert script in scripts, f"{script} is not a console script of the distribution"
        assert scripts[script].load() is transports_cli.main
        assert subcommand in cli.commands, subcommand
