"""The named properties of the contract that the suite checks, one slug each.

Every scenario carries the slug of the property it checks (as the ``conformance_property``
marker, in its test name, and at the start of each assertion message), so that a failure
says which promise the backend broke. Imports nothing.
"""

from __future__ import annotations

from typing import Final

PUBLISH: Final = "publish-order"
NO_LOSS: Final = "no-loss"
CLAIM: Final = "claim-lease"
CLAIM_NONE: Final = "claim-none-when-idle"
FIFO: Final = "fifo-per-group"
ONE_IN_FLIGHT: Final = "one-in-flight-per-group"
LEASE_RECOVERY: Final = "lease-recovery"
PARK: Final = "park"
NACK_NOW: Final = "nack-immediate-retry"
ROUND_ROBIN: Final = "round-robin"
FAIRNESS: Final = "fairness-bound"
PRIORITY_FLOOR: Final = "priority-floor"
PRIORITY_RESET: Final = "priority-reset-on-republish"
FENCING: Final = "fencing"
EXTEND: Final = "extend"
ATTEMPT: Final = "attempt-counting"
BAD_INPUT: Final = "bad-input"
SHARED_STORE: Final = "shared-store"
LIFECYCLE: Final = "lifecycle"
DURABILITY: Final = "durability"
CONTENTION_THREADS: Final = "contention-threads"
CONTENTION_PROCESSES: Final = "contention-processes"
CONTENTION_TASKS: Final = "contention-tasks"
ASYNC_CONTEXT: Final = "async-context"
MODEL: Final = "model-agreement"

# What each property means, in the order the CLI reports them.
PROPERTIES: Final[dict[str, str]] = {
    PUBLISH: "publish returns increasing seqs; publish_many returns them in order, all or none",
    NO_LOSS: "every published message is delivered, none twice",
    CLAIM: "claim leases the published message to the worker for the visibility asked",
    CLAIM_NONE: "claim returns None when nothing is deliverable",
    FIFO: "a group's messages are delivered in publish order",
    ONE_IN_FLIGHT: "while a group's message is leased, nothing else of that group is delivered",
    LEASE_RECOVERY: "a lease that lapses makes its message claimable again",
    PARK: "nack(delay) holds the group for the delay, then redelivers the message",
    NACK_NOW: "nack() makes the message claimable again at once, ahead of its group's next",
    ROUND_ROBIN: "never-claimed groups first, in order of oldest message; a claimed group yields",
    FAIRNESS: "with G groups ready, G consecutive claims serve G different groups",
    PRIORITY_FLOOR: "claim(min_priority=p) serves only groups of priority p or more",
    PRIORITY_RESET: "the publish that creates a group sets its priority, again after it drains",
    FENCING: "ack/nack/extend of a lease no longer current raise LeaseLost and change nothing",
    EXTEND: "extend moves the lease's expiry and keeps the message held",
    ATTEMPT: "attempt counts deliveries: 1 on the first, one more for each redelivery",
    BAD_INPUT: "bad arguments raise ValueError/TypeError naming the argument, write nothing",
    SHARED_STORE: "every handle the factory opens sees one store",
    LIFECYCLE: "context managers return the transport; close is idempotent",
    DURABILITY: "messages, leases and attempts survive closing every handle and reopening",
    CONTENTION_THREADS: "threads at once: no loss, no duplicate, order kept, one lease a group",
    CONTENTION_PROCESSES: "processes at once: no loss, no duplicate, order kept, one lease a group",
    CONTENTION_TASKS: "asyncio tasks at once: no loss, no duplicate, order kept, one lease a group",
    ASYNC_CONTEXT: "async with returns the transport and closes it",
    MODEL: "random operation sequences agree with the suite's reference model",
}
