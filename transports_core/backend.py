"""The toolkit for backend authors: everything a backend needs from core, by public name.

A backend (this repository's or a third party's) imports from here and from
``transports_core`` only, never a private module, so that core can change its insides
without breaking anyone. It holds:

* registration: `Backend`, `register_backend`, `ENTRY_POINT_GROUP`, and `build_backend`,
  the `Backend` of a parser of URL and options and the two transport classes;
* options: `OptionTable`, a backend's typed whitelist (an option from the URL's query or
  a keyword, once; unknown names refused, the known ones listed), `check_clock` and
  `seconds_option`;
* the operation shape and its drivers (`Operation`, `More`/`MORE`, `drive`,
  `drive_async`): a backend writes its calls as sans-I/O operations and core runs them;
  `inline` runs one inside another's steps, and `claiming_many`, `settling_many` and
  `then_claiming` are the steps of the batch calls (``claim_many``, ``settle_many``,
  ``ack_and_claim``) over a backend's single operations;
  the wait plan of a blocking claim (`wait_plan`, `WaitState`, `LOOK`, `CLAIM`,
  `Backoff`, driven by `wait_for`/`wait_for_async`); `GiveBack`, the rule for a
  cancelled async claim;
* the transport classes' common part: `TransportBase` and `AsyncTransportBase` implement
  every method but ``claim`` and ``close`` over a backend's `Operations` (its builders of
  `Operation` objects) and its runner, and `Closing`/`AsyncClosing` the context-manager
  pair over ``close()``; `ReuseLast` keeps the checked operation of a worker's repeated
  ``claim``; `Claiming` and `Settle`, the roots of a claim's operation and of those on
  a held lease;
* events: `EventCodec`, which encodes events of one type to JSON text and builds leases
  (raising `EventDecodeError`) from stored text, and `Claimed`, a leased message whose
  event is still that text;
* the shared argument checks, so every backend refuses the same input with the same error
  before it writes anything (`check_seconds` and `check_count` are the one check of a span
  of time and of a count, which the others and the worker runtime use), and their bounds
  (`MAX_PRIORITY`, `RESERVED_PREFIX`, `MAX_REASON`, `ON_DEAD_CHOICES`, `MIGRATE_CHOICES`);
* the dead-letter reasons (`buried_reason`, `exhausted_reason`); `queue_stats`, the
  totals of the counts per priority; and the admin reads' values from stored rows
  (`group_info`, `dead_letter`, `held_group`);
* `Joined`/`AsyncJoined`, what a backend's ``_join(conn)`` returns for
  ``transport.within(conn)``, and `cannot_join`, the error of one that cannot;
* `Migration` and `Migrator`, what a backend with a versioned schema offers ``migrate``
  (see `Backend.migrate`);
* `redact_url`, for messages and reprs that must never show a password.
"""

from __future__ import annotations

from ._admin import (
    buried_reason,
    dead_letter,
    exhausted_reason,
    group_info,
    held_group,
    queue_stats,
)
from ._base import (
    AsyncClosing,
    AsyncJoined,
    AsyncTransportBase,
    Claiming,
    Closing,
    Joined,
    Operations,
    ReuseLast,
    Settle,
    TransportBase,
    cannot_join,
)
from ._batch import TURN_STEP, Part, claiming_many, inline, settling_many, then_claiming
from ._codec import Claimed, EventCodec, Item
from ._options import OptionTable, build_backend, check_clock, seconds_option
from ._registry import (
    ENTRY_POINT_GROUP,
    FEATURES,
    Backend,
    Migration,
    Migrator,
    redact_url,
    register_backend,
)
from ._seam import (
    AFTER_DUE,
    CLAIM,
    LOOK,
    MORE,
    Backoff,
    GiveBack,
    More,
    Operation,
    Steps,
    WaitState,
    WaitStep,
    drive,
    drive_async,
    wait_for,
    wait_for_async,
    wait_plan,
)
from ._validate import (
    DEDUP_WINDOW,
    MAX_COUNT,
    MAX_GROUP_ID,
    MAX_KEY,
    MAX_PRIORITY,
    MAX_PUBLISH_DELAY,
    MAX_REASON,
    MAX_TENANT,
    MAX_WEIGHT,
    MIGRATE_CHOICES,
    ON_DEAD_CHOICES,
    RESERVED_PREFIX,
    check_count,
    check_delay,
    check_group_id,
    check_hold,
    check_item,
    check_items,
    check_key,
    check_lease,
    check_limit,
    check_max_attempts,
    check_migrate,
    check_on_dead,
    check_priority,
    check_publish_delay,
    check_reason,
    check_seconds,
    check_seq,
    check_tenant,
    check_text,
    check_unicode,
    check_visibility,
    check_wait,
    check_weight,
    check_worker_id,
    migrate_refusal,
)

__all__ = [
    "AFTER_DUE",
    "CLAIM",
    "DEDUP_WINDOW",
    "ENTRY_POINT_GROUP",
    "FEATURES",
    "LOOK",
    "MAX_COUNT",
    "MAX_GROUP_ID",
    "MAX_KEY",
    "MAX_PRIORITY",
    "MAX_PUBLISH_DELAY",
    "MAX_REASON",
    "MAX_TENANT",
    "MAX_WEIGHT",
    "MIGRATE_CHOICES",
    "MORE",
    "ON_DEAD_CHOICES",
    "RESERVED_PREFIX",
    "TURN_STEP",
    "AsyncClosing",
    "AsyncJoined",
    "AsyncTransportBase",
    "Backend",
    "Backoff",
    "Claimed",
    "Claiming",
    "Closing",
    "EventCodec",
    "GiveBack",
    "Item",
    "Joined",
    "Migration",
    "Migrator",
    "More",
    "Operation",
    "Operations",
    "OptionTable",
    "Part",
    "ReuseLast",
    "Settle",
    "Steps",
    "TransportBase",
    "WaitState",
    "WaitStep",
    "build_backend",
    "buried_reason",
    "cannot_join",
    "check_clock",
    "check_count",
    "check_delay",
    "check_group_id",
    "check_hold",
    "check_item",
    "check_items",
    "check_key",
    "check_lease",
    "check_limit",
    "check_max_attempts",
    "check_migrate",
    "check_on_dead",
    "check_priority",
    "check_publish_delay",
    "check_reason",
    "check_seconds",
    "check_seq",
    "check_tenant",
    "check_text",
    "check_unicode",
    "check_visibility",
    "check_wait",
    "check_weight",
    "check_worker_id",
    "claiming_many",
    "dead_letter",
    "drive",
    "drive_async",
    "exhausted_reason",
    "group_info",
    "held_group",
    "inline",
    "migrate_refusal",
    "queue_stats",
    "redact_url",
    "register_backend",
    "seconds_option",
    "settling_many",
    "then_claiming",
    "wait_for",
    "wait_for_async",
    "wait_plan",
]
