"""Every backend's sync and async transports are twins: the methods of the protocols (and
the backend's own extras, named here), with equal signatures, every async one a
coroutine function."""

from __future__ import annotations

import inspect

import pytest

from transports_core import AsyncTransport, AsyncTransportAdmin, Transport, TransportAdmin
from transports_postgres import AsyncPostgresTransport, PostgresTransport
from transports_redis import AsyncRedisTransport, RedisTransport
from transports_sqlite import AsyncSqliteTransport, SqliteTransport

# backend -> (sync class, async class, public methods beyond the protocols)
TWINS: dict[str, tuple[type, type, set[str]]] = {
    "sqlite": (SqliteTransport, AsyncSqliteTransport, {"within"}),
    "postgres": (PostgresTransport, AsyncPostgresTransport, {"within"}),
    "redis": (RedisTransport, AsyncRedisTransport, {"check", "within"}),
}
# Plain methods in both twins: each returns a view (`Within`, `AsyncWithin`) whose calls
# are the twins' own, so only their parameters must agree.
VIEWS = {"within"}
CONTEXT_PAIRS = [("__enter__", "__aenter__"), ("__exit__", "__aexit__")]


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _methods() -> list[tuple[str, str]]:
    return [(backend, name) for backend, (sync, _, _) in TWINS.items() for name in _public(sync)]


def test_the_protocols_share_no_method() -> None:
    assert not _public(Transport) & _public(TransportAdmin)


@pytest.mark.parametrize("backend", TWINS)
def test_twins_have_the_methods_of_the_protocols_and_their_extras(backend: str) -> None:
    sync, twin, extras = TWINS[backend]
    assert _public(sync) == _public(Transport) | _public(TransportAdmin) | extras
    assert _public(twin) == _public(AsyncTransport) | _public(AsyncTransportAdmin) | extras


@pytest.mark.parametrize(("backend", "name"), _methods())
def test_twin_methods_have_equal_signatures_and_the_async_one_is_a_coroutine(
    backend: str, name: str
) -> None:
    sync, twin, extras = TWINS[backend]
    signature = inspect.signature(getattr(sync, name))
    if name in VIEWS:
        parameters = inspect.signature(getattr(twin, name)).parameters
        assert list(signature.parameters.values()) == list(parameters.values())
        assert not inspect.iscoroutinefunction(getattr(twin, name))
        return
    assert signature == inspect.signature(getattr(twin, name))
    assert inspect.iscoroutinefunction(getattr(twin, name))
    assert not inspect.iscoroutinefunction(getattr(sync, name))
    if name not in extras:
        protocols = (Transport, AsyncTransport) if hasattr(Transport, name) else (
            TransportAdmin,
            AsyncTransportAdmin,
        )
        for protocol in protocols:
            assert signature == inspect.signature(getattr(protocol, name))


@pytest.mark.parametrize("backend", TWINS)
@pytest.mark.parametrize(("sync_name", "async_name"), CONTEXT_PAIRS)
def test_context_manager_methods_pair_up(backend: str, sync_name: str, async_name: str) -> None:
    sync, twin, _ = TWINS[backend]
    assert inspect.signature(getattr(sync, sync_name)) == inspect.signature(
        getattr(twin, async_name)
    )
    assert inspect.iscoroutinefunction(getattr(twin, async_name))
