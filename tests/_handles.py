"""Opening transports in a test: every handle a fixture opens is closed when it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from transports_core import Transport, open_transport

T = TypeVar("T", bound=Transport[Any])


@contextmanager
def handles(url: str, kind: type[T], **defaults: Any) -> Iterator[Callable[..., T]]:
    """A function that opens a transport of ``kind`` on ``url`` with ``defaults``, which its
    keywords override; every transport it opened is closed on leaving."""
    opened: list[T] = []

    def open_(**options: Any) -> T:
        transport = open_transport(url, **(defaults | options))
        assert isinstance(transport, kind)
        opened.append(transport)
        return transport

    try:
        yield open_
    finally:
        for transport in reversed(opened):
            transport.close()
