"""Argument checks that every backend shares, so that every backend refuses the same
inputs with the same errors, before it writes anything.

Each check returns the value it accepted (normalised where that is harmless) or raises
``ValueError`` for a bad value or ``TypeError`` for a wrong type, naming the argument and
the value; every span of time goes through `check_seconds` and every count through
`check_count`, so one kind of mistake is refused one way everywhere. Backends reach them
through ``transports_core.backend``, which lists them. Imports only ``_models``.

Text a store writes (a group id published to, a key, a tenant, a worker id, a reason) must
be text every store can keep: no lone surrogate (UTF-8 cannot encode one, so no driver
can send it) and no NUL character (PostgreSQL's text cannot hold one), as `check_text`
says. Any other group id (one to peek, pause, resume or purge) is refused for a surrogate
alone, and taken at any length, so that a group stored before these checks can still be
reached.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._models import Lease, Message

MAX_PRIORITY = 4
# The largest count, seq or attempt: every store keeps them as signed 64-bit integers, so
# a larger one would overflow a column or a parameter instead of being refused.
MAX_COUNT = 2**63 - 1
# The longest group id a message is published to, in characters (PostgreSQL indexes group
# ids, and an index entry must fit in a third of a page). Looking a group up takes any
# length, so that a longer one stored before this limit can still be reached.
MAX_GROUP_ID = 512
# The longest idempotency key, in characters.
MAX_KEY = 255
# The longest publish delay: a year (a leap year's days), in seconds.
MAX_PUBLISH_DELAY = 366 * 86_400.0
# The longest tenant name, in characters, and the range of a tenant's weight.
MAX_TENANT = 255
MAX_WEIGHT = 1000
# How long a queue remembers an idempotency key unless its `dedup_window` says otherwise.
DEDUP_WINDOW = 86_400.0
# Worker ids with this prefix belong to the backends: each keeps its own markers (a parked
# message's holder, say) inside it, where no worker's id can collide with them.
RESERVED_PREFIX = "__"
# A bury reason is stored with the dead letter and shown to operators: a line, not a log.
MAX_REASON = 1000
ON_DEAD_CHOICES = ("release", "hold")
# What opening a transport may change in a versioned schema (a backend's ``migrate``
# option): ``create`` a missing queue but refuse an older one, naming ``transports
# migrate``; ``auto``: upgrade an older one too; ``never``: change nothing, refuse both.
MIGRATE_CHOICES = ("create", "auto", "never")


def check_unicode(text: str, name: str) -> str:
    """``text`` (the argument ``name``), if it holds no lone surrogate, which no store can
    keep: UTF-8 cannot encode one. ASCII text, the common case, costs one ``isascii``."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{name} must be Unicode text, but holds a lone surrogate "
                f"{text[exc.start]!r} at index {exc.start}: {text!r:.200}"
            ) from None
    return text


def check_text(text: str, name: str) -> str:
    """``text`` (the argument ``name``), if a store can write it: no lone surrogate (see
    `check_unicode`) and no NUL character, which PostgreSQL's text cannot hold."""
    if "\x00" in text:
        at = text.index("\x00")
        raise ValueError(
            f"{name} must not contain a NUL character ('\\x00'), found at index {at}: {text!r:.200}"
        )
    return check_unicode(text, name)


def check_group_id(group_id: object, *, publish: bool = False) -> str:
    """A group id: a non-empty str that is Unicode text (`check_unicode`). With
    ``publish``, one a message is published to: of at most `MAX_GROUP_ID` characters and
    text a store can write (`check_text`). Without it (a group looked up), any length and
    any character, so that every group stored can be reached."""
    if not isinstance(group_id, str):
        raise TypeError(f"group_id must be a str, not {type(group_id).__name__}: {group_id!r}")
    if not group_id:
        raise ValueError("group_id must not be empty")
    if not publish:
        return check_unicode(group_id, "group_id")
    if len(group_id) > MAX_GROUP_ID:
        raise ValueError(
            f"group_id must be at most {MAX_GROUP_ID} characters long, got "
            f"{len(group_id)}: {group_id!r:.200}"
        )
    return check_text(group_id, "group_id")


def check_key(key: object) -> str:
    """An idempotency key: a non-empty str of at most `MAX_KEY` characters, which
    `check_text` accepts."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str or None, got {key!r:.200}")
    if not key or len(key) > MAX_KEY:
        raise ValueError(f"key must be 1 to {MAX_KEY} characters long, got {key!r:.200}")
    return check_text(key, "key")


def check_tenant(tenant: object) -> str:
    """A tenant name: a non-empty str of at most `MAX_TENANT` characters, which
    `check_text` accepts."""
    if not isinstance(tenant, str):
        raise TypeError(f"tenant must be a str or None, got {tenant!r:.200}")
    if not tenant or len(tenant) > MAX_TENANT:
        raise ValueError(f"tenant must be 1 to {MAX_TENANT} characters long, got {tenant!r:.200}")
    return check_text(tenant, "tenant")


def check_weight(weight: object) -> int:
    """A tenant's weight: an int from 1 to `MAX_WEIGHT`."""
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError(f"weight must be an int from 1 to {MAX_WEIGHT}, got {weight!r}")
    if not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight must be from 1 to {MAX_WEIGHT}, got {weight!r}")
    return weight


