"""The conformance suite: the definition of what a transport is, as pytest scenarios that
any backend runs from one short test file.

    from transports_core.conformance import TransportFactory, TransportSuite

    class TestMine(TransportSuite):
        capabilities = {"durable", "multi-handle"}

        @pytest.fixture
        def make_transport(self, tmp_path) -> TransportFactory:
            return lambda: open_transport(f"mine:///{tmp_path / 'q'}")

Or from the command line: ``python -m transports_core.conformance URL``. Needs pytest and
hypothesis (the ``conformance`` extra). See docs/conformance.md.
"""

from __future__ import annotations

import pytest

# Before the submodules are imported, so that their asserts explain failures.
pytest.register_assert_rewrite(__name__)

from ._base import (  # noqa: E402
    CAPABILITIES,
    CLOCK,
    DURABLE,
    MULTI_HANDLE,
    MULTIPROCESS,
    AsyncTransportFactory,
    ManualClock,
    TransportFactory,
)
from ._blocking import BlockingTransport, Portal  # noqa: E402
from ._model import ReferenceModel  # noqa: E402
from ._properties import PROPERTIES  # noqa: E402
from ._suite import AsyncTransportSuite, TransportSuite  # noqa: E402

__all__ = [
    "CAPABILITIES",
    "CLOCK",
    "DURABLE",
    "MULTIPROCESS",
    "MULTI_HANDLE",
    "PROPERTIES",
    "AsyncTransportFactory",
    "AsyncTransportSuite",
    "BlockingTransport",
    "ManualClock",
    "Portal",
    "ReferenceModel",
    "TransportFactory",
    "TransportSuite",
]
