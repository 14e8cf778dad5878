"""Values never become SQL, secrets never reach messages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from transports_core import Event, TransportAdmin, open_async_transport, open_transport

NASTY = [
    "'; DROP TABLE messages; --",
    'Robert"); DELETE FROM groups WHERE ("1"="1',
    "a\x00b\x00",
    '\\"\\u0000{}[]:,',
    "%_*?$1:name@param",
    "𝄞🎉\U0010fffd",
    "é" * 1_000_000,
]


def _group(value: str) -> str:
    """``value`` as a group id a publish takes: at most 512 characters and no NUL, which
    every backend refuses (PostgreSQL's text cannot hold one); events carry any text."""
    return value.replace("\x00", "\\x00")[:512]


def test_hostile_group_ids_and_payloads_come_back_exactly(tmp_path: Path) -> None:
    with open_transport(f"sqlite:///{tmp_path / 'q.db'}") as transport:
        assert isinstance(transport, TransportAdmin)
        sent = [(_group(value), Event(text=value, key=value[:50])) for value in NASTY]
        for group, event in sent:
            transport.publish(group, event)
        got = []
        while (lease := transport.claim("w'; --", 30)) is not None:
            got.append((lease.group_id, lease.event))
            assert lease.worker_id == "w'; --"
            transport.ack(lease)
        assert got == sent
        assert transport.stats().ready == 0
        assert transport.purge_group("' OR '1'='1") == 0


def test_async_twin_round_trips_hostile_values(tmp_path: Path) -> None:
    async def main() -> list[tuple[str, str]]:
        async with open_async_transport(f"sqlite:///{tmp_path / 'q.db'}") as transport:
            await transport.publish_many((_group(v), Event(text=v), 0) for v in NASTY)
            got = []
            while (lease := await transport.claim("w", 30)) is not None:
                got.append((lease.group_id, lease.event.text))
                await transport.ack(lease)
            return got

    assert asyncio.run(main()) == [(_group(v), v) for v in NASTY]


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://admin:s3cret-pw@host/q.db",
        "sqlite://:s3cret-pw@/q.db#frag",
        "nosuchscheme-typo://admin:s3cret-pw@host/q",
    ],
)
def test_errors_never_show_a_url_password(url: str) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - any error, as long as it is clean
        open_transport(url)
    assert "s3cret-pw" not in str(caught.value)
    assert "s3cret-pw" not in repr(caught.value)


def test_repr_names_the_file_only(tmp_path: Path) -> None:
    with open_transport(f"sqlite:///{tmp_path / 'q.db'}?busy_timeout=100") as transport:
        assert repr(transport) == f"<SqliteTransport sqlite:///{tmp_path / 'q.db'}>"