def check_priority(priority: object, name: str = "priority") -> int:
    """A priority (or, with ``name``, a priority floor): an int from 0 to `MAX_PRIORITY`."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"{name} must be an int from 0 to {MAX_PRIORITY}, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"{name} must be from 0 to {MAX_PRIORITY}, got {priority!r}")
    return priority


def check_worker_id(worker_id: object) -> str:
    """A worker id: a non-empty str that does not begin with `RESERVED_PREFIX`, which
    `check_text` accepts (a claim writes it)."""
    if not isinstance(worker_id, str):
        raise TypeError(f"worker_id must be a str, not {type(worker_id).__name__}: {worker_id!r}")
    if not worker_id:
        raise ValueError("worker_id must not be empty")
    if worker_id.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"worker_id {worker_id!r} is reserved: ids beginning with "
            f"{RESERVED_PREFIX!r} belong to the transport"
        )
    return check_text(worker_id, "worker_id")


def isfinite(value: float) -> bool:
    """`math.isfinite`, and False for an int too large for a float (which `math.isfinite`
    refuses with a raw ``OverflowError``)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_seconds(value: object, name: str, *, zero: bool = False) -> float:
    """A span of time named ``name``: a finite int or float (never a bool), > 0, or >= 0
    with ``zero``. The one check of seconds: a wrong type raises ``TypeError``, a bad
    value ``ValueError``, each naming the argument and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r:.200}")
    if value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be {'>=' if zero else '>'} 0 seconds, got {value!r}")
    return float(value)


def check_count(value: object, name: str, low: int = 1) -> int:
    """A count named ``name``: an int (never a bool) from ``low`` to `MAX_COUNT`. The one
    check of counts, raising as `check_seconds` does."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    if value > MAX_COUNT:
        raise ValueError(f"{name} must be at most {MAX_COUNT} (2**63 - 1), got {value!r}")
    return value


def check_visibility(visibility: object) -> float:
    """A lease's visibility: finite seconds > 0."""
    return check_seconds(visibility, "visibility")


def check_delay(delay: object) -> float:
    """A nack's delay: finite seconds >= 0."""
    return check_seconds(delay, "delay", zero=True)


def check_publish_delay(delay: object) -> float:
    """A publish's delay: finite seconds from 0 to `MAX_PUBLISH_DELAY` (a year)."""
    seconds = check_seconds(delay, "delay", zero=True)
    if seconds > MAX_PUBLISH_DELAY:
        raise ValueError(
            f"delay must be at most {MAX_PUBLISH_DELAY:.0f} seconds (a year), got {delay!r}"
        )
    return seconds


def check_hold(hold: object) -> bool:
    """A publish's ``hold``: a bool."""
    if not isinstance(hold, bool):
        raise TypeError(f"hold must be a bool, got {hold!r:.200}")
    return hold


def no_options(delay: object, hold: object, tenant: object) -> bool:
    """True when a publish's ``delay``, ``hold`` and ``tenant`` are their defaults
    exactly (a number 0, False, None), so it needs none of their checks or costs."""
    return tenant is None and hold is False and type(delay) in (int, float) and not delay


def check_wait(wait: object) -> float:
    """How long a claim may block: finite seconds >= 0."""
    return check_seconds(wait, "wait", zero=True)


def check_reason(reason: object) -> str:
    """A bury reason: a str, not blank, at most `MAX_REASON` characters, which
    `check_text` accepts."""
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, not {type(reason).__name__}: {reason!r:.200}")
    if not reason.strip():
        raise ValueError("reason must not be empty: say why the message is buried")
    if len(reason) > MAX_REASON:
        raise ValueError(f"reason must be at most {MAX_REASON} characters, got {len(reason)}")
    return check_text(reason, "reason")


