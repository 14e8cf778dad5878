"""`_sql.Statement`: each statement declares its parameters' names once; SQLite runs it
with a ``?`` for each place a name stands, bound from a tuple that the statement builds
from values given by name."""

from __future__ import annotations

import re
import sqlite3
import warnings
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from transports_core import Event
from transports_sqlite import SqliteOptions, SqliteTransport
from transports_sqlite import _sql as sql

STATEMENTS = {name: value for name, value in vars(sql).items() if isinstance(value, sql.Statement)}


def test_each_name_is_bound_wherever_it_stands() -> None:
    statement = sql.Statement("SELECT :b, :a, :b + 1, :ab", ("a", "b", "ab"), rows=True)
    assert statement.sql == "SELECT ?, ?, ? + 1, ?"
    values = statement.bind({"ab": 100, "b": 10, "a": 1})
    assert values == (10, 1, 10, 100)
    # A tuple in the order of the names (an executemany row) is spread the same way.
    assert statement.positional((1, 10, 100)) == values
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Python 3.12+ warns of ?N bound from a tuple
        with closing(sqlite3.connect(":memory:")) as conn:
            assert conn.execute(statement.sql, values).fetchone() == (10, 1, 11, 100)


def test_a_statement_whose_names_stand_once_in_order_binds_rows_as_they_are() -> None:
    statement = sql.Statement("SELECT :a, :b", ("a", "b"), rows=True)
    assert statement.spread is None
    assert statement.positional((1, 2)) == (1, 2)


@pytest.mark.parametrize(
    ("names", "bound"), [((), ()), (("a",), (1,))], ids=["no parameter", "one parameter"]
)
def test_a_statement_with_fewer_than_two_parameters_still_binds_a_tuple(
    names: tuple[str, ...], bound: tuple[int, ...]
) -> None:
    statement = sql.Statement("SELECT " + (":a" if names else "1"), names, rows=True)
    assert statement.bind({"a": 1}) == bound


@pytest.mark.parametrize(
    "names",
    [("a",), ("a", "b", "c"), ("a", "b", "b"), ("b", "a", "a")],
    ids=["one missing", "one unused", "twice", "twice, all used"],
)
def test_names_must_be_exactly_the_parameters(names: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match=r"parameters \['a', 'b'\] of the statement"):
        sql.Statement("SELECT :a, :b", names)


def test_a_value_missing_by_name_is_refused() -> None:
    with pytest.raises(KeyError, match="worker_id"):
        sql.ACK.bind({"group_id": "g", "seq": 1, "attempt": 1})


def test_every_statement_runs_with_plain_placeholders_only() -> None:
    assert len(STATEMENTS) > 40, sorted(STATEMENTS)  # the search found them all
    for name, statement in STATEMENTS.items():
        assert ":" not in statement.sql.replace("::", ""), name
        assert not re.search(r"\?\d", statement.sql), name
        assert statement.sql.count("?") == len(statement.places), name


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    path: Path = tmp_path_factory.mktemp("sql") / "q.db"
    SqliteTransport[Event](SqliteOptions(str(path))).close()
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        yield connection


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_a_statement_says_whether_it_returns_rows(conn: sqlite3.Connection, name: str) -> None:
    # Run on the real schema, and undone: whether SQLite gives result columns is what
    # decides if the runner must fetch (a write's RETURNING rows complete it).
    statement = STATEMENTS[name]
    conn.execute("BEGIN")
    try:
        cursor = conn.execute(statement.sql, (1,) * len(statement.places))
        returns = cursor.description is not None
        cursor.close()
    finally:
        conn.execute("ROLLBACK")
    assert returns == statement.rows, name


@pytest.mark.parametrize(
    ("synchronous", "memory", "mode"),
    [("full", False, "delete"), ("normal", False, "wal"), ("extra", True, "memory")],
)
def test_session_pragmas_say_whether_they_return_rows(
    synchronous: str, memory: bool, mode: str
) -> None:
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        for statement in sql.session_pragmas(synchronous, memory, mode):
            cursor = conn.execute(statement.sql)
            assert (cursor.description is not None) == statement.rows, statement.text
