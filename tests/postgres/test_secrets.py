"""A password, wherever the PostgreSQL URL carries it (user info, ``?password=``, libpq's
``sslpassword``, inside ``listen_url``), is blanked wherever the URL is shown: the
transport's repr, its errors, and the command's output. The test server trusts every
connection, so it accepts any password."""

from __future__ import annotations

import uuid
from urllib.parse import quote, urlsplit

import pytest

from tests.cli._command import transports
from transports_core import Event, TransportError, open_transport

from .server import fresh_schema, server_url

SECRET = "s3cretXYZ"


def _forms(server: str, schema: str) -> list[str]:
    parts = urlsplit(server)
    user = parts.username or "postgres"
    host = f"{parts.hostname}:{parts.port or 5432}"
    base = f"postgresql://{user}@{host}{parts.path}"
    direct = quote(f"postgresql://{user}:{SECRET}@{host}{parts.path}", safe="")
    return [
        f"postgresql://{user}:{SECRET}@{host}{parts.path}?schema={schema}",
        f"{base}?schema={schema}&password={SECRET}",
        f"{base}?password={quote(SECRET + '&x')}&schema={schema}",
        f"{base}?schema={schema}&listen_url={direct}",
    ]


@pytest.mark.parametrize("form", range(4))
def test_no_password_in_the_repr_or_errors_of_a_transport(form: int) -> None:
    with fresh_schema("sec") as (server, schema):
        url = _forms(server, schema)[form]
        queue = open_transport(url)
        shown = repr(queue)
        queue.close()
        with pytest.raises(TransportError) as info:
            queue.publish("g", Event(n=1))
    assert schema in shown
    assert SECRET not in shown
    assert "***" in shown
    assert SECRET not in str(info.value)


def test_no_password_in_the_error_of_a_wrong_database() -> None:
    server = server_url()
    url = f"{server.rsplit('/', 1)[0]}/nodb_{uuid.uuid4().hex[:8]}?password={SECRET}"
    with pytest.raises(TransportError) as info:
        open_transport(url)
    assert "does not exist" in str(info.value)
    assert SECRET not in str(info.value)
    assert "password=***" in str(info.value)


@pytest.mark.parametrize("form", range(4))
def test_no_password_in_the_commands_output(form: int) -> None:
    with fresh_schema("sec") as (server, schema):
        url = _forms(server, schema)[form]
        result = transports("inspect", url)
        as_json = transports("inspect", url, "--json")
    assert result.returncode == 0, result.stderr
    assert as_json.returncode == 0, as_json.stderr
    assert "***" in result.stdout
    for out in (result, as_json):
        assert SECRET not in out.stdout + out.stderr