def check_max_attempts(value: object) -> int | None:
    """The ``max_attempts`` option: None, an int from 1 to `MAX_COUNT`, or (from a URL)
    its digits."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_attempts must be a whole number >= 1, got {value!r}")
    if value > MAX_COUNT:
        raise ValueError(f"max_attempts must be at most {MAX_COUNT} (2**63 - 1), got {value!r}")
    return value


def check_on_dead(value: object) -> str:
    """The ``on_dead`` option: ``release`` or ``hold`` (any case, from a URL)."""
    if isinstance(value, str) and value.lower() in ON_DEAD_CHOICES:
        return value.lower()
    raise ValueError(f"on_dead must be one of {', '.join(ON_DEAD_CHOICES)}, got {value!r}")


def check_migrate(value: object) -> str:
    """The ``migrate`` option of a backend with a versioned schema: one of
    `MIGRATE_CHOICES` (any case, from a URL)."""
    if isinstance(value, str) and value.lower() in MIGRATE_CHOICES:
        return value.lower()
    raise ValueError(f"migrate must be one of {', '.join(MIGRATE_CHOICES)}, got {value!r}")


def migrate_refusal(migrate: str, version: int | None, needed: int) -> str | None:
    """Why opening, under the ``migrate`` option, may not change a queue found at schema
    ``version`` (None: there is no queue yet) to the version ``needed``; None if it may.
    The backend's error puts it after the store's name and before the command to run."""
    if version is None:
        return "has no queue yet and this URL says migrate=never" if migrate == "never" else None
    if version == needed or migrate == "auto":
        return None
    return (
        f"has queue schema version {version}, and this version of durable-transports needs "
        f"version {needed}; opening upgrades it only with ?migrate=auto in the URL"
    )


def check_lease(lease: object) -> Lease[object]:
    """A `Lease` held by a worker (whether it is current is for the backend to say): its
    ``seq`` and ``attempt`` ints from 1 to `MAX_COUNT`, its ``worker_id`` and
    ``group_id`` non-empty strs. A lease made by hand may hold anything: a field of the
    wrong type would reach the store's statements, and a reserved worker id would match
    a backend's marker. Every ack runs it, so a good lease passes one expression; only a
    refused one is looked at field by field, for the error."""
    if type(lease) is Lease or isinstance(lease, Lease):
        seq, attempt, worker_id = lease.seq, lease.attempt, lease.worker_id
        group_id = lease.group_id
        if (
            type(seq) is int
            and type(attempt) is int
            and 0 < seq <= MAX_COUNT
            and 0 < attempt <= MAX_COUNT
            and type(worker_id) is str
            and type(group_id) is str
            and group_id
            and worker_id
            and not worker_id.startswith(RESERVED_PREFIX)
        ):
            return lease
        _refuse_lease(seq, attempt, worker_id, group_id)
        return lease  # int and str subclasses: no store tells them from ints and strs
    raise TypeError(f"expected a Lease, got {type(lease).__name__}: {lease!r:.200}")


def _refuse_lease(seq: object, attempt: object, worker_id: object, group_id: object) -> None:
    """Raise the error for the first of a lease's fields that `check_lease` refuses."""
    for name, number in (("seq", seq), ("attempt", attempt)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise TypeError(
                f"lease {name} must be an int from 1 to {MAX_COUNT}, "
                f"not {type(number).__name__}: {number!r:.200}"
            )
        if not 0 < number <= MAX_COUNT:
            raise ValueError(f"lease {name} must be from 1 to {MAX_COUNT}, got {number!r}")
    for name, text in (("worker_id", worker_id), ("group_id", group_id)):
        if not isinstance(text, str):
            raise TypeError(f"lease {name} must be a str, not {type(text).__name__}: {text!r:.200}")
        if not text:
            raise ValueError(f"lease {name} must not be empty")
    if str(worker_id).startswith(RESERVED_PREFIX):
        raise ValueError(
            f"lease worker_id {worker_id!r} is reserved: ids beginning with "
            f"{RESERVED_PREFIX!r} belong to the transport, so no lease carries one"
        )


def check_items(items: object) -> Iterable[object]:
    """``publish_many``'s items, if they are an iterable (each is checked by `check_item`)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            "items must be an iterable of Message or (group_id, event, priority), "
            f"got {items!r:.200}"
        )
    return items


def check_item(index: int, item: object) -> tuple[object, ...]:
    """Item ``index`` of ``publish_many``, if it is a `Message` or a 3-tuple, as
    ``(group_id, event, priority, key, delay, hold, tenant)`` (the fields of `Message`)."""
    if isinstance(item, Message):
        return (
            item.group_id,
            item.event,
            item.priority,
            item.key,
            item.delay,
            item.hold,
            item.tenant,
        )
    if not isinstance(item, tuple) or len(item) != 3:
        raise TypeError(
            f"items[{index}] must be a Message or a (group_id, event, priority) tuple, "
            f"got {item!r:.200}"
        )
    return (*item, None, 0, False, None)


def check_seq(seq: object) -> int:
    """A message's seq: an int from 1 to `MAX_COUNT`."""
    return check_count(seq, "seq")


def check_limit(limit: object) -> int:
    """A listing's limit: an int from 1 to `MAX_COUNT`."""
    return check_count(limit, "limit")
