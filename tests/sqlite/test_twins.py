"""The sync and async SQLite transports are twins: same public methods, same signatures,
every async one a coroutine function, and each satisfies its protocol."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from transports_core import (
    AsyncTransport,
    AsyncTransportAdmin,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_sqlite import AsyncSqliteTransport, SqliteTransport


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


PUBLIC = sorted(_public(SqliteTransport))
CONTEXT_PAIRS = [("__enter__", "__aenter__"), ("__exit__", "__aexit__")]


def test_twins_have_the_same_public_methods() -> None:
    assert _public(SqliteTransport) == _public(AsyncSqliteTransport)


def test_twins_have_the_methods_of_the_protocols_and_nothing_else() -> None:
    assert _public(SqliteTransport) == _public(Transport) | _public(TransportAdmin)
    assert _public(AsyncSqliteTransport) == _public(AsyncTransport) | _public(AsyncTransportAdmin)
    assert not _public(Transport) & _public(TransportAdmin)


@pytest.mark.parametrize("name", PUBLIC)
def test_twin_methods_have_equal_signatures(name: str) -> None:
    sync = inspect.signature(getattr(SqliteTransport, name))
    assert sync == inspect.signature(getattr(AsyncSqliteTransport, name))
    protocols = (
        (Transport, AsyncTransport)
        if hasattr(Transport, name)
        else (
            TransportAdmin,
            AsyncTransportAdmin,
        )
    )
    for protocol in protocols:
        assert sync == inspect.signature(getattr(protocol, name))


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
        assert isinstance(sync, TransportAdmin)
    twin = open_async_transport(url)  # connects lazily: nothing to close yet
    assert isinstance(twin, AsyncSqliteTransport)
    assert isinstance(twin, AsyncTransport)
    assert isinstance(twin, AsyncTransportAdmin)
