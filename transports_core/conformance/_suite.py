"""The suite classes a backend subclasses, composed from the topic mixins.

`TransportSuite` holds every sync scenario. `AsyncTransportSuite` runs the same scenarios
against the async twin, through `BlockingTransport`, and adds the async-only ones.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from ._admin import AdminScenarios
from ._async_native import AsyncNativeScenarios
from ._base import AsyncJoinFactory, AsyncTransportFactory, JoinFactory, TransportFactory
from ._batches import BatchScenarios
from ._blocking import BlockingSession, BlockingTransport, Portal
from ._bury import BuryScenarios
from ._claim import ClaimScenarios
from ._contention import ContentionScenarios
from ._control import ControlScenarios
from ._edges import EdgeScenarios
from ._keys import KeyScenarios
from ._lifecycle import LifecycleScenarios
from ._publish import PublishScenarios
from ._settle import SettleScenarios
from ._stateful import ModelScenarios
from ._tenants import TenantScenarios
from ._timers import TimerScenarios
from ._wait import WaitScenarios
from ._within import WithinScenarios

__all__ = ["AsyncTransportSuite", "TransportSuite"]


class TransportSuite(
    PublishScenarios,
    ClaimScenarios,
    SettleScenarios,
    LifecycleScenarios,
    ContentionScenarios,
    WaitScenarios,
    BuryScenarios,
    AdminScenarios,
    EdgeScenarios,
    KeyScenarios,
    WithinScenarios,
    TimerScenarios,
    ControlScenarios,
    TenantScenarios,
    BatchScenarios,
    ModelScenarios,
):
    """Every scenario of the contract, for a sync `Transport`.

    Subclass it (the name must start with ``Test``), override the ``make_transport``
    fixture, and declare ``capabilities``::

        class TestMyBackend(TransportSuite):
            capabilities = {"clock", "durable", "multi-handle"}

            @pytest.fixture
            def make_transport(self, tmp_path, clock) -> TransportFactory:
                url = f"mine:///{tmp_path}"
                return lambda **options: open_transport(url, clock=clock, **options)
    """


class AsyncTransportSuite(AsyncNativeScenarios, TransportSuite):
    """Every scenario of `TransportSuite` against an `AsyncTransport`, plus the async-only
    ones. Override ``make_async_transport`` instead of ``make_transport`` (and, with the
    ``within`` capability, ``join_async_session`` instead of ``join_session``)."""

    _async_twin: ClassVar[bool] = True

    @pytest.fixture
    def make_transport(
        self, make_async_transport: AsyncTransportFactory, _conformance_portal: Portal
    ) -> TransportFactory:
        def factory(**options: object) -> BlockingTransport[object]:
            return BlockingTransport(
                _conformance_portal,
                _conformance_portal.call(lambda: make_async_transport(**options)),
            )

        return factory

    @pytest.fixture
    def join_async_session(self) -> AsyncJoinFactory:
        """Override with the ``within`` capability: a coroutine function that opens an
        async connection of the caller's own to the test's store and begins a
        transaction on it (see `AsyncJoinSession`)."""
        pytest.fail(
            f"{type(self).__name__} declares 'within' but does not override the "
            "join_async_session fixture"
        )

    @pytest.fixture
    def join_session(
        self, join_async_session: AsyncJoinFactory, _conformance_portal: Portal
    ) -> JoinFactory:
        return lambda: BlockingSession(_conformance_portal, join_async_session)
