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
LOST_REASON: Final = "lease-lost-says-why"
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
CANCELLED_CLAIM: Final = "cancelled-claim-gives-back"
CANCELLED_BATCH: Final = "cancelled-batch-claim-gives-back"
MODEL: Final = "model-agreement"
WAIT_ZERO: Final = "wait-zero-never-blocks"
WAIT_EMPTY: Final = "wait-empty-returns-none-after-the-wait"
WAIT_WAKE: Final = "wait-woken-by-publish-ack-lapse-park-end"
WAIT_RACE: Final = "wait-never-misses-a-racing-publish"
WAIT_ON: Final = "wait-goes-on-after-a-wake-that-brings-nothing"
WAIT_CLOSE: Final = "wait-woken-by-close"
BURY_FENCING: Final = "bury-fencing"
BURY: Final = "bury-dead-letters-now"
BURY_POLICY: Final = "bury-obeys-on-dead"
DEAD_REASON: Final = "dead-letter-reason"
ADMIN_STATS: Final = "admin-stats-and-groups"
ADMIN_DEAD: Final = "admin-dead-letters-by-policy"
ADMIN_REQUEUE: Final = "admin-requeue-to-head-in-order"
ADMIN_REFUSED: Final = "admin-requeue-refused"
ADMIN_DISCARD: Final = "admin-discard"
ADMIN_PURGE: Final = "admin-purge-group"
ADMIN_BACKLOG: Final = "admin-backlog-age-and-groups"
PARALLEL_FAIRNESS: Final = "parallel-fairness-bound"
EVENT_TYPE: Final = "event-type-round-trip"
EVENT_REFUSED: Final = "event-type-refused-at-publish"
DECODE_ERROR: Final = "decode-error-carries-a-lease"
BATCH_PRIORITY: Final = "publish-many-priority"
SEQ_NEVER_REUSED: Final = "seq-never-reused"
RESERVED_WORKER: Final = "reserved-worker-ids-refused"
TIMING_EDGES: Final = "timing-from-the-right-moment"
LAPSED_ACROSS_REOPEN: Final = "lapsed-lease-current-across-reopen"
KEY_DUPLICATE: Final = "key-duplicate-returns-the-original"
KEY_AFTER_SETTLE: Final = "key-duplicate-after-settle"
KEY_WINDOW: Final = "key-forgotten-after-the-window"
KEY_GROUP_SCOPE: Final = "key-scoped-to-its-group"
KEY_BATCH: Final = "key-in-publish-many"
KEY_STATS: Final = "key-count-in-stats"
KEY_PROCESSES: Final = "key-processes-store-once"
KEY_TASKS: Final = "key-tasks-store-once"
WITHIN_REFUSED: Final = "within-refuses-what-it-cannot-join"
WITHIN_ROLLBACK: Final = "within-rollback-leaves-nothing"
WITHIN_COMMIT: Final = "within-commit-takes-effect"
WITHIN_FENCING: Final = "within-fencing"
WITHIN_KEYS: Final = "within-keys-follow-the-transaction"
DELAY_NOT_BEFORE_DUE: Final = "delay-not-delivered-before-due"
DELAY_PLACE: Final = "delay-joins-its-group-when-due"
DELAY_HOLD: Final = "delay-hold-keeps-its-place"
DELAY_WAKE: Final = "delay-due-wakes-a-waiting-claim"
DELAY_STATS: Final = "delay-counted-in-stats"
DELAY_REFUSED: Final = "delay-refused-without-timers"
CANCEL: Final = "cancel-removes-what-is-not-in-flight"
PAUSE: Final = "pause-holds-a-group-until-resumed"
PAUSE_IN_FLIGHT: Final = "pause-lets-a-lease-finish"
PAUSE_KEPT: Final = "pause-outlasts-reopening-and-draining"
PEEK: Final = "peek-shows-the-next-messages-and-changes-nothing"
CONTROL_REFUSED: Final = "control-refused-without-group-control"
TENANT_FAIRNESS: Final = "tenant-weighted-fairness-bound"
TENANT_RETURN: Final = "tenant-back-from-idle-catches-up-nothing"
TENANT_ON_CREATE: Final = "tenant-set-when-the-group-is-created"
TENANT_FLOOR: Final = "tenant-priority-floor-filters-first"
TENANT_WEIGHTS: Final = "tenant-weights-stored-and-checked"
TENANT_REFUSED: Final = "tenant-refused-without-tenants"
BATCH_CLAIM: Final = "claim-many-as-successive-claims"
BATCH_FENCING: Final = "settle-many-fences-each-lease"
BATCH_ACK_CLAIM: Final = "ack-and-claim-acks-then-claims"
BATCH_BAD_INPUT: Final = "batch-bad-input-changes-nothing"
BATCH_WAIT: Final = "batch-claims-wait-as-claim"

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
    LOST_REASON: "a LeaseLost, raised or reported, says why: gone, redelivered, parked, released",
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
    CANCELLED_CLAIM: "a cancelled async claim gives back what it leased: at once, same attempt",
    CANCELLED_BATCH: "a cancelled claim_many or ack_and_claim gives back all it leased, at once",
    MODEL: "random operation sequences agree with the suite's reference model",
    WAIT_ZERO: "claim(wait=0) returns at once, with or without a message",
    WAIT_EMPTY: "claim(wait=w) with nothing deliverable returns None, and not before w",
    WAIT_WAKE: "a waiting claim is woken by a publish, an ack or nack, a lapse, a park's end",
    WAIT_RACE: "a publish racing the start of a waiting claim is never missed",
    WAIT_ON: "a waiting claim woken when nothing is takeable for it waits on to the end",
    WAIT_CLOSE: "close() from another thread wakes a waiting claim at once: None, no lease",
    BURY_FENCING: "bury of a lease no longer current raises LeaseLost and changes nothing",
    BURY: "bury takes the message out of delivery at once, for good",
    BURY_POLICY: "after bury, on_dead=release lets the group go on, on_dead=hold blocks it",
    DEAD_REASON: "dead_letters() says how each died: buried with the reason, lapsed, nacked",
    ADMIN_STATS: "stats() and groups() count ready, in-flight, parked, dead; deepest first",
    ADMIN_DEAD: "max_attempts makes dead letters, held or released as on_dead says",
    ADMIN_REQUEUE: "requeue puts dead letters back at the head of their group, in seq order",
    ADMIN_REFUSED: "requeue while a worker holds the group raises RequeueRefused(seq, holder)",
    ADMIN_DISCARD: "discard deletes a dead letter for good, and a group it held goes on",
    ADMIN_PURGE: "purge_group removes a group's messages and dead letters; holders lose",
    ADMIN_BACKLOG: "stats() ages the oldest ready message and counts ready and busy groups",
    PARALLEL_FAIRNESS: "with C claims in flight, each serves one of the C oldest ready groups",
    EVENT_TYPE: "a transport opened with event_type= gives leases of that type (unions too)",
    EVENT_REFUSED: "an event that is not of the event type is refused at publish: TypeError",
    DECODE_ERROR: "a stored event that no longer decodes raises EventDecodeError with a lease",
    BATCH_PRIORITY: "publish_many sets a new group's priority from its first item only",
    SEQ_NEVER_REUSED: "seqs are never handed out twice, even after acking the newest and reopening",
    RESERVED_WORKER: "worker ids beginning with __ are refused by every method taking one",
    TIMING_EDGES: "a lease is claimable once expires_at passed; a park counts from the nack",
    LAPSED_ACROSS_REOPEN: "a lapsed lease nobody re-claimed stays current across reopening",
    KEY_DUPLICATE: "a repeated key in its group stores nothing and returns Duplicate(original)",
    KEY_AFTER_SETTLE: "a key stays a duplicate once its message is acked, dead or purged",
    KEY_WINDOW: "after dedup_window (> 0) a key is forgotten: its next use publishes anew",
    KEY_GROUP_SCOPE: "another group's same key is a new message",
    KEY_BATCH: "publish_many dedupes within the batch and against earlier keys; all or none",
    KEY_STATS: "stats().keys counts the keys the queue remembers",
    KEY_PROCESSES: "processes racing on the same keys store each key's message once",
    KEY_TASKS: "asyncio tasks racing on the same keys store each key's message once",
    WITHIN_REFUSED: "within(conn) refuses a connection it cannot join (TransportError if none)",
    WITHIN_ROLLBACK: "within's writes rolled back leave nothing; an acked lease stays current",
    WITHIN_COMMIT: "within's writes committed take effect as if made on the transport",
    WITHIN_FENCING: "within's ack of a stale lease raises LeaseLost before the commit",
    WITHIN_KEYS: "a keyed publish within a transaction rolled back leaves no key",
    DELAY_NOT_BEFORE_DUE: "a delayed message is not delivered before it is due, and is after",
    DELAY_PLACE: "a due delayed message joins its group as if published then; it holds nothing",
    DELAY_HOLD: "a delayed message with hold keeps its place and holds its group until due",
    DELAY_WAKE: "a claim waiting for a delayed message wakes when it is due",
    DELAY_STATS: "stats() counts delayed messages as delayed, nowhere else, until due",
    DELAY_REFUSED: "a backend without timers refuses a delayed publish: Unsupported",
    CANCEL: "cancel removes a queued, parked or delayed message; never one in flight",
    PAUSE: "a paused group delivers nothing until resumed; other groups flow",
    PAUSE_IN_FLIGHT: "pausing a group lets its lease in flight settle normally",
    PAUSE_KEPT: "a pause outlasts reopening the store and the group's draining",
    PEEK: "peek lists a group's next messages in delivery order and changes nothing",
    CONTROL_REFUSED: "a backend without group control refuses it: Unsupported",
    TENANT_FAIRNESS: "tenants with ready groups share claims within one of their weights' ratio",
    TENANT_RETURN: "a tenant back from idle gets its share, not the turns it missed",
    TENANT_ON_CREATE: "a group's tenant is set by the publish that creates it",
    TENANT_FLOOR: "the priority floor filters before tenants are weighed",
    TENANT_WEIGHTS: "set_tenant_weight stores 1-1000 and refuses anything else",
    TENANT_REFUSED: "a backend without tenants refuses a publish with one: Unsupported",
    BATCH_CLAIM: "claim_many leases what as many claims would, in order, one per free group",
    BATCH_FENCING: "settle_many and ack_many fence each lease, report the stale, settle the rest",
    BATCH_ACK_CLAIM: "ack_and_claim acks then claims; a stale lease raises and claims nothing",
    BATCH_BAD_INPUT: "a bad limit or settlement refuses the whole batch and changes nothing",
    BATCH_WAIT: "claim_many and ack_and_claim wait as claim does; a woken claim_many fills up",
}
