"""The argument checks every backend shares: each bad value is named in the error."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from transports_core import Event, Lease, Message
from transports_core.backend import (
    MAX_PRIORITY,
    check_delay,
    check_group_id,
    check_item,
    check_items,
    check_lease,
    check_max_attempts,
    check_on_dead,
    check_priority,
    check_reason,
    check_visibility,
    check_wait,
    check_worker_id,
)

NAN, INF = float("nan"), float("inf")
LEASE = Lease(1, "g", Event(), "w", 1, 0.0)

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
]


@pytest.mark.parametrize(
    ("check", "value", "error", "message"),
    REFUSED,
    ids=[f"{check.__name__}-{value!r}" for check, value, _, _ in REFUSED],
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
