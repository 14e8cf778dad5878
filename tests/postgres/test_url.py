"""URL and option parsing: the whitelist, libpq's forms, and no password in any message."""

from __future__ import annotations

import pytest

from transports_postgres import PostgresOptions
from transports_postgres._url import DEFAULT_SCHEMA, parse_url


def test_defaults_and_plain_url() -> None:
    options = parse_url("postgresql://app@db.example:5433/queues", {})
    assert options.schema == DEFAULT_SCHEMA
    assert options.conninfo == "postgresql://app@db.example:5433/queues"
    assert (options.pool_min_size, options.pool_max_size) == (1, 10)
    assert options.max_attempts is None
    assert options.on_dead == "release"
    assert options.server_clock
    # Every commit flushed, leases too, unless asked otherwise.
    assert (options.lease_commit, options.lease_synchronous_commit) == ("flush", None)


def test_our_options_are_taken_out_and_libpq_ones_kept() -> None:
    options = parse_url(
        "postgres://u@h/db?sslmode=disable&schema=orders&pool_max_size=3"
        "&max_attempts=5&on_dead=HOLD&application_name=x&lease_commit=async",
        {},
    )
    assert options.conninfo == "postgres://u@h/db?sslmode=disable&application_name=x"
    assert (options.schema, options.pool_max_size) == ("orders", 3)
    assert (options.max_attempts, options.on_dead) == (5, "hold")
    assert (options.lease_commit, options.lease_synchronous_commit) == ("async", "off")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql:///test?host=/var/run/postgresql",
        "postgresql://%2Fvar%2Frun%2Fpostgresql/test",
        "postgresql://h1:5432,h2:5433/test?target_session_attrs=read-write",
        "postgresql://[::1]:5432/test?connect_timeout=3",
    ],
)
def test_libpq_forms_are_accepted(url: str) -> None:
    assert parse_url(url, {}).conninfo == url


def test_keywords_are_typed_and_cannot_repeat_the_url() -> None:
    options = parse_url("postgresql://h/db", {"schema": "q2", "max_attempts": 2})
    assert (options.schema, options.max_attempts) == ("q2", 2)
    with pytest.raises(ValueError, match="both in the URL and as a keyword"):
        parse_url("postgresql://h/db?schema=a", {"schema": "b"})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://h/db", "malformed PostgreSQL URL"),
        ("postgresql://h/db#frag", "fragment"),
        ("postgresql://h/db?nosuch=1", "nosuch"),
        ("postgresql://h/db?schema=1bad", "schema must be a plain identifier"),
        ("postgresql://h/db?schema=pg_mine", "reserved by PostgreSQL"),
        ("postgresql://h/db?schema=a&schema=b", "given twice"),
        ("postgresql://h/db?pool_max_size=0", "pool_max_size must be"),
        ("postgresql://h/db?pool_min_size=5&pool_max_size=2", "must not exceed"),
        ("postgresql://h/db?pool_timeout=-1", "pool_timeout must be"),
        ("postgresql://h/db?max_attempts=0", "max_attempts must be"),
        ("postgresql://h/db?on_dead=drop", "on_dead must be"),
        ("postgresql://h/db?lease_commit=off", "lease_commit must be one of flush, async"),
        # libpq's own parameters, which libpq would check only as it connects.
        ("postgresql://h/db?connect_timeout=abc", "connect_timeout must be a number of seconds"),
        ("postgresql://h/db?connect_timeout=", "connect_timeout must be a number of seconds"),
        ("postgresql://h:99999/db", "port must be from 1 to 65535, got '99999'"),
        ("postgresql://h1:5432,h2:0/db", "port must be from 1 to 65535, got '0'"),
        ("postgresql://h/db?sslmode=bogus", "sslmode must be one of disable"),
        ("postgresql://h/db?target_session_attrs=x", "target_session_attrs must be one of any"),
        ("postgresql://h/db?listen_url=postgresql://h:70000/db", "listen_url .* port must be"),
    ],
)
def test_a_bad_url_is_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_url(url, {})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease_commit": False}, "lease_commit must be one of"),
        ({"nosuch": 1}, "unknown PostgreSQL option 'nosuch'"),
        ({"clock": 5}, "clock must be a callable"),
    ],
)
def test_a_bad_keyword_is_a_clear_error(options: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        parse_url("postgresql://h/db", options)


def test_a_password_is_never_shown() -> None:
    with pytest.raises(ValueError, match="nosuch") as caught:
        parse_url("postgresql://app:s3cret@h/db?nosuch=1", {})
    assert "s3cret" not in str(caught.value)
    assert "***" in str(caught.value)
    options = parse_url("postgresql://app:s3cret@h/db", {})
    assert "s3cret" not in repr(options)
    assert isinstance(options, PostgresOptions)
