"""docs/cli.md shows what the commands print: every transcript not marked otherwise is
run, in order, in a new directory, and must match the page line for line."""

from __future__ import annotations

from pathlib import Path

from ._transcripts import PAGE, blocks, run


def test_every_checked_transcript_matches_a_real_run(tmp_path: Path) -> None:
    found = blocks(PAGE.read_text())
    checked = [block for block in found if block.checked]
    # The help of the group and of each subcommand shown is among them.
    commands = [step.command for block in checked for step in block.steps]
    assert "transports --help" in commands
    for block in checked:
        for step in block.steps:
            assert run(step.command, tmp_path) == step.output, (
                f"{step.command!r} prints something else now: run "
                "'python -m tests.cli._transcripts' to rewrite docs/cli.md"
            )


def test_every_subcommand_with_a_help_transcript_is_checked() -> None:
    from transports_cli import cli

    text = PAGE.read_text()
    for block in blocks(text):
        for step in block.steps:
            if step.command.endswith("--help"):
                assert block.checked, step.command
    helps = {s.command for b in blocks(text) for s in b.steps if s.command.endswith("--help")}
    for name in ("publish", "worker"):
        assert f"transports {name} --help" in helps
    assert set(cli.commands) >= {h.split()[1] for h in helps if h != "transports --help"}
