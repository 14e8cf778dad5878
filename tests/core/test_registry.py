"""Choosing a backend by URL scheme: in-process registration, entry points of a real
(separately installed) distribution, and the errors for everything else."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from transports_core import (
    ENTRY_POINT_GROUP,
    Backend,
    Event,
    Transport,
    UnknownBackend,
    known_schemes,
    open_async_transport,
    open_transport,
    redact_url,
    register_backend,
)
from transports_sqlite import SqliteOptions, SqliteTransport


class Recorder:
    """A backend opener that records its calls and opens an in-memory SQLite queue."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, dict[str, object]]] = []

    def __call__(
        self, url: str, event_type: object, options: Mapping[str, object]
    ) -> SqliteTransport[Any]:
        self.calls.append((url, event_type, dict(options)))
        return SqliteTransport(SqliteOptions(path=":memory:"), event_type)


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Schemes the test registers; all removed afterwards."""
    schemes: list[str] = []
    yield schemes
    for scheme in schemes:
        register_backend(scheme, None)


def test_registered_backend_opens_the_url_with_the_options(registered: list[str]) -> None:
    opener = Recorder()
    register_backend("memo", Backend(open=opener))
    registered.append("memo")
    with open_transport("memo://anything/at/all?x=1", event_type=Event, flavour="mint") as t:
        assert isinstance(t, Transport)
        t.publish("g", Event(i=1))
    assert opener.calls == [("memo://anything/at/all?x=1", Event, {"flavour": "mint"})]
    assert known_schemes()["memo"] == "register_backend()"


def test_registered_backend_wins_over_an_entry_point_until_removed(
    registered: list[str], tmp_path: Path
) -> None:
    opener = Recorder()
    register_backend("sqlite", Backend(open=opener))
    registered.append("sqlite")
    url = f"sqlite:///{tmp_path / 'q.db'}"
    open_transport(url).close()
    assert [call[0] for call in opener.calls] == [url]
    assert not (tmp_path / "q.db").exists()

    register_backend("sqlite", None)
    with open_transport(url) as t:
        t.publish("g", Event())
    assert len(opener.calls) == 1
    assert (tmp_path / "q.db").exists()


def test_removing_an_unregistered_scheme_is_a_no_op() -> None:
    register_backend("never-registered", None)
    assert "never-registered" not in known_schemes()


@pytest.mark.parametrize("scheme", ["", "memo://"])
def test_register_backend_refuses_a_bad_scheme(scheme: str) -> None:
    with pytest.raises(ValueError, match=repr(scheme)):
        register_backend(scheme, Backend(open=Recorder()))


def test_register_backend_refuses_what_is_not_a_backend() -> None:
    with pytest.raises(TypeError, match="backend must be a Backend, got <function"):
        register_backend("memo", Recorder.__call__)  # type: ignore[arg-type]
    assert "memo" not in known_schemes()


def test_sqlite_comes_from_this_distributions_entry_point() -> None:
    assert known_schemes()["sqlite"] == "transports_sqlite:backend"


def test_unknown_scheme_lists_the_known_schemes_sorted(registered: list[str]) -> None:
    for scheme in ("zzz-test", "aaa-test"):
        register_backend(scheme, Backend(open=Recorder()))
        registered.append(scheme)
    with pytest.raises(UnknownBackend) as info:
        open_transport("nope://host/db")
    err = info.value
    assert isinstance(err, LookupError)
    assert err.scheme == "nope"
    assert err.known == tuple(sorted(err.known))
    assert {"aaa-test", "sqlite", "zzz-test"} <= set(err.known)
    assert (
        str(err) == f"no transport backend for scheme 'nope'; known schemes: {', '.join(err.known)}"
    )


def test_async_open_of_a_backend_without_async_says_so(registered: list[str]) -> None:
    register_backend("memo", Backend(open=Recorder()))
    registered.append("memo")
    with pytest.raises(UnknownBackend, match="'memo' has no async transport") as info:
        open_async_transport("memo://x")
    assert {"memo", "sqlite"} <= set(info.value.known)


@pytest.mark.parametrize("url", ["queue.db", "sqlite:/q.db", "sqlite:q.db", "://q.db", ""])
def test_malformed_url_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="malformed transport URL") as info:
        open_transport(url)
    assert "SCHEME://" in str(info.value)


def test_url_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="url must be a str, got PosixPath"):
        open_transport(Path("q.db"))  # type: ignore[call-overload]


def test_malformed_url_error_does_not_show_its_password() -> None:
    with pytest.raises(ValueError, match="malformed") as info:
        open_transport("postgresql:/app:s3cret@db.example/queue")
    assert "s3cret" not in str(info.value)
    assert "app:***@db.example" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@host/0", "redis://:***@host/0"),
        ("postgresql://u:p%40ss@h/db?x=1", "postgresql://u:***@h/db?x=1"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("sqlite:///q.db", "sqlite:///q.db"),
        ("user:secret@host", "user:***@host"),
        # Passwords in the query, each backend's forms.
        ("redis://host:6379/0?password=secret", "redis://host:6379/0?password=***"),
        (
            "rediss://u@h/0?password=secret&ssl_cert_reqs=none",
            "rediss://u@h/0?password=***&ssl_cert_reqs=none",
        ),
        ("unix:///run/redis.sock?db=2&password=secret", "unix:///run/redis.sock?db=2&password=***"),
        (
            "postgresql://u@h/db?schema=q&password=s%26cret&sslmode=require",
            "postgresql://u@h/db?schema=q&password=***&sslmode=require",
        ),
        ("postgres:///db?host=/run/pg&PassWord=secret", "postgres:///db?host=/run/pg&PassWord=***"),
        (
            "postgresql://u:secret@h/db?sslpassword=secret",
            "postgresql://u:***@h/db?sslpassword=***",
        ),
        ("sqlite:///q.db?password=secret", "sqlite:///q.db?password=***"),
        ("postgresql://h/db?password=secret#frag", "postgresql://h/db?password=***#frag"),
        # A URL as a query value: its own passwords are blanked too.
        (
            "postgresql://h/db?listen_url=postgresql%3A%2F%2Fu%3Asecret%40direct%2Fdb",
            "postgresql://h/db?listen_url=postgresql://u:***@direct/db",
        ),
        (
            "postgresql://h/db?listen_url=postgresql%3A%2F%2Fdirect%2Fdb%3Fpassword%3Dsecret",
            "postgresql://h/db?listen_url=postgresql://direct/db%3Fpassword%3D***",
        ),
        ("postgresql://h/db?password", "postgresql://h/db?password"),
        ("postgresql://h/db?passwords_seen=3", "postgresql://h/db?passwords_seen=3"),
    ],
)
def test_redact_url_hides_passwords(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "secret" not in shown


# A real distribution on sys.path, found through its entry_points.txt

BACKEND_MODULE = textwrap.dedent(
    """
    from transports_core import Backend
    from transports_sqlite import SqliteOptions, SqliteTransport

    opened = []


    def _open(url, event_type, options):
        opened.append((url, dict(options)))
        return SqliteTransport(SqliteOptions(path=":memory:"), event_type)


    backend = Backend(open=_open)
    """
)
BROKEN_MODULE = "not_a_backend = {'open': print}\n"
# A backend whose driver is not installed, as `postgresql://` is without its extra.
NEEDY_MODULE = "import dt_fake_driver_not_installed\n"
MODULES = ("dt_fake_backend", "dt_fake_broken", "dt_fake_needy")


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Write the distribution ``dt-fake-backend`` (two modules, a dist-info with METADATA
    and entry_points.txt) into a directory that is not yet on sys.path."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "dt_fake_backend.py").write_text(BACKEND_MODULE)
    (root / "dt_fake_broken.py").write_text(BROKEN_MODULE)
    (root / "dt_fake_needy.py").write_text(NEEDY_MODULE)
    info = root / "dt_fake_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dt-fake-backend\nVersion: 0.1\n"
        "Provides-Extra: fancy\n"
        'Requires-Dist: dt-fake-driver-not-installed>=1; extra == "fancy"\n'
    )
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        "fake = dt_fake_backend:backend\n"
        "broken = dt_fake_broken:not_a_backend\n"
        "needy = dt_fake_needy:backend\n"
    )
    (info / "RECORD").write_text("")
    yield root
    for module in MODULES:
        sys.modules.pop(module, None)
    importlib.invalidate_caches()


@pytest.fixture
def installed(fake_distribution: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake distribution, on sys.path."""
    monkeypatch.syspath_prepend(str(fake_distribution))  # also clears importlib's caches
    return fake_distribution


