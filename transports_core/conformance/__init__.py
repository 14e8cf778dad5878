"""The conformance suite: the definition of what a transport is, as pytest scenarios that
any backend runs from one short test file.

    from transports_core.conformance import TransportFactory, TransportSuite

    class TestMine(TransportSuite):
        capabilities = {"durable", "multi-handle"}

        @pytest.fixture
        def make_transport(self, tmp_path) -> TransportFactory:
            return lambda **options: open_transport(f"mine:///{tmp_path / 'q'}", **options)

Or from the command line: ``python -m transports_core.conformance URL``. The suite needs
pytest; only its model-based scenario needs hypothesis (the ``conformance`` extra), and it
skips without it. See docs/conformance.md.

Importing this package imports nothing of the suite and not pytest either: the
``pytest11`` plugin (``plugin.py``) lives inside it, so this file runs in every pytest run
wherever the library is installed, and spawned contention workers and the journal's users
import through it too. Each name below is imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

# Under pytest, rewrite the suite's asserts so their failures explain themselves. Only
# when pytest is already running: importing it here would load it into every worker.
if "pytest" in sys.modules:
    sys.modules["pytest"].register_assert_rewrite(__name__)

if TYPE_CHECKING:
    from ._base import (
        ADMIN,
        CAPABILITIES,
        CLOCK,
        CONTROL,
        DURABLE,
        MULTI_HANDLE,
        MULTIPROCESS,
        PARALLEL_CLAIMS,
        TENANTS,
        TIMERS,
        WITHIN,
        AsyncJoinFactory,
        AsyncJoinSession,
        AsyncTransportFactory,
        JoinFactory,
        JoinSession,
        ManualClock,
        TransportFactory,
    )
    from ._blocking import BlockingTransport, Portal
    from ._model import ReferenceModel
    from ._properties import PROPERTIES
    from ._suite import AsyncTransportSuite, TransportSuite

# name -> the private module that defines it
_WHERE = {
    "ADMIN": "_base",
    "CAPABILITIES": "_base",
    "CLOCK": "_base",
    "CONTROL": "_base",
    "DURABLE": "_base",
    "MULTIPROCESS": "_base",
    "MULTI_HANDLE": "_base",
    "PARALLEL_CLAIMS": "_base",
    "TENANTS": "_base",
    "TIMERS": "_base",
    "WITHIN": "_base",
    "AsyncJoinFactory": "_base",
    "AsyncJoinSession": "_base",
    "AsyncTransportFactory": "_base",
    "JoinFactory": "_base",
    "JoinSession": "_base",
    "ManualClock": "_base",
    "TransportFactory": "_base",
    "BlockingTransport": "_blocking",
    "Portal": "_blocking",
    "ReferenceModel": "_model",
    "PROPERTIES": "_properties",
    "AsyncTransportSuite": "_suite",
    "TransportSuite": "_suite",
}

__all__ = [
    "ADMIN",
    "CAPABILITIES",
    "CLOCK",
    "CONTROL",
    "DURABLE",
    "MULTIPROCESS",
    "MULTI_HANDLE",
    "PARALLEL_CLAIMS",
    "PROPERTIES",
    "TENANTS",
    "TIMERS",
    "WITHIN",
    "AsyncJoinFactory",
    "AsyncJoinSession",
    "AsyncTransportFactory",
    "AsyncTransportSuite",
    "BlockingTransport",
    "JoinFactory",
    "JoinSession",
    "ManualClock",
    "Portal",
    "ReferenceModel",
    "TransportFactory",
    "TransportSuite",
]


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
