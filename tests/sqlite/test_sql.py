"""`_sql.positional`: the hot statements are written with names and bound by position."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from transports_sqlite import _sql as sql


def test_each_name_becomes_its_place_wherever_it_stands() -> None:
    statement = sql.positional("SELECT :b, :a, :b + 1, :ab", "a", "b", "ab")
    assert statement == "SELECT ?2, ?1, ?2 + 1, ?3"
    with closing(sqlite3.connect(":memory:")) as conn:
        assert conn.execute(statement, (1, 10, 100)).fetchone() == (10, 1, 11, 100)


@pytest.mark.parametrize(
    "names",
    [("a",), ("a", "b", "c"), ("a", "b", "b"), ("b", "a", "a")],
    ids=["one missing", "one unused", "twice", "twice, all used"],
)
def test_names_must_be_exactly_the_parameters(names: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match=r"parameters \['a', 'b'\] of the statement"):
        sql.positional("SELECT :a, :b", *names)


def test_hot_statements_have_no_named_parameter_left() -> None:
    hot = (sql.PUBLISH, sql.CLAIM_READY, sql.ACK, sql.RELEASE, sql.EXTEND)
    for statement in hot:
        assert ":" not in statement, statement
        assert "?1" in statement, statement