def test_installed_distribution_adds_a_scheme(
    fake_distribution: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UnknownBackend) as before:
        open_transport("fake://queue")
    assert "fake" not in before.value.known

    monkeypatch.syspath_prepend(str(fake_distribution))
    assert known_schemes()["fake"] == "dt_fake_backend:backend"
    with open_transport("fake://queue?size=3", colour="blue") as t:
        t.publish("g", Event(i=1))
        lease = t.claim("w", 30)
        assert lease is not None
        assert lease.event == Event(i=1)
    module = sys.modules["dt_fake_backend"]
    assert module.opened == [("fake://queue?size=3", {"colour": "blue"})]
    assert "dt_fake_broken" not in sys.modules, "an entry point not asked for was loaded"


def test_entry_point_that_is_not_a_backend_is_a_clear_type_error(installed: Path) -> None:
    entry = f"entry point broken = dt_fake_broken:not_a_backend in group {ENTRY_POINT_GROUP}"
    with pytest.raises(TypeError, match=re.escape(entry)) as info:
        open_transport("broken://queue")
    assert "is not a transports_core.Backend: {'open': <built-in function print>}" in str(
        info.value
    )


def test_backend_whose_driver_is_missing_names_the_extra_to_install(installed: Path) -> None:
    needs = "the 'needy' backend (dt_fake_needy:backend) needs 'dt_fake_driver_not_installed'"
    with pytest.raises(ImportError, match=re.escape(needs)) as info:
        open_transport("needy://queue")
    assert "pip install 'dt-fake-backend[fancy]'" in str(info.value)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_a_backend_names_its_optional_features_from_the_known_ones() -> None:
    import time

    from tests.core.broken_backends import MemoryStore
    from transports_core.backend import FEATURES, build_backend

    assert {"timers", "tenants", "group-control"} == FEATURES
    store = MemoryStore(time.time)
    opener = Backend(open=lambda url, event_type, options: store.open())
    assert opener.features == frozenset()
    built = build_backend(
        lambda url, options: url, lambda url, event_type: store.open(), features=FEATURES
    )
    assert built.features == FEATURES
    with pytest.raises(ValueError, match=r"unknown backend features \['cron'\]"):
        Backend(open=opener.open, features=frozenset({"cron", "timers"}))
