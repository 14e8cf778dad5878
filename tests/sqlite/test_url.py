"""`sqlite:` URLs and options: the three forms, the typed whitelist of options, and the
errors for everything else."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from transports_core import Event, open_transport
from transports_sqlite import SqliteOptions
from transports_sqlite._url import URL_FORMS, parse_url


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///relative/path.db", "relative/path.db"),
        ("sqlite:////absolute/path.db", "/absolute/path.db"),
        ("sqlite:///:memory:", ":memory:"),
    ],
)
def test_the_three_url_forms(url: str, path: str) -> None:
    options = parse_url(url, {})
    assert options == SqliteOptions(path=path)
    assert options.memory is (path == ":memory:")


def test_defaults_are_full_sync_and_five_seconds_busy_timeout() -> None:
    options = parse_url("sqlite:///q.db", {})
    assert (options.synchronous, options.busy_timeout, options.clock) == ("full", 5000, time.time)


def test_path_is_percent_decoded() -> None:
    assert parse_url("sqlite:////tmp/my%20queue%3F%23.db", {}).path == "/tmp/my queue?#.db"


def test_percent_encoded_file_name_reaches_the_file_system(tmp_path: Path) -> None:
    name = "odd name?#%.db"
    with open_transport(f"sqlite:///{quote(str(tmp_path / name))}") as t:
        t.publish("g", Event())
    assert (tmp_path / name).is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        name
    ]


def test_options_from_the_query() -> None:
    options = parse_url("sqlite:///q.db?synchronous=NORMAL&busy_timeout=2000", {})
    assert (options.synchronous, options.busy_timeout) == ("normal", 2000)


def test_options_from_keywords() -> None:
    def clock() -> float:
        return 5.0

    options = parse_url("sqlite:///q.db", {"synchronous": "off", "busy_timeout": 0, "clock": clock})
    assert options == SqliteOptions("q.db", synchronous="off", busy_timeout=0, clock=clock)


def test_query_and_keywords_combine() -> None:
    options = parse_url("sqlite:///q.db?synchronous=extra", {"busy_timeout": 10})
    assert (options.synchronous, options.busy_timeout) == ("extra", 10)


def test_unknown_query_option_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown SQLite option 'journal'") as info:
        parse_url("sqlite:///q.db?journal=wal", {})
    assert str(info.value).endswith(
        "known options: busy_timeout, dedup_window, file_mode, max_attempts, migrate, on_dead, "
        "synchronous"
    )


def test_unknown_keyword_option_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown SQLite option 'timeout'") as info:
        parse_url("sqlite:///q.db", {"timeout": 1})
    assert str(info.value).endswith(
        "known options: busy_timeout, clock, dedup_window, file_mode, max_attempts, migrate, "
        "on_dead, synchronous"
    )


@pytest.mark.parametrize(
    ("url", "options", "error", "names"),
    [
        ("sqlite:///q.db?synchronous=fast", {}, ValueError, "synchronous must be one of"),
        ("sqlite:///q.db?synchronous=", {}, ValueError, "got ''"),
        ("sqlite:///q.db", {"synchronous": 2}, ValueError, "got 2"),
        ("sqlite:///q.db?busy_timeout=-1", {}, ValueError, "got '-1'"),
        ("sqlite:///q.db?busy_timeout=1.5", {}, ValueError, "got '1.5'"),
        ("sqlite:///q.db?busy_timeout=lots", {}, ValueError, "got 'lots'"),
        ("sqlite:///q.db?busy_timeout=", {}, ValueError, "got ''"),
        ("sqlite:///q.db?busy_timeout=%C2%B2", {}, ValueError, "got '²'"),
        ("sqlite:///q.db", {"busy_timeout": -5}, ValueError, "got -5"),
        ("sqlite:///q.db", {"busy_timeout": True}, ValueError, "got True"),
        ("sqlite:///q.db", {"busy_timeout": 2.5}, ValueError, "got 2.5"),
        ("sqlite:///q.db", {"clock": 3}, TypeError, "clock must be a callable"),
        ("sqlite:///q.db?clock=time", {}, ValueError, "unknown SQLite option 'clock'"),
        (
            "sqlite:///q.db?synchronous=off&synchronous=full",
            {},
            ValueError,
            "'synchronous' is given twice",
        ),
        (
            "sqlite:///q.db?busy_timeout=1",
            {"busy_timeout": 1},
            ValueError,
            "'busy_timeout' is given both in the URL and as a keyword",
        ),
        ("sqlite:///", {}, ValueError, "names no file"),
        ("sqlite:///q.db#part", {}, ValueError, "fragment"),
    ],
)
def test_bad_urls_and_option_values_are_named(
    url: str, options: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error) as info:
        parse_url(url, options)
    assert names in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/q.db",
        "sqlite://user:secret@host/q.db",
        "sqlite:q.db",
        "sqlite:/q.db",
        "sqlite:",
    ],
)
def test_malformed_url_lists_the_valid_forms(url: str) -> None:
    with pytest.raises(ValueError, match="malformed SQLite URL") as info:
        parse_url(url, {})
    assert str(info.value).endswith(f"use {URL_FORMS}")
    for form in ("sqlite:///relative/path.db", "sqlite:////absolute/path.db", "sqlite:///:memory:"):
        assert form in str(info.value)
    assert "secret" not in str(info.value)


def test_open_transport_reports_bad_options_before_touching_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown SQLite option 'journal'"):
        open_transport(f"sqlite:///{tmp_path / 'q.db'}?journal=wal")
    assert list(tmp_path.iterdir()) == []
