"""``transports backends`` lists what resolves here, from the real entry points."""

from __future__ import annotations

import json

from ._command import transports


def test_backends_lists_sqlite_with_its_origin() -> None:
    result = transports("backends")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["scheme", "origin", "distribution", "async", "status"]
    sqlite = next(row.split() for row in rows if row.startswith("sqlite "))
    assert sqlite[1] == "transports_sqlite:backend"
    assert sqlite[2] == "durable-transports"
    assert sqlite[-2:] == ["yes", "ok"]


def test_backends_json_lists_sqlite_with_an_async_twin() -> None:
    result = transports("backends", "--json")
    assert result.returncode == 0, result.stderr
    found = {entry["scheme"]: entry for entry in json.loads(result.stdout)}
    assert found["sqlite"] == {
        "scheme": "sqlite",
        "origin": "transports_sqlite:backend",
        "distribution": "durable-transports",
        "version": found["sqlite"]["version"],
        "sync": True,
        "async": True,
        "error": None,
    }
