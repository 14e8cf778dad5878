"""A backend whose error message repeats the URL it was given, password and all: the
command must still print none of the password. In process, through the same `run` the
console script calls, because no shipped backend is this careless."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from transports_cli._app import run
from transports_core import Backend, Transport, register_backend


def _careless_open(
    url: str, event_type: object, options: Mapping[str, object]
) -> Transport[object]:
    raise ConnectionError(f"cannot reach {url} (password rejected for {url.split('@')[0]}@)")


@pytest.fixture
def careless() -> Iterator[str]:
    register_backend("careless", Backend(open=_careless_open))
    yield "careless"
    register_backend("careless", None)


@pytest.mark.parametrize("debug", [[], ["--debug"]])
@pytest.mark.parametrize("password", ["hunter22secret", "p%40ss:w0rd"])
def test_a_backend_message_with_the_password_is_scrubbed(
    careless: str, password: str, debug: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = run([*debug, "demo", f"{careless}://bob:{password}@db.example/q"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "cannot reach careless://bob:***@db.example/q" in err
    assert password not in out + err
    assert "p@ss:w0rd" not in out + err
