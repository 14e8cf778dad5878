"""Fixtures shared by the service tests: each directory's conftest says where its store is
(a ``queue_url`` fixture); `queue` opens a transport on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from transports_core import Event, Transport, open_transport


@pytest.fixture
def queue(queue_url: str) -> Iterator[Transport[Event]]:
    """A transport on the test's own queue, closed when the test ends."""
    with open_transport(queue_url) as transport:
        yield transport


# The properties of bad arguments: core refuses those before a call reaches the store.
_ARGUMENT_PROPERTIES = frozenset({"bad-input", "batch-bad-input-changes-nothing"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the bad-argument scenarios out of the suite's reruns over another way of
    reaching a backend (a class with ``same_arguments_as_direct``: TLS, Sentinel, a
    Cluster, PgBouncer). Which way a call would have gone changes nothing about what core
    refuses before sending it, and the direct runs hold every backend to them."""
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("conformance_property")
        rerun = getattr(getattr(item, "cls", None), "same_arguments_as_direct", False)
        if rerun and marker is not None and marker.args[0] in _ARGUMENT_PROPERTIES:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
