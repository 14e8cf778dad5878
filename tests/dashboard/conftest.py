"""Fixtures of the dashboard tests: a live queue on each backend, reached with a URL that
carries a password (which no page may show), and one headless browser per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from selenium import webdriver

from tests.postgres.server import fresh_schema, with_schema
from tests.redis.server import fresh_queue, with_queue

from ._browser import start_browser

# Neither local server checks it (trust, no requirepass), so any password reaches them.
PASSWORD = "s3cret-dashboard-pw"


def with_password(url: str) -> tuple[str, str]:
    """``url`` with a password, and that password (the URL's own, if it has one)."""
    parts = urlsplit(url)
    if parts.password:
        return url, parts.password
    user = parts.username or ("postgres" if parts.scheme.startswith("postgres") else "default")
    netloc = f"{user}:{PASSWORD}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc)), PASSWORD


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(a URL of the test's own queue, the password in it or None), removed afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'queue.db'}", None
    elif request.param == "postgres":
        with fresh_schema("td") as (server, schema):
            url, password = with_password(server)
            yield with_schema(url, schema), password
    else:
        with fresh_queue("td") as (server, queue):
            url, password = with_password(server)
            yield with_queue(url, queue), password


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()
