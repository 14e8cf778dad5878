"""The sync and async SQLite transports each satisfy their runtime-checkable protocols.
(That their surfaces are twins is checked for every backend in ``tests/test_twins.py``.)"""

from __future__ import annotations

from pathlib import Path

from transports_core import (
    AsyncTransport,
    AsyncTransportAdmin,
    Transport,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_sqlite import AsyncSqliteTransport, SqliteTransport


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
