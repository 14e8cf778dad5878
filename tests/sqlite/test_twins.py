"""The sync and async SQLite transports are twins: same public methods, same signatures,
every async one a coroutine function, and each satisfies its protocol."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from transports_core import AsyncTransport, Transport, open_async_transport, open_transport
from transports_sqlite import AsyncSqliteTransport, SqliteTransport


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


PUBLIC = sorted(_public(SqliteTransport))
CONTEXT_PAIRS = [("__enter__", "__aenter__"), ("__exit__", "__aexit__")]


def test_twins_have_the_same_public_methods() -> None:
    assert _public(SqliteTransport) == _public(AsyncSqliteTransport)


def test_twins_have_the_methods_of_the_protocols() -> None:
    assert _public(SqliteTransport) == _public(Transport)
    assert _public(AsyncSqliteTransport) == _public(AsyncTransport)
    assert PUBLIC == ["ack", "claim", "close", "extend", "nack", "publish", "publish_many"]


@pytest.mark.parametrize("name", PUBLIC)
def test_twin_methods_have_equal_signatures(name: str) -> None:
    sync = inspect.signature(getattr(SqliteTransport, name))
    assert sync == inspect.signature(getattr(AsyncSqliteTransport, name))
    assert sync == inspect.signature(getattr(Transport, name))
    assert sync == inspect.signature(getattr(AsyncTransport, name))


@pytest.mark.parametrize(("sync_name", "async_name"), CONTEXT_PAIRS)
def test_context_manager_methods_pair_up(sync_name: str, async_name: str) -> None:
    assert inspect.signature(getattr(SqliteTransport, sync_name)) == inspect.signature(
        getattr(AsyncSqliteTransport, async_name)
    )
    assert inspect.iscoroutinefunction(getattr(AsyncSqliteTransport, async_name))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_async_method_is_a_coroutine_function(name: str) -> None:
    assert inspect.iscoroutinefunction(getattr(AsyncSqliteTransport, name))
    assert not inspect.iscoroutinefunction(getattr(SqliteTransport, name))


def test_both_satisfy_their_runtime_checkable_protocols(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with open_transport(url) as sync:
        assert isinstance(sync, SqliteTransport)
        assert isinstance(sync, Transport)
    twin = open_async_transport(url)  # connects lazily: nothing to close yet
    assert isinstance(twin, AsyncSqliteTransport)
    assert isinstance(twin, AsyncTransport)
