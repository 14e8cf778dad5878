"""`BlockingTransport`, through which the sync scenarios reach an async twin, shows the
twin's admin calls as methods of its class: Python 3.12 and later check a protocol
(``isinstance(t, TransportAdmin)``) on the class alone, where ``__getattr__`` is not
seen, and the suite decides from that check whether a backend has ``admin``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from transports_core import (
    AsyncTransportAdmin,
    Event,
    TransportAdmin,
    open_async_transport,
)
from transports_core.conformance import BlockingTransport, Portal


@pytest.fixture
def portal() -> Iterator[Portal]:
    portal = Portal()
    try:
        yield portal
    finally:
        portal.close()


def test_over_an_async_admin_transport_it_is_a_transport_admin(
    tmp_path: Path, portal: Portal
) -> None:
    opened = portal.call(lambda: open_async_transport(f"sqlite:///{tmp_path / 'q.db'}"))
    assert isinstance(opened, AsyncTransportAdmin)
    with BlockingTransport(portal, opened) as t:
        assert isinstance(t, TransportAdmin)
        # The admin calls are the class's own, each the blocking call of the twin's.
        assert {"stats", "pause_group", "tenants"} <= set(vars(type(t)))
        admin: Any = t
        t.publish("g", Event(n=1))
        assert admin.stats().ready == 1
        assert admin.pause_group("g") is True
        assert admin.paused_groups() == ["g"]


class _Plain:
    """An async transport without the admin calls: only what a wrapper would pass on."""

    async def publish(self, group_id: str, event: Event) -> int:
        return 1


def test_over_an_async_transport_without_admin_it_is_not_one(portal: Portal) -> None:
    t: BlockingTransport[Event] = BlockingTransport(portal, _Plain())  # type: ignore[arg-type]
    assert not isinstance(t, TransportAdmin)
    assert type(t) is BlockingTransport
