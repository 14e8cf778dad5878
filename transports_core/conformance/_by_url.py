"""The suite against the store at ``--transport-url``: what ``python -m
transports_core.conformance URL`` runs.

Its name does not start with ``test_``, so pytest collects it only when it is named on
the command line (the CLI passes ``--pyargs transports_core.conformance._by_url``). All
tests share the one store at the URL, which must start empty; each test drains it first
and, at the end, gives back what it holds and discards the dead letters it made. Time is
real (a backend opened by URL cannot be handed the suite's clock), so lapses are short
real sleeps. A URL is taken to name a durable store that several handles and processes
can open; a backend declares ``admin`` by implementing `TransportAdmin` on its transport,
as the admin interface says callers check, and the suite reads that declaration off the
first handle it opens. The optional features (``timers``, ``tenants``, ``group-control``)
are those its registered `Backend` names.
"""

from __future__ import annotations

import pytest

from transports_core import TransportAdmin, known_schemes, open_async_transport, open_transport
from transports_core._registry import FEATURES, _resolve, _scheme

from ._base import (
    ADMIN,
    DURABLE,
    MULTI_HANDLE,
    MULTIPROCESS,
    AsyncTransportFactory,
    SuiteBase,
    TransportFactory,
)
from ._suite import AsyncTransportSuite, TransportSuite

URL_CAPABILITIES = frozenset({DURABLE, MULTI_HANDLE, MULTIPROCESS})

# (URL, suite class) -> whether the handles it opens implement TransportAdmin.
_admin_seen: dict[tuple[str, str], bool] = {}


def _url(request: pytest.FixtureRequest) -> str:
    url = request.config.getoption("transport_url")
    if not isinstance(url, str) or not url:
        raise pytest.UsageError(
            f"{__name__} runs against --transport-url URL (known schemes: "
            f"{', '.join(known_schemes()) or 'none'})"
        )
    return url


class _AtUrl(SuiteBase):
    """What the backend at the URL declares: `URL_CAPABILITIES`, and ``admin`` when its
    transports implement `TransportAdmin` (checked on one handle, once per URL and twin;
    the async twin's handle is seen through `BlockingTransport`, which passes its admin
    methods on)."""

    capabilities = URL_CAPABILITIES
    shared_store = True
    # A URL says nothing of the connections its backend joins, so the command cannot open
    # one: the within scenarios skip, and the refusal takes any refusal.
    within_known = False

    def has(self, capability: str) -> bool:
        if capability in FEATURES:
            return capability in _resolve(_scheme(_url(self._request))).features
        if capability != ADMIN:
            return super().has(capability)
        key = (_url(self._request), type(self).__name__)
        if key not in _admin_seen:
            with self._factory() as probe:
                _admin_seen[key] = isinstance(probe, TransportAdmin)
        return _admin_seen[key]


class TestTransportAtUrl(_AtUrl, TransportSuite):
    @pytest.fixture
    def transport_url(self, request: pytest.FixtureRequest) -> str:
        return _url(request)

    @pytest.fixture
    def make_transport(self, transport_url: str) -> TransportFactory:
        return lambda **options: open_transport(transport_url, **options)


class TestAsyncTransportAtUrl(_AtUrl, AsyncTransportSuite):
    @pytest.fixture
    def transport_url(self, request: pytest.FixtureRequest) -> str:
        url = _url(request)
        if _resolve(_scheme(url)).open_async is None:
            pytest.skip(f"the backend for {_scheme(url)}:// declares no async twin")
        return url

    @pytest.fixture
    def make_async_transport(self, transport_url: str) -> AsyncTransportFactory:
        return lambda **options: open_async_transport(transport_url, **options)
