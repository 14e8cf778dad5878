"""The suite classes a backend subclasses, composed from the topic mixins.

`TransportSuite` holds every sync scenario. `AsyncTransportSuite` runs the same scenarios
against the async twin, through `BlockingTransport`, and adds the async-only ones.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from ._admin import AdminScenarios
from ._async_native import AsyncNativeScenarios
from ._base import AsyncTransportFactory, TransportFactory
from ._blocking import BlockingTransport, Portal
from ._bury import BuryScenarios
from ._claim import ClaimScenarios
from ._contention import ContentionScenarios
from ._edges import EdgeScenarios
from ._keys import KeyScenarios
from ._lifecycle import LifecycleScenarios
from ._publish import PublishScenarios
from ._settle import SettleScenarios
from ._stateful import ModelScenarios
from ._wait import WaitScenarios

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
    ones. Override ``make_async_transport`` instead of ``make_transport``."""

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
