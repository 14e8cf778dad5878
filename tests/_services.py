"""Where the tests that need a PostgreSQL or Redis server find one, in this order:

1. the URL in the service's environment variable (``TRANSPORTS_POSTGRES_URL``,
   ``TRANSPORTS_REDIS_URL``), taken as given: if nothing answers there, the tests do not
   look elsewhere, since that is not the server they were told to use;
2. the server on the default local address;
3. a container started through testcontainers, where it is installed and a Docker engine
   answers: one per service and test session, stopped when the session ends;
4. none: the tests skip, with a message that says what was tried and how to run them. Under
   ``CI=true`` a missing server fails the run instead, so that CI never passes by skipping.

`look_up` makes that decision and returns it as a `Found`; `server_url` acts on it, once
per service and session. Each ``tests/<service>/server.py`` describes its service as a
`Service`; this module imports no driver, and testcontainers only on step 3.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from transports_core import redact_url

T = TypeVar("T")

__all__ = ["Found", "Service", "look_up", "scratch_fixture", "server_url", "with_query"]


@dataclass(frozen=True)
class Service:
    """A server the tests need, and how to reach one."""

    name: str  # for messages: "PostgreSQL"
    image: str  # the image testcontainers starts: "postgres:15"
    local_url: str  # the default local address
    # Whether a server answers at a URL: None if it does, else why not (no password in it).
    answers: Callable[[str], str | None]
    # Start a container of an image (testcontainers is installed and Docker answers):
    # the server's URL, and how to stop the container.
    start_container: Callable[[str], tuple[str, Callable[[], None]]]

    @property
    def variable(self) -> str:
        """The environment variable that names its URL, after the image: postgres:15 ->
        ``TRANSPORTS_POSTGRES_URL``."""
        return f"TRANSPORTS_{self.image.partition(':')[0].upper()}_URL"

    @property
    def url_form(self) -> str:
        """What such a URL looks like, for messages: the local one's scheme and parts."""
        parts = urlsplit(self.local_url)
        return f"{parts.scheme}://{'USER@' if parts.username else ''}HOST:PORT/DB"

    def url(self) -> str:
        """`server_url` of this service."""
        return server_url(self)

    @property
    def how(self) -> str:
        """How a contributor makes a server available, for the skip message."""
        return (
            f"set {self.variable}={self.url_form}, start a server at "
            f"{redact_url(self.local_url)}, or install testcontainers where a Docker engine runs"
        )


@dataclass(frozen=True)
class Found:
    """Where the tests of one service run, or why they cannot."""

    url: str | None  # the server's URL; None when there is none
    source: str  # where it was found: the variable's name, "local" or "testcontainers"
    problem: str = ""  # when url is None: what was tried, and how to run the tests
    fail: bool = False  # when url is None: fail the tests (CI=true) rather than skip them


def look_up(
    service: Service,
    environ: Mapping[str, str],
    container: Callable[[Service], tuple[str | None, str]] | None = None,
) -> Found:
    """Decide where ``service``'s tests run, given the environment ``environ``.

    ``container`` is step 3 (`from_container` unless given): it returns a URL, or None
    and the reason it could not start one.
    """
    fail = environ.get("CI") == "true"
    explicit = environ.get(service.variable)
    if explicit:
        problem = service.answers(explicit)
        if problem is None:
            return Found(explicit, service.variable)
        why = f"{service.variable}={redact_url(explicit)}, where {problem}"
        return Found(None, service.variable, _advice(service, why), fail)
    local_problem = service.answers(service.local_url)
    if local_problem is None:
        return Found(service.local_url, "local")
    url, container_problem = (container or from_container)(service)
    if url is not None:
        return Found(url, "testcontainers")
    why = (
        f"{service.variable} is not set; at {redact_url(service.local_url)}, "
        f"{local_problem}; {container_problem}"
    )
    return Found(None, "none", _advice(service, why), fail)


def _advice(service: Service, why: str) -> str:
    return f"no {service.name} server for these tests: {why}. To run them: {service.how}"


def from_container(service: Service) -> tuple[str | None, str]:
    """Step 3: ``service.start_container(service.image)``, where testcontainers can run
    it; the container is stopped when the process exits."""
    if importlib.util.find_spec("testcontainers") is None:
        return None, "testcontainers is not installed (pip install testcontainers)"
    try:
        # The Docker client that testcontainers itself uses, asked before any image is pulled.
        importlib.import_module("docker").from_env().ping()
    except Exception as exc:
        return None, f"no Docker engine answers for testcontainers ({_brief(exc)})"
    try:
        url, stop = service.start_container(service.image)
    except Exception as exc:
        return None, f"testcontainers could not start {service.image} ({_brief(exc)})"
    atexit.register(stop)
    return url, ""


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


@functools.cache
def _found(service: Service) -> Found:
    return look_up(service, os.environ)


def server_url(service: Service) -> str:
    """The URL of ``service``'s server for this session, or skip (fail under CI=true)."""
    found = _found(service)
    if found.url is not None:
        return found.url
    if found.fail:
        pytest.fail(found.problem)
    pytest.skip(found.problem)


def with_query(url: str, **query: object) -> str:
    """``url`` with ``query`` added to its query string (``?schema=t_1&pool_max_size=4``)."""
    pairs = "&".join(f"{key}={value}" for key, value in query.items())
    return f"{url}{'&' if urlsplit(url).query else '?'}{pairs}"


def scratch_fixture(name: str, scratch: Callable[[], AbstractContextManager[T]]) -> Any:
    """The pytest fixture ``name``: what ``scratch()`` enters (a schema, a queue of the
    test's own), left, so removed, when the test ends."""

    def fixture() -> Iterator[T]:
        with scratch() as value:
            yield value

    return pytest.fixture(fixture, name=name)
