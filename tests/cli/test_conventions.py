"""The conventions every command keeps: help with an example, exit codes, one-line
errors, tracebacks only with --debug, no passwords, colour only on a terminal."""

from __future__ import annotations

import pytest

from transports_cli import cli

from ._command import COMMAND, SCRIPT, transports, transports_on_a_terminal

COMMANDS = sorted(cli.commands)


def test_console_script_is_installed_next_to_the_interpreter() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} missing: is the distribution installed?"
    assert COMMAND[0] == str(SCRIPT)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_exits_0_and_shows_an_example(command: str) -> None:
    result = transports(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    _, sep, example = result.stdout.partition("Example:")
    assert sep, result.stdout
    assert f"transports {command}".strip() in example


def test_no_arguments_prints_the_help() -> None:
    result = transports()
    assert result.returncode == 0
    assert "backends" in result.stdout
    assert "demo" in result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["demo", "--bogus"], "--bogus"),
        (["no-such-command"], "no-such-command"),
        (["demo", "--executions", "0"], "--executions"),
        (["demo", "--quiet", "--json"], "--quiet and --json"),
        (["backends", "extra-argument"], "extra-argument"),
    ],
)
def test_usage_error_exits_2_with_one_line_on_stderr(args: list[str], said: str) -> None:
    result = transports(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ")
    assert said in line
    assert "--help" in line


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "nope://somewhere",
            "no transport backend for scheme 'nope'; known schemes: "
            "postgres, postgresql, redis, redis+cluster, redis+sentinel, rediss, rediss+cluster, "
            "sqlite, unix",
        ),
        ("not a url", "malformed transport URL"),
        ("sqlite:///no/such/directory/q.db", "does not exist"),
        ("sqlite:///:memory:", "need a shared store"),
    ],
)
def test_bad_url_gives_one_line_and_exit_1(url: str, said: str) -> None:
    result = transports("demo", url)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ")
    assert said in line
    assert "Traceback" not in result.stdout + result.stderr


def test_debug_shows_the_traceback_then_the_line() -> None:
    result = transports("--debug", "demo", "nope://somewhere")
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert "UnknownBackend" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("Error: no transport backend")


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "postgresql://bob:hunter22secret@db.example/queue"],
        ["demo", "sqlite://bob:hunter22secret@host/queue.db"],
        ["--debug", "demo", "sqlite://bob:hunter22secret@host/queue.db"],
        ["demo", "http://bob:hunter22secret@[::1"],
    ],
)
def test_a_password_in_a_url_is_never_printed(args: list[str]) -> None:
    result = transports(*args)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("Error: ")
    assert "hunter22secret" not in result.stdout + result.stderr


def test_errors_are_plain_when_piped_and_coloured_on_a_terminal() -> None:
    piped = transports("demo", "nope://x")
    assert "\x1b[" not in piped.stderr
    code, shown = transports_on_a_terminal("demo", "nope://x")
    assert code == 1
    assert "\x1b[" in shown
    assert "no transport backend for scheme 'nope'" in shown


def test_no_color_turns_colour_off_on_a_terminal() -> None:
    code, shown = transports_on_a_terminal("demo", "nope://x", env={"NO_COLOR": "1"})
    assert code == 1
    assert "Error: no transport backend" in shown
    assert "\x1b[" not in shown


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "--json"],
        ["dead"],
        ["dead", "requeue", "1"],
        ["dead", "purge", "--yes"],
        ["purge", "--group", "g", "--yes"],
        ["bench", "--quick"],
        ["--debug", "inspect"],
    ],
)
def test_admin_and_bench_commands_never_print_a_url_password(args: list[str]) -> None:
    url = "sqlite://user:secret@host/x.db"  # invalid: the backend refuses it, naming it
    command = [a for a in args if a == "--debug"]
    rest = [a for a in args if a != "--debug"]
    result = transports(*command, rest[0], url, *rest[1:])
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith("Error: malformed SQLite URL 'sqlite://user:***@host/x.db'")
    assert "secret" not in result.stdout + result.stderr
