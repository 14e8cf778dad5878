"""The argument checks every backend shares: each bad value is named in the error."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from transports_core import Event, Lease, Message, Settlement
from transports_core._validate import MAX_COUNT, MAX_GROUP_ID, check_text, check_unicode
from transports_core.backend import (
    MAX_PRIORITY,
    check_count,
    check_delay,
    check_group_id,
    check_item,
    check_items,
    check_key,
    check_lease,
    check_limit,
    check_max_attempts,
    check_on_dead,
    check_priority,
    check_reason,
    check_seq,
    check_tenant,
    check_visibility,
    check_wait,
    check_worker_id,
)

NAN, INF = float("nan"), float("inf")
LEASE = Lease(1, "g", Event(), "w", 1, 0.0)
BIG = 2**63  # one more than every store's largest integer


def forged(**fields: Any) -> Lease[Event]:
    """`LEASE` with ``fields`` replaced, whatever their types: a lease made by hand."""
    return replace(LEASE, **fields)


REFUSED: list[tuple[Callable[[object], object], object, type[Exception], str]] = [
    (check_priority, -1, ValueError, "priority must be from 0 to 4, got -1"),
    (check_priority, 5, ValueError, "priority must be from 0 to 4, got 5"),
    (check_priority, True, TypeError, "priority must be an int from 0 to 4, got True"),
    (check_priority, False, TypeError, "got False"),
    (check_priority, 1.0, TypeError, "got 1.0"),
    (check_priority, "2", TypeError, "got '2'"),
    (check_priority, None, TypeError, "got None"),
    (check_group_id, "", ValueError, "group_id must not be empty"),
    (check_group_id, 3, TypeError, "group_id must be a str, not int: 3"),
    (check_group_id, b"g", TypeError, "not bytes: b'g'"),
    (check_group_id, None, TypeError, "not NoneType: None"),
    (check_worker_id, "__parked__", ValueError, "worker_id '__parked__' is reserved"),
    (check_worker_id, "__", ValueError, "ids beginning with '__' belong to the transport"),
    (check_worker_id, "__anything", ValueError, "worker_id '__anything' is reserved"),
    (check_wait, -1, ValueError, "wait must be >= 0 seconds, got -1"),
    (check_wait, NAN, ValueError, "wait must be finite, got nan"),
    (check_wait, "1", TypeError, "wait must be a number of seconds, got '1'"),
    (check_wait, True, TypeError, "got True"),
    (check_reason, "", ValueError, "reason must not be empty"),
    (check_reason, "  ", ValueError, "reason must not be empty"),
    (check_reason, 3, TypeError, "reason must be a str, not int: 3"),
    (check_reason, "x" * 1001, ValueError, "at most 1000 characters, got 1001"),
    (check_max_attempts, 0, ValueError, "max_attempts must be a whole number >= 1, got 0"),
    (check_max_attempts, "x", ValueError, "got 'x'"),
    (check_max_attempts, True, ValueError, "got True"),
    (check_on_dead, "drop", ValueError, "on_dead must be one of release, hold, got 'drop'"),
    (check_on_dead, None, ValueError, "got None"),
    (check_worker_id, "", ValueError, "worker_id must not be empty"),
    (check_worker_id, 7, TypeError, "worker_id must be a str, not int: 7"),
    (check_visibility, 0, ValueError, "visibility must be > 0 seconds, got 0"),
    (check_visibility, -0.5, ValueError, "got -0.5"),
    (check_visibility, NAN, ValueError, "visibility must be finite, got nan"),
    (check_visibility, INF, ValueError, "visibility must be finite, got inf"),
    (check_visibility, -INF, ValueError, "got -inf"),
    (check_visibility, True, TypeError, "visibility must be a number of seconds, got True"),
    (check_visibility, "30", TypeError, "got '30'"),
    (check_delay, -1, ValueError, "delay must be >= 0 seconds, got -1"),
    (check_delay, -0.001, ValueError, "got -0.001"),
    (check_delay, NAN, ValueError, "delay must be finite, got nan"),
    (check_delay, INF, ValueError, "got inf"),
    (check_delay, None, TypeError, "delay must be a number of seconds, got None"),
    (check_lease, (1, "g"), TypeError, "expected a Lease, got tuple: (1, 'g')"),
    (check_lease, None, TypeError, "expected a Lease, got NoneType"),
    (check_lease, {"seq": 1}, TypeError, "got dict: {'seq': 1}"),
    (
        check_lease,
        Lease(1, "g", Event(), "__parked__", 1, 0.0),
        ValueError,
        "lease worker_id '__parked__' is reserved",
    ),
    # A lease's fields reach the store's statements: each is checked, and named.
    (check_lease, forged(worker_id=5), TypeError, "lease worker_id must be a str, not int: 5"),
    (check_lease, forged(group_id=5), TypeError, "lease group_id must be a str, not int: 5"),
    (check_lease, forged(worker_id=""), ValueError, "lease worker_id must not be empty"),
    (check_lease, forged(group_id=""), ValueError, "lease group_id must not be empty"),
    (check_lease, forged(seq=True), TypeError, "lease seq must be an int from 1 to"),
    (check_lease, forged(seq=1.0), TypeError, "lease seq must be an int from 1 to"),
    (check_lease, forged(seq="1"), TypeError, "not str: '1'"),
    (check_lease, forged(attempt=True), TypeError, "lease attempt must be an int from 1 to"),
    (check_lease, forged(attempt=None), TypeError, "lease attempt must be an int"),
    (check_lease, forged(seq=0), ValueError, f"lease seq must be from 1 to {MAX_COUNT}, got 0"),
    (
        check_lease,
        forged(seq=BIG),
        ValueError,
        f"lease seq must be from 1 to {MAX_COUNT}, got {BIG}",
    ),
    (check_lease, forged(attempt=0), ValueError, "lease attempt must be from 1 to"),
    (check_lease, forged(attempt=BIG), ValueError, f"lease attempt must be from 1 to {MAX_COUNT}"),
    # Every count and seq fits the stores' signed 64-bit integers.
    (check_seq, BIG, ValueError, f"seq must be at most {MAX_COUNT} (2**63 - 1), got {BIG}"),
    (check_limit, BIG, ValueError, f"limit must be at most {MAX_COUNT} (2**63 - 1), got {BIG}"),
    (check_limit, 2**70, ValueError, "limit must be at most"),
    (check_max_attempts, BIG, ValueError, f"max_attempts must be at most {MAX_COUNT}"),
    (check_max_attempts, str(BIG), ValueError, f"max_attempts must be at most {MAX_COUNT}"),
    # Seconds too large for a float are not finite (not a raw OverflowError).
    (check_visibility, 10**400, ValueError, "visibility must be finite, got 1000"),
    (check_delay, -(10**400), ValueError, "delay must be finite"),
    # Text no store can write: a lone surrogate (no UTF-8), a NUL (no PostgreSQL text).
    (check_group_id, "g\ud800", ValueError, "group_id must be Unicode text, but holds a lone"),
    (check_key, "k\ud800", ValueError, "key must be Unicode text, but holds a lone surrogate"),
    (check_key, "k\x00", ValueError, "key must not contain a NUL character ('\\x00')"),
    (check_tenant, "t\udfff", ValueError, "tenant must be Unicode text"),
    (check_tenant, "\x00", ValueError, "tenant must not contain a NUL character"),
    (check_worker_id, "w\ud800", ValueError, "worker_id must be Unicode text"),
    (check_worker_id, "w\x00", ValueError, "worker_id must not contain a NUL character"),
    (check_reason, "why\ud800", ValueError, "reason must be Unicode text"),
    (check_reason, "why\x00", ValueError, "reason must not contain a NUL character"),
]


@pytest.mark.parametrize(
    ("check", "value", "error", "message"),
    REFUSED,
    ids=[f"{check.__name__}-{value!r:.60}" for check, value, _, _ in REFUSED],
)
def test_bad_value_is_named_in_the_error(
    check: Callable[[object], object], value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        check(value)
    assert type(info.value) is error
    assert message in str(info.value)


def test_min_priority_is_named_as_such() -> None:
    with pytest.raises(ValueError, match=r"^min_priority must be from 0 to 4, got 9$"):
        check_priority(9, "min_priority")


@pytest.mark.parametrize("priority", range(MAX_PRIORITY + 1))
def test_every_priority_from_zero_to_four_is_accepted(priority: int) -> None:
    assert check_priority(priority) == priority


def test_good_values_are_returned_normalised() -> None:
    assert check_group_id("g") == "g"
    assert check_worker_id("w-1") == "w-1"
    assert check_visibility(5) == 5.0
    assert isinstance(check_visibility(5), float)
    assert check_delay(0) == 0.0
    assert check_lease(LEASE) is LEASE
    assert check_worker_id("_w_") == "_w_"  # one underscore is the worker's own
    assert check_wait(0) == 0.0
    assert check_reason("bad input") == "bad input"
    assert check_max_attempts(None) is None
    assert check_max_attempts("3") == 3
    assert check_on_dead("HOLD") == "hold"


def test_items_must_be_an_iterable_of_messages_or_triples() -> None:
    items = iter([("g", 1, 0)])
    assert check_items(items) is items
    with pytest.raises(TypeError, match=r"items must be an iterable .* got 'abc'"):
        check_items("abc")
    with pytest.raises(TypeError, match="got 5"):
        check_items(5)
    assert check_item(0, ("g", 1, 0)) == ("g", 1, 0, None, 0, False, None)
    assert check_item(0, Message("g", 1, 2, key="k", tenant="t")) == ("g", 1, 2, "k", 0, False, "t")
    with pytest.raises(TypeError, match=r"items\[1\] must be a Message or a \(group_id, event"):
        check_item(1, ["g", 1, 0])
    with pytest.raises(TypeError, match=r"items\[2\] must be a Message or a \(group_id, event"):
        check_item(2, ("g", 1))


def test_lease_fields_at_their_bounds_are_accepted() -> None:
    for lease in (
        forged(seq=MAX_COUNT, attempt=MAX_COUNT),
        forged(worker_id="wörker-ü", group_id="groupe-\U0001f600"),
        forged(worker_id="_w", group_id="g" * 10_000),  # a lease names a group that exists
    ):
        assert check_lease(lease) is lease


def test_every_count_is_bounded_by_the_largest_64_bit_integer() -> None:
    assert MAX_COUNT == 2**63 - 1
    assert check_count(MAX_COUNT, "limit") == MAX_COUNT
    assert check_count(0, "groups", low=0) == 0
    with pytest.raises(ValueError, match=r"^groups must be at most 9223372036854775807 "):
        check_count(BIG, "groups", low=0)
    assert check_max_attempts(MAX_COUNT) == MAX_COUNT
    assert check_max_attempts(str(MAX_COUNT)) == MAX_COUNT


def test_group_id_limit_and_nul_apply_to_publishing_not_to_lookups() -> None:
    longest = "g" * MAX_GROUP_ID
    assert MAX_GROUP_ID == 512
    assert check_group_id(longest, publish=True) == longest
    assert check_group_id("é" * MAX_GROUP_ID, publish=True) == "é" * MAX_GROUP_ID
    with pytest.raises(ValueError, match=r"^group_id must be at most 512 characters long, got 513"):
        check_group_id(longest + "g", publish=True)
    with pytest.raises(ValueError, match=r"group_id must not contain a NUL character"):
        check_group_id("a\x00b", publish=True)
    # A group stored before these limits can still be looked up (peeked, purged).
    assert check_group_id(longest + "g") == longest + "g"
    assert check_group_id("a\x00b") == "a\x00b"
    # A surrogate can never have been stored: refused either way.
    for publish in (False, True):
        with pytest.raises(ValueError, match=r"group_id must be Unicode text"):
            check_group_id("\ud800", publish=publish)


def test_text_checks_take_any_unicode_text_and_name_what_they_refuse() -> None:
    for text in ("plain", "ünïcødé", "\U0001f600 emoji", "tab\tand newline\n"):
        assert check_text(text, "x") is text
        assert check_key(text) == text
        assert check_worker_id(text) == text
    assert check_unicode("a\x00b", "group_id") == "a\x00b"
    surrogate = "tenant must be Unicode text, but holds a lone surrogate '\\udc80' at index 2: "
    with pytest.raises(ValueError, match=re.escape(surrogate + "'ab\\udc80c'") + "$"):
        check_text("ab\udc80c", "tenant")
    nul = "reason must not contain a NUL character ('\\x00'), found at index 2: 'ab\\x00'"
    with pytest.raises(ValueError, match=re.escape(nul) + "$"):
        check_text("ab\x00", "reason")


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"delay": -1}, ValueError, "delay must be >= 0 seconds, got -1"),
        ({"action": "nack", "delay": NAN}, ValueError, "delay must be finite, got nan"),
        ({"action": "bury", "reason": "x", "delay": INF}, ValueError, "delay must be finite"),
        ({"delay": "5"}, TypeError, "delay must be a number of seconds, got '5'"),
        ({"reason": None}, TypeError, "a settlement's reason must be a str, not NoneType"),
        ({"action": "nack", "reason": 3}, TypeError, "a settlement's reason must be a str"),
        ({"action": "bury"}, ValueError, "reason must not be empty"),
        ({"action": "bury", "reason": "x" * 1001}, ValueError, "at most 1000 characters"),
        ({"action": "bury", "reason": "a\x00"}, ValueError, "reason must not contain a NUL"),
    ],
)
def test_settlement_checks_delay_and_reason_whatever_the_action(
    fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        Settlement(LEASE, **fields)
    assert type(info.value) is error
    assert message in str(info.value)


def test_settlement_takes_what_its_call_takes() -> None:
    assert Settlement(LEASE).delay == 0
    assert Settlement(LEASE, "nack", delay=2.5).delay == 2.5
    assert Settlement(LEASE, "ack", reason="ignored").reason == "ignored"
    assert Settlement(LEASE, "bury", reason="bad input").reason == "bad input"
    assert math.isfinite(Settlement(LEASE, "nack", delay=10**6).delay)
