"""The suite against the store at ``--transport-url``: what ``python -m
transports_core.conformance URL`` runs.

Its name does not start with ``test_``, so pytest collects it only when it is named on
the command line (the CLI passes ``--pyargs transports_core.conformance._by_url``). All
tests share the one store at the URL, which must start empty; each test drains it first
and gives back what it holds at the end. Time is real (a backend opened by URL cannot be
handed the suite's clock), so lapses are short real sleeps. A URL is taken to name a
durable store that several handles and processes can open.
"""

from __future__ import annotations

import pytest

from transports_core import known_schemes, open_async_transport, open_transport
from transports_core._registry import _resolve, _scheme

from ._base import DURABLE, MULTI_HANDLE, MULTIPROCESS, AsyncTransportFactory, TransportFactory
from ._suite import AsyncTransportSuite, TransportSuite

URL_CAPABILITIES = frozenset({DURABLE, MULTI_HANDLE, MULTIPROCESS})


def _url(request: pytest.FixtureRequest) -> str:
    url = request.config.getoption("transport_url")
    if not isinstance(url, str) or not url:
        raise pytest.UsageError(
            f"{__name__} runs against --transport-url URL (known schemes: "
            f"{', '.join(known_schemes()) or 'none'})"
        )
    return url


class TestTransportAtUrl(TransportSuite):
    capabilities = URL_CAPABILITIES
    shared_store = True

    @pytest.fixture
    def transport_url(self, request: pytest.FixtureRequest) -> str:
        return _url(request)

    @pytest.fixture
    def make_transport(self, transport_url: str) -> TransportFactory:
        return lambda **options: open_transport(transport_url, **options)


class TestAsyncTransportAtUrl(AsyncTransportSuite):
    capabilities = URL_CAPABILITIES
    shared_store = True

    @pytest.fixture
    def transport_url(self, request: pytest.FixtureRequest) -> str:
        url = _url(request)
        if _resolve(_scheme(url)).open_async is None:
            pytest.skip(f"the backend for {_scheme(url)}:// declares no async twin")
        return url

    @pytest.fixture
    def make_async_transport(self, transport_url: str) -> AsyncTransportFactory:
        return lambda **options: open_async_transport(transport_url, **options)
