"""Durability on a private ``redis-server --appendonly yes --appendfsync always``: under load
from several processes it is SIGKILLed and restarted, and then nothing a publish returned
from is lost, nothing an ack returned from comes back, and the structures are sound."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests._children import until_stopped
from transports_core import open_transport
from transports_redis import RedisTransport

from . import _workers
from .server import private_server, with_queue

PROCESSES = 3


@pytest.mark.slow
def test_a_sigkilled_aof_server_loses_nothing_that_returned(tmp_path: Path) -> None:
    with private_server() as server:
        url = with_queue(server.url, "durable")
        with until_stopped(_workers.churn, url, tmp_path, PROCESSES) as journals:
            # Every child is at work (a child still starting when the server goes down
            # could not even open its transport), and 300 calls have returned.
            for journal in journals:
                _until_lines([journal], 20)
            _until_lines(journals, 300)
            server.kill()
            time.sleep(0.3)
            server.start()
            written = _count_lines(journals)
            _until_lines(journals, written + 300)

        published: dict[int, str] = {}
        acked: set[int] = set()
        maybe: set[int] = set()  # acks cut off by the crash: they may have taken effect
        for journal in journals:
            for line in journal.read_text().splitlines():
                kind, seq, *rest = line.split()
                if kind == "P":
                    published[int(seq)] = rest[0]
                else:
                    (acked if kind == "A" else maybe).add(int(seq))
        assert len(maybe) <= PROCESSES  # only a call in flight at the kill is cut off
        assert len(published) >= 250  # about half the 600 lines written
        drained: set[int] = set()
        with open_transport(url) as transport:
            assert isinstance(transport, RedisTransport)
            assert transport.check() == []
            while (lease := transport.claim("drain", 30, wait=3)) is not None:
                assert lease.seq not in acked, f"acked message {lease.seq} came back"
                drained.add(lease.seq)
                transport.ack(lease)
            assert transport.check() == []
        lost = set(published) - acked - drained - maybe
        assert not lost, f"published messages lost: {sorted(lost)[:10]}"


def _count_lines(journals: list[Path]) -> int:
    return sum(j.read_text().count("\n") for j in journals if j.exists())


def _until_lines(journals: list[Path], lines: int) -> None:
    deadline = time.monotonic() + 60
    while _count_lines(journals) < lines:
        assert time.monotonic() < deadline, "the children stopped making progress"
        time.sleep(0.05)
