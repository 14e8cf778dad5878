"""A small in-memory transport with switchable defects, for proving that the conformance
suite catches each broken promise. With no defects switched on it keeps the whole contract,
waiting claims, bury and the admin interface included (and passes the suite); it shares no
code with the suite's reference model. It imports only public names, as any backend must."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

import transports_core as dt
from transports_core import backend as core

LastDelivery = Literal["lapsed", "nacked"]
# (group, key) -> (the seq first published with the key, when the key is forgotten); the
# group is "" under the keys_across_groups defect
Keys = dict[tuple[str, str], tuple[int, float]]
PARKED = "__parked__"


def _due(m: _Message) -> tuple[float, int]:
    return (m.due, m.seq)


# A waiting claim re-checks this often (real seconds) so that it sees a manual clock move.
RECHECK = 0.2


@dataclass(frozen=True)
class Defects:
    lifo: bool = False  # delivers a group's newest message first
    no_exclusivity: bool = False  # delivers a group's next message while one is leased
    eternal_leases: bool = False  # a worker's lease never lapses
    ignore_park: bool = False  # nack(delay) frees the message at once
    fixed_order: bool = False  # always serves the oldest group first: no round-robin
    ignore_floor: bool = False  # claim ignores min_priority
    no_fencing: bool = False  # ack/nack/extend act on the seq, whoever holds it now
    drop_every: int = 0  # every n-th publish is silently lost
    stale_bury: bool = False  # bury acts on the seq, whoever holds it now
    deaf_wait: bool = False  # a waiting claim is woken by nothing: it looks once, at the end
    # a waiting claim looks at the state only after its first claim attempt: a publish in
    # the window (this many seconds) between the two is missed
    racy_wait_start: float = 0.0
    impatient_wait: bool = False  # a waiting claim woken for nothing it may take gives up
    close_ignores_waiter: bool = False  # close leaves a waiting claim waiting
    requeue_at_tail: bool = False  # a requeued dead letter goes behind its group's messages
    bury_ignores_hold: bool = False  # bury releases the group under on_dead="hold"
    plain_reason: bool = False  # stores the caller's bury reason as it was given
    says_lapsed: bool = False  # every exhausted letter says its last delivery lapsed
    sentinel_lease: bool = False  # a lease naming the park sentinel settles a parked message
    batch_priority_last: bool = False  # publish_many gives a group its last item's priority
    seq_from_max: bool = False  # a new seq is one more than the highest stored
    grace: float = 0.0  # a lapsed lease or ended park is only claimable this long after
    park_from_claim: bool = False  # a park's delay counts from the claim, not the nack
    reopen_loses_lapsed: bool = False  # opening a handle forgets lapsed leases
    racy_claim: bool = False  # picks and marks a message under two separate locks
    ignore_event_type: bool = False  # encodes and decodes every event as the default Event
    decode_unleased: bool = False  # a message that does not decode is not leased after all
    cancel_in_seq_order: bool = False  # cancel misses a delayed message behind later seqs
    many_decode_alone: bool = False  # claim_many's EventDecodeError carries no others
    ignore_keys: bool = False  # takes a key and stores the message anyway
    keys_across_groups: bool = False  # a key is one for the whole queue, not per group
    forget_key_on_ack: bool = False  # an acked message's key is forgotten with it
    eternal_keys: bool = False  # keys outlive the window
    batch_keys_unseen: bool = False  # publish_many checks keys against earlier publishes only
    within_commits: bool = False  # each call inside a caller's transaction commits at once
    within_never_applies: bool = False  # a caller's commit drops what ran inside it
    within_unfenced: bool = False  # ack inside a caller's transaction acts on the seq alone
    within_keys_outside: bool = False  # a rolled-back keyed publish leaves its key
    within_takes_anything: bool = False  # within(conn) runs on its own for a stranger's conn
    no_join: bool = False  # within refuses every connection: a backend that cannot join
    early_delay: bool = False  # a delayed message is deliverable at once
    delay_keeps_place: bool = False  # a due delayed message goes back to its publish place
    delay_holds: bool = False  # a delayed message without hold holds its group anyway
    hold_ignored: bool = False  # hold=True is taken as a plain delay
    deaf_timers: bool = False  # a due delayed message is noticed only at the next publish
    timers_uncounted: bool = False  # stats count a delayed message as ready
    cancel_in_flight: bool = False  # cancel removes a leased message too
    pause_ignored: bool = False  # claims serve paused groups
    pause_forgotten_on_drain: bool = False  # a group that drains loses its pause
    peek_claims: bool = False  # peek counts a delivery of the head
    unweighted: bool = False  # tenants are ignored: plain round-robin over groups
    tenant_catch_up: bool = False  # a tenant back from idle catches up on missed turns
    tenant_each_publish: bool = False  # every publish sets its group's tenant
    many_reversed: bool = False  # claim_many hands its batch out in reverse order
    many_one: bool = False  # claim_many leases one message however many are asked for
    many_ignores_floor: bool = False  # claim_many ignores min_priority
    many_unweighted: bool = False  # claim_many fills its batch in plain round-robin
    many_all_or_nothing: bool = False  # settle_many raises at a stale lease, the rest unsettled
    many_unfenced: bool = False  # settle_many acts on the seq, whoever holds it now
    claims_after_lost_ack: bool = False  # ack_and_claim claims though its ack found no lease
    many_no_wait: bool = False  # claim_many never waits: wait is taken as 0
    lost_without_reason: bool = False  # a LeaseLost never says why
    lost_always_gone: bool = False  # every LeaseLost says its message is gone
    ack_claim_no_wait: bool = False  # ack_and_claim's claim never waits
    age_counts_leased: bool = False  # the backlog's age counts in-flight and parked heads too
    age_from_publish: bool = False  # a delayed message's age counts from its publish
    age_restarts_on_nack: bool = False  # a nack makes its message ready anew
    groups_by_message: bool = False  # ready_groups counts ready messages, not groups
    paused_groups_ready: bool = False  # a paused group with a free head counts as ready


@dataclass
class _Message:
    seq: int
    group: str
    raw: str
    priority: int
    attempt: int = 0
    holder: str | None = None
    until: float = 0.0
    allowance: int = 0  # deliveries before this one that a requeue forgave
    nacked: bool = False  # how the last delivery ended
    claimed_at: float = 0.0
    due: float = 0.0  # a delayed publish: not deliverable before
    hold: bool = False  # delayed with hold=True: in its FIFO place, holding its group
    ready_at: float = 0.0  # when it became ready: published, came due, or requeued


@dataclass
class _Group:
    priority: int
    created: int
    turn: int = 0
    seqs: list[int] = field(default_factory=list)
    last_claimed_at: float | None = None
    tenant: str | None = None


@dataclass
class _Dead:
    message: _Message
    reason: str
    dead_at: float
    held: bool


class MemoryStore:
    def __init__(self, clock: Callable[[], float], defects: Defects = Defects()) -> None:
        self.clock, self.defects = clock, defects
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.messages: dict[int, _Message] = {}
        self.groups: dict[str, _Group] = {}
        self.dead: dict[int, _Dead] = {}
        self.keys: Keys = {}
        self.seq = self.publishes = self.claims = 0
        self.timers: dict[int, _Message] = {}  # delayed, not holding: outside any group
        self.timer_tenants: dict[int, str | None] = {}
        self.paused: set[str] = set()
        self.weights: dict[str, int] = {}
        self.passes: dict[str | None, float] = {}
        self.vtime = 0.0

    def open(self, **options: Any) -> MemoryTransport:
        return MemoryTransport(self, **options)

    def opener(self) -> Callable[..., MemoryTransport]:
        """The factory the suite calls, with its keyword options."""
        return self.open

    def session(self) -> MemorySession:
        """A caller's transaction on this store (the suite's ``join_session``)."""
        return MemorySession(self)

    def snapshot(self) -> tuple[Any, ...]:
        with self.lock:
            return copy.deepcopy(
                (
                    self.messages,
                    self.groups,
                    self.dead,
                    self.keys,
                    self.seq,
                    self.timers,
                    self.timer_tenants,
                    self.paused,
                    self.passes,
                    self.vtime,
                )
            )

    def restore(self, saved: tuple[Any, ...], keep_keys: bool = False) -> None:
        with self.lock:
            messages, groups, dead, keys, seq, *rest = copy.deepcopy(saved)
            self.messages, self.groups, self.dead, self.seq = messages, groups, dead, seq
            self.timers, self.timer_tenants, self.paused, self.passes, self.vtime = rest
            if not keep_keys:
                self.keys = keys
            self.changed.notify_all()


class MemorySession:
    """A caller's transaction, simulated: the store's state is saved before the first
    write made inside it, and put back on rollback. (Another handle sees those writes at
    once, which a real store would not show; the suite looks only after the end.)"""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.conn = self
        self._saved: tuple[Any, ...] | None = None

    def writing(self) -> None:
        if self._saved is None:
            self._saved = self.store.snapshot()

    def wrote(self) -> None:
        if self.store.defects.within_commits:
            self._saved = None

    def commit(self) -> None:
        saved, self._saved = self._saved, None
        if saved is not None and self.store.defects.within_never_applies:
            self.store.restore(saved)

    def rollback(self) -> None:
        saved, self._saved = self._saved, None
        if saved is not None:
            self.store.restore(saved, keep_keys=self.store.defects.within_keys_outside)

    def close(self) -> None:
        self.rollback()


class MemoryWithin:
    """``within(session)``: the transport's writing calls inside the session."""

    def __init__(self, transport: MemoryTransport, session: MemorySession) -> None:
        self._t, self._session = transport, session

    def _inside(self, call: Callable[[], Any]) -> Any:
        self._session.writing()
        value = call()
        self._session.wrote()
        return value

    def publish(self, group_id: str, event: object, priority: int = 0, **options: Any) -> int:
        seq: int = self._inside(lambda: self._t.publish(group_id, event, priority, **options))
        return seq

    def publish_many(
        self, items: Iterable[tuple[str, object, int] | dt.Message[object]]
    ) -> list[int]:
        seqs: list[int] = self._inside(lambda: self._t.publish_many(items))
        return seqs

    def ack(self, lease: dt.Lease[object]) -> None:
        unfenced = self._t._store.defects.within_unfenced
        self._inside(lambda: self._t._ack(lease, fenced=not unfenced))

    def nack(self, lease: dt.Lease[object], delay: float = 0) -> None:
        self._inside(lambda: self._t.nack(lease, delay))

    def bury(self, lease: dt.Lease[object], reason: str) -> None:
        self._inside(lambda: self._t.bury(lease, reason))


class MemoryTransport(core.Closing):
    def __init__(
        self,
        store: MemoryStore,
        *,
        event_type: Any = dt.Event,
        max_attempts: int | None = None,
        on_dead: str = "release",
        dedup_window: float = core.DEDUP_WINDOW,
    ) -> None:
        self._store = store
        self._window = core.check_seconds(dedup_window, "dedup_window")
        self._codec: core.EventCodec[Any] = core.EventCodec(event_type)
        self._decoder = (
            core.EventCodec(dt.Event) if store.defects.ignore_event_type else self._codec
        )
        self._max_attempts = core.check_max_attempts(max_attempts)
        self._hold = core.check_on_dead(on_dead) == "hold"
        self._closed = False
        if store.defects.reopen_loses_lapsed:
            now = store.clock()
            for m in store.messages.values():
                if m.holder not in (None, PARKED) and m.until < now:
                    m.holder = None

    # -- writing ---------------------------------------------------------------------

    def _append(self, item: core.Item) -> int:
        s = self._store
        if s.defects.seq_from_max:
            s.seq = max([*s.messages, *s.dead, *s.timers], default=0)
        s.seq += 1
        s.publishes += 1
        if s.defects.drop_every and s.publishes % s.defects.drop_every == 0:
            return s.seq
        m = _Message(s.seq, item.group_id, item.event, item.priority, ready_at=s.clock())
        hold = item.hold and not s.defects.hold_ignored
        if item.delay and not s.defects.early_delay:
            m.due, m.hold = s.clock() + item.delay, hold or s.defects.delay_holds
            if not s.defects.age_from_publish:
                m.ready_at = m.due
            if not m.hold:
                s.timers[m.seq] = m
                s.timer_tenants[m.seq] = item.tenant
                return m.seq
        self._enqueue(m, item.tenant)
        if not s.defects.deaf_wait:
            s.changed.notify_all()
        return s.seq

    def _enqueue(self, m: _Message, tenant: str | None) -> None:
        """Put ``m`` at the end of its group, creating the group (with ``m``'s priority
        and ``tenant``) if it has no messages."""
        s = self._store
        s.messages[m.seq] = m
        group = s.groups.setdefault(m.group, _Group(m.priority, m.seq, tenant=tenant))
        if s.defects.tenant_each_publish:
            group.tenant = tenant
        group.seqs.append(m.seq)

    def _promote(self) -> None:
        """Delayed messages that came due join the end of their groups, in due order, as
        if published now: run before anything looks at or appends to a group."""
        s = self._store
        now = s.clock()
        due = sorted((m.due, m.seq) for m in s.timers.values() if m.due <= now)
        for _, seq in due:
            m = s.timers.pop(seq)
            self._enqueue(m, s.timer_tenants.pop(seq))
            if s.defects.delay_keeps_place:
                s.groups[m.group].seqs.sort()

    def _keyed(self, group_id: str, key: str | None, known: Keys) -> int | None:
        """The original seq if ``key`` was used in ``group_id`` within the window, as
        ``known`` (the store's keys, or a copy of them) says; else None."""
        s = self._store
        if key is None or s.defects.ignore_keys:
            return None
        found = known.get(("" if s.defects.keys_across_groups else group_id, key))
        if found is None:
            return None
        seq, until = found
        if until <= s.clock() and not s.defects.eternal_keys:
            return None
        if s.defects.forget_key_on_ack and seq not in s.messages and seq not in s.dead:
            return None
        return seq

    def _publish(self, item: core.Item, known: Keys) -> int:
        s = self._store
        original = self._keyed(item.group_id, item.key, known)
        if original is not None:
            return dt.Duplicate(original)
        seq = self._append(item)
        if item.key is not None:
            scope = "" if s.defects.keys_across_groups else item.group_id
            s.keys[(scope, item.key)] = (seq, s.clock() + self._window)
        return seq

    def publish(
        self,
        group_id: str,
        event: object,
        priority: int = 0,
        *,
        key: str | None = None,
        delay: float = 0,
        hold: bool = False,
        tenant: str | None = None,
    ) -> int:
        item = self._codec.encode_item(group_id, event, priority, key, delay, hold, tenant)
        with self._locked():
            self._promote()
            return self._publish(item, self._store.keys)

    def publish_many(
        self, items: Iterable[tuple[str, object, int] | dt.Message[object]]
    ) -> list[int]:
        encoded = self._codec.encode_items(items)
        with self._locked():
            s = self._store
            self._promote()
            # The defect looks keys up in the store as it was before the batch.
            known = dict(s.keys) if s.defects.batch_keys_unseen else s.keys
            seqs = [self._publish(item, known) for item in encoded]
            if s.defects.batch_priority_last:
                for item in encoded:
                    if item.group_id in s.groups:
                        s.groups[item.group_id].priority = item.priority
            return seqs

    # -- claiming --------------------------------------------------------------------

    def _busy(self, m: _Message, now: float) -> bool:
        if m.holder is None:
            return False
        if self._store.defects.eternal_leases and m.holder != PARKED:
            return True
        return m.until + self._store.defects.grace >= now

    def _held(self, name: str) -> bool:
        return any(d.held and d.message.group == name for d in self._store.dead.values())

    def _pick(self, group: _Group, now: float) -> _Message | None:
        s = self._store
        order = [s.messages[seq] for seq in group.seqs]
        if s.defects.lifo:
            order.reverse()
        if s.defects.no_exclusivity:
            return next((m for m in order if not self._busy(m, now) and m.due <= now), None)
        if any(self._busy(m, now) for m in order):
            return None
        return order[0] if order[0].due <= now else None  # a held delay holds its group

    def _kill(self, m: _Message, reason: str, now: float, hold: bool) -> None:
        s = self._store
        del s.messages[m.seq]
        group = s.groups[m.group]
        group.seqs.remove(m.seq)
        if not group.seqs and not hold:
            del s.groups[m.group]
        m.holder, m.until = None, 0.0
        s.dead[m.seq] = _Dead(m, reason, now, hold)
        s.changed.notify_all()

    def _exhausted(self, m: _Message) -> bool:
        return self._max_attempts is not None and m.attempt - m.allowance >= self._max_attempts

    def _try_claim(
        self, worker_id: str, visibility: float, min_priority: int, unweighted: bool = False
    ) -> dt.Lease[Any] | None:
        s = self._store
        now = s.clock()
        if not s.defects.deaf_timers:
            self._promote()
        while True:
            ready = []
            for name, group in s.groups.items():
                if group.priority < min_priority and not s.defects.ignore_floor:
                    continue
                if not group.seqs or self._held(name):
                    continue
                if name in s.paused and not s.defects.pause_ignored:
                    continue
                picked = self._pick(group, now)
                if picked is not None:
                    key = (group.created,) if s.defects.fixed_order else (group.turn, picked.seq)
                    ready.append((key, name, picked))
            if not ready:
                return None
            tenant, start = self._tenant_turn({s.groups[name].tenant for _, name, _ in ready})
            if not (s.defects.unweighted or unweighted):
                ready = [r for r in ready if s.groups[r[1]].tenant == tenant]
            _, name, m = min(ready, key=lambda r: r[0])
            if self._exhausted(m):
                assert self._max_attempts is not None
                last: LastDelivery = "lapsed" if s.defects.says_lapsed or not m.nacked else "nacked"
                why = core.exhausted_reason(m.attempt - m.allowance, self._max_attempts, last)
                self._kill(m, why, now, self._hold)
                continue
            if s.defects.racy_claim:
                s.lock.release()  # another claim may pick the same message meanwhile
                time.sleep(0.0005)
                s.lock.acquire()
            s.claims += 1
            group = s.groups[name]
            group.turn, group.last_claimed_at = s.claims, now
            s.vtime = start
            s.passes[tenant] = start + 1 / s.weights.get(tenant or "", 1)
            m.attempt += 1
            m.holder, m.until, m.nacked = worker_id, now + visibility, False
            m.claimed_at = now
            try:
                return self._decoder.lease(m.seq, m.group, m.raw, worker_id, m.attempt, m.until)
            except dt.EventDecodeError:
                if s.defects.decode_unleased:
                    m.holder = None
                raise

    def _tenant_turn(self, tenants: set[str | None]) -> tuple[str | None, float]:
        """The tenant whose turn it is among ``tenants`` (those with a group to serve),
        and its start: the least of max(pass, virtual time), ties by name, None first."""
        s = self._store

        def start(tenant: str | None) -> float:
            kept = s.passes.get(tenant, 0.0)
            return kept if s.defects.tenant_catch_up else max(kept, s.vtime)

        chosen = min(tenants, key=lambda x: (start(x), x is not None, x or ""))
        return chosen, start(chosen)

    def _next_deadline(self) -> float | None:
        untils = [m.until for m in self._store.messages.values() if m.holder is not None]
        return min(untils) if untils else None

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> dt.Lease[Any] | None:
        worker_id, visibility = core.check_worker_id(worker_id), core.check_visibility(visibility)
        min_priority = core.check_priority(min_priority, "min_priority")
        wait = core.check_wait(wait)
        s = self._store
        ends = time.monotonic() + wait
        stubborn = s.defects.close_ignores_waiter
        if s.defects.deaf_wait and wait > 0:
            time.sleep(wait)
        with self._locked():
            lease = self._try_claim(worker_id, visibility, min_priority)
            while lease is None and (stubborn or not self._closed):
                left = ends - time.monotonic()
                if left <= 0:
                    break
                woken = False
                if s.defects.racy_wait_start:
                    s.lock.release()  # the window: a publish now notifies nobody
                    time.sleep(s.defects.racy_wait_start)
                    s.lock.acquire()
                    s.changed.wait(left)
                else:
                    woken = s.changed.wait(min(left, RECHECK))
                if self._closed and not stubborn:
                    return None
                lease = self._try_claim(worker_id, visibility, min_priority)
                if woken and s.defects.impatient_wait:
                    break
        return lease

    def claim_many(
        self,
        worker_id: str,
        visibility: float,
        limit: int,
        min_priority: int = 0,
        wait: float = 0,
    ) -> list[dt.Lease[Any]]:
        worker_id, visibility = core.check_worker_id(worker_id), core.check_visibility(visibility)
        min_priority = core.check_priority(min_priority, "min_priority")
        limit, wait = core.check_count(limit, "limit"), core.check_wait(wait)
        d = self._store.defects
        floor = 0 if d.many_ignores_floor else min_priority
        wait = 0 if d.many_no_wait else wait
        failed: list[dt.EventDecodeError] = []
        try:
            first = self.claim(worker_id, visibility, floor, wait)
        except dt.EventDecodeError as error:
            failed.append(error)
            first = None
        leases = [] if first is None else [first]
        with self._locked():
            while (leases or failed) and len(leases) + len(failed) < (1 if d.many_one else limit):
                try:
                    lease = self._try_claim(worker_id, visibility, floor, d.many_unweighted)
                except dt.EventDecodeError as error:
                    failed.append(error)
                    continue
                if lease is None:
                    break
                leases.append(lease)
                if self._store.clock() >= leases[0].expires_at:
                    break  # the batch's next claim would find its first lease lapsed
        if failed:
            head = failed[0]
            head.others = [] if d.many_decode_alone else [*leases, *(e.lease for e in failed[1:])]
            raise head
        return leases[::-1] if d.many_reversed else leases

    def settle_many(self, items: Iterable[dt.Settlement[object]]) -> list[dt.LeaseLost]:
        d = self._store.defects
        calls: list[Callable[[], None]] = []
        for item in items:
            if not isinstance(item, dt.Settlement):
                raise TypeError(f"settle_many takes Settlement values, not {item!r}")
            self._lease(item.lease)
            if item.action == "ack":
                calls.append(partial(self._ack, item.lease, not d.many_unfenced))
            elif item.action == "nack":
                calls.append(partial(self.nack, item.lease, core.check_delay(item.delay)))
            else:
                core.check_reason(item.reason)
                calls.append(partial(self.bury, item.lease, item.reason))
        stale = []
        for call in calls:
            try:
                call()
            except dt.LeaseLost as lost:
                if d.many_all_or_nothing:
                    raise
                stale.append(lost)
        return stale

    def ack_many(self, leases: Iterable[dt.Lease[object]]) -> list[dt.LeaseLost]:
        return self.settle_many([dt.Settlement(lease) for lease in leases])

    def ack_and_claim(
        self,
        lease: dt.Lease[object],
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        wait: float = 0,
    ) -> dt.Lease[Any] | None:
        core.check_wait(wait)
        try:
            self.ack(lease)
        except dt.LeaseLost:
            if not self._store.defects.claims_after_lost_ack:
                raise
        wait = 0 if self._store.defects.ack_claim_no_wait else wait
        return self.claim(worker_id, visibility, min_priority, wait)

    # -- settling --------------------------------------------------------------------

    def _lease(self, lease: dt.Lease[object]) -> None:
        # The defect stands for a backend that checks a lease's type but not its worker id.
        if self._store.defects.sentinel_lease and isinstance(lease, dt.Lease):
            return
        core.check_lease(lease)

    def _current(self, lease: dt.Lease[object], fenced: bool = True) -> _Message:
        if (
            lease.worker_id.startswith(core.RESERVED_PREFIX)
            and not self._store.defects.sentinel_lease
        ):
            raise ValueError(f"worker_id {lease.worker_id!r} is reserved")
        m = self._store.messages.get(lease.seq)
        if m is None:
            raise self._lost(lease, None)
        if fenced and (m.holder != lease.worker_id or m.attempt != lease.attempt):
            raise self._lost(lease, m)
        return m

    def _lost(self, lease: dt.Lease[object], m: _Message | None) -> dt.LeaseLost:
        """The `LeaseLost` of ``lease``, its reason read off ``m`` (None: gone)."""
        d = self._store.defects
        if d.lost_without_reason:
            return dt.LeaseLost(lease)
        reason: dt.LostReason = "foreign"
        if m is None or m.attempt < lease.attempt or d.lost_always_gone:
            reason = "gone"
        elif m.attempt > lease.attempt:
            reason = "redelivered"
        elif m.holder in (None, PARKED):
            reason = "released" if m.holder is None else "parked"
        return dt.LeaseLost(lease, reason)

    def within(self, conn: object) -> MemoryWithin:
        s = self._store
        if s.defects.no_join:
            raise core.cannot_join(self)
        if not isinstance(conn, MemorySession) or conn.store is not s:
            if not s.defects.within_takes_anything:
                raise TypeError(f"{self!r} joins a session of its own store, not {conn!r}")
            conn = MemorySession(s)  # its own transaction, never rolled back
        return MemoryWithin(self, conn)

    def ack(self, lease: dt.Lease[object]) -> None:
        self._ack(lease, fenced=True)

    def _ack(self, lease: dt.Lease[object], fenced: bool) -> None:
        self._lease(lease)
        with self._holding(notify=True) as s:
            m = self._current(lease, fenced and not s.defects.no_fencing)
            del s.messages[m.seq]
            group = s.groups[m.group]
            group.seqs.remove(m.seq)
            if not group.seqs and not self._held(m.group):
                del s.groups[m.group]
                if s.defects.pause_forgotten_on_drain:
                    s.paused.discard(m.group)

    def nack(self, lease: dt.Lease[object], delay: float = 0) -> None:
        self._lease(lease)
        delay = core.check_delay(delay)
        with self._holding(notify=True) as s:
            m = self._current(lease, not s.defects.no_fencing)
            if delay > 0 and not s.defects.ignore_park:
                start = m.claimed_at if s.defects.park_from_claim else s.clock()
                m.holder, m.until = PARKED, start + delay
            else:
                m.holder, m.until = None, 0.0
            if s.defects.age_restarts_on_nack:
                m.ready_at = s.clock()
            m.nacked = True

    def extend(self, lease: dt.Lease[Any], visibility: float) -> dt.Lease[Any]:
        self._lease(lease)
        visibility = core.check_visibility(visibility)
        with self._holding() as s:
            m = self._current(lease, not s.defects.no_fencing)
            m.until = s.clock() + visibility
            return replace(lease, expires_at=m.until)

    def bury(self, lease: dt.Lease[object], reason: str) -> None:
        self._lease(lease)
        reason = core.check_reason(reason)
        with self._holding() as s:
            m = self._current(lease, not (s.defects.no_fencing or s.defects.stale_bury))
            stored = reason if s.defects.plain_reason else core.buried_reason(reason)
            self._kill(m, stored, s.clock(), self._hold and not s.defects.bury_ignores_hold)

    # -- admin -----------------------------------------------------------------------

    def _state(self, m: _Message, now: float) -> str:
        if m.due > now and not self._store.defects.timers_uncounted:
            return "delayed"
        if m.holder is None or m.until < now:
            return "ready"
        return "parked" if m.holder == PARKED else "in_flight"

    def stats(self) -> dt.QueueStats:
        with self._holding() as s:
            self._promote()
            now = s.clock()
            counts: dict[int, dict[str, Any]] = {}
            zero = dict.fromkeys(("ready", "in_flight", "parked", "dead", "delayed"), 0)
            zero |= {"ready_groups": 0, "busy_groups": 0}
            oldest: dict[int, float] = {}
            for m in [*s.messages.values(), *s.timers.values()]:
                row = counts.setdefault(m.priority, dict(zero))
                state = self._state(m, now)
                row[state] += 1
                if state == "ready" or (s.defects.age_counts_leased and state != "delayed"):
                    oldest[m.priority] = min(oldest.get(m.priority, now), m.ready_at)
            for name, group in s.groups.items():
                if not group.seqs:
                    continue
                row = counts.setdefault(group.priority, dict(zero))
                head = s.messages[group.seqs[0]]
                free = self._state(head, now) == "ready" and not self._held(name)
                if name in s.paused and not s.defects.paused_groups_ready:
                    free = False
                if s.defects.groups_by_message and free:
                    row["ready_groups"] += sum(
                        self._state(s.messages[q], now) == "ready" for q in group.seqs
                    )
                else:
                    row["ready_groups" if free else "busy_groups"] += 1
            for d in s.dead.values():
                row = counts.setdefault(d.message.priority, dict(zero))
                row["dead"] += 1
            for p, at in oldest.items():
                counts[p]["oldest_ready_age"] = now - at
            by = tuple(dt.PriorityStats(p, **counts[p]) for p in sorted(counts))
            return core.queue_stats(by, len(s.keys), len(s.paused))

    def groups(self, limit: int = 10) -> list[dt.GroupInfo]:
        limit = core.check_limit(limit)
        with self._holding() as s:
            self._promote()
            now = s.clock()
            infos = []
            for name, group in s.groups.items():
                if not group.seqs:
                    continue
                head = s.messages[group.seqs[0]]
                state = "held" if self._held(name) else self._state(head, now)
                busy = head.until if state in ("in_flight", "parked") else None
                if state == "delayed":  # a held delay holds its group as a park does
                    state, busy = "parked", head.due
                infos.append(
                    dt.GroupInfo(
                        name,
                        group.priority,
                        len(group.seqs),
                        head.seq,
                        state,  # type: ignore[arg-type]
                        busy,
                        group.last_claimed_at,
                        name in s.paused,
                        group.tenant,
                    )
                )
            infos.sort(key=lambda g: (-g.depth, g.head_seq))
            return infos[:limit]

    def dead_letters(self, limit: int | None = None) -> list[dt.DeadLetter]:
        limit = None if limit is None else core.check_limit(limit)
        with self._locked():
            letters = [
                dt.DeadLetter(
                    d.message.seq,
                    d.message.group,
                    d.message.priority,
                    d.message.raw,
                    d.message.attempt,
                    d.reason,
                    d.dead_at,
                    d.held,
                )
                for _, d in sorted(self._store.dead.items())
            ]
            return letters if limit is None else letters[:limit]

    def held_groups(self) -> list[dt.HeldGroup]:
        with self._holding() as s:
            return [
                dt.HeldGroup(
                    d.message.group,
                    seq,
                    len(s.groups[d.message.group].seqs) if d.message.group in s.groups else 0,
                    d.dead_at,
                )
                for seq, d in sorted(s.dead.items())
                if d.held
            ]

    def requeue(self, seq: int) -> bool:
        seq = core.check_seq(seq)
        with self._holding(notify=True) as s:
            d = s.dead.get(seq)
            if d is None:
                return False
            m = d.message
            group = s.groups.get(m.group)
            if group is not None:
                for other in group.seqs:
                    held = s.messages[other]
                    if held.holder is not None and held.holder != PARKED:
                        raise dt.RequeueRefused(seq, m.group, held.holder)
            blocker = [k for k, o in s.dead.items() if o.held and o.message.group == m.group]
            if blocker and blocker[0] != seq:
                raise dt.RequeueRefused(seq, m.group, None, blocker[0])
            del s.dead[seq]
            m.allowance, m.ready_at = m.attempt, s.clock()
            s.messages[seq] = m
            group = s.groups.setdefault(m.group, _Group(m.priority, seq))
            if s.defects.requeue_at_tail:
                group.seqs.append(seq)
            else:
                group.seqs = sorted([*group.seqs, seq])
            return True

    def discard(self, seq: int) -> bool:
        seq = core.check_seq(seq)
        with self._holding(notify=True) as s:
            d = s.dead.pop(seq, None)
            if d is None:
                return False
            group = s.groups.get(d.message.group)
            if group is not None and not group.seqs and not self._held(d.message.group):
                del s.groups[d.message.group]
            return True

    def purge_group(self, group_id: str) -> int:
        group_id = core.check_group_id(group_id)
        with self._holding(notify=True) as s:
            group = s.groups.pop(group_id, None)
            removed = 0
            for seq in [k for k, m in s.timers.items() if m.group == group_id]:
                del s.timers[seq]
                removed += 1
            for seq in group.seqs if group is not None else []:
                del s.messages[seq]
                removed += 1
            for seq in [k for k, d in s.dead.items() if d.message.group == group_id]:
                del s.dead[seq]
                removed += 1
            return removed

    def cancel(self, seq: int) -> bool:
        seq = core.check_seq(seq)
        with self._holding(notify=True) as s:
            if s.timers.pop(seq, None) is not None:
                return True
            m = s.messages.get(seq)
            if m is None:
                return False
            leased = m.holder not in (None, PARKED) and m.until >= s.clock()
            if leased and not s.defects.cancel_in_flight:
                return False
            group = s.groups[m.group]
            if s.defects.cancel_in_seq_order and any(
                x > seq for x in group.seqs[: group.seqs.index(seq)]
            ):
                return False  # walks its group while seqs increase, so misses a late joiner
            del s.messages[seq]
            group.seqs.remove(seq)
            if not group.seqs and not self._held(m.group):
                del s.groups[m.group]
            return True

    def pause_group(self, group_id: str) -> bool:
        group_id = core.check_group_id(group_id)
        with self._holding() as s:
            changed = group_id not in s.paused
            s.paused.add(group_id)
            return changed

    def resume_group(self, group_id: str) -> bool:
        group_id = core.check_group_id(group_id)
        with self._holding(notify=True) as s:
            changed = group_id in s.paused
            s.paused.discard(group_id)
            return changed

    def paused_groups(self) -> list[str]:
        with self._holding() as s:
            return sorted(s.paused)

    def peek(self, group_id: str, limit: int = 10) -> list[dt.QueuedMessage]:
        group_id, limit = core.check_group_id(group_id), core.check_limit(limit)
        with self._holding() as s:
            self._promote()
            now = s.clock()
            group = s.groups.get(group_id)
            fifo = [s.messages[seq] for seq in group.seqs] if group is not None else []
            if fifo and s.defects.peek_claims:
                fifo[0].attempt += 1
            later = sorted((m for m in s.timers.values() if m.group == group_id), key=_due)
            shown = []
            for i, m in enumerate([*fifo, *later][:limit]):
                state = self._state(m, now)
                due: float | None = None
                if state == "delayed":
                    due = m.due
                elif i == 0 and state in ("in_flight", "parked"):
                    due = m.until
                elif i > 0 or self._held(group_id):
                    state = "queued"
                shown.append(
                    dt.QueuedMessage(m.seq, m.group, m.priority, m.raw, m.attempt, state, due)  # type: ignore[arg-type]
                )
            return shown

    def set_tenant_weight(self, tenant: str, weight: int) -> None:
        tenant, weight = core.check_tenant(tenant), core.check_weight(weight)
        with self._holding() as s:
            s.weights[tenant] = weight

    def tenants(self) -> list[dt.TenantInfo]:
        with self._holding() as s:
            self._promote()
            counts = Counter(g.tenant for g in s.groups.values() if g.seqs)
            names = set(counts) | set(s.weights)
            return [
                dt.TenantInfo(name, s.weights.get(name or "", 1), counts[name])
                for name in sorted(names, key=lambda x: (x is not None, x or ""))
            ]

    # -- lifecycle -------------------------------------------------------------------

    def _locked(self) -> threading.Lock:
        if self._closed:
            raise dt.TransportError("transport is closed")
        return self._store.lock

    @contextlib.contextmanager
    def _holding(self, notify: bool = False) -> Iterator[MemoryStore]:
        """The store, under its lock (refused once closed); with ``notify``, waiting
        claims are woken when the block ends without an error."""
        s = self._store
        with self._locked():
            yield s
            if notify:
                s.changed.notify_all()

    def close(self) -> None:
        with self._store.changed:
            self._closed = True
            self._store.changed.notify_all()


# -- a store in a file, for defects that only show across processes -----------------------

_IN_PROCESS = threading.Lock()


class FileTransport(core.Closing):
    """A JSON file as the store, opened by ``brokenfile:///PATH?defect=NAME``: each call
    reads, changes and replaces the whole file under an exclusive ``flock``. Only what the
    process scenarios use (publish and publish_many, with keys; claim, ack). Defects:
    ``process-lock`` takes a lock that only this process's threads respect, and
    ``unlocked`` reads under the lock but writes after letting go of it."""

    def __init__(self, path: str, defect: str) -> None:
        self._path, self._defect = path, defect
        self._codec: core.EventCodec[Any] = core.EventCodec(dt.Event)

    def _locked(self) -> Any:
        import fcntl

        @contextlib.contextmanager
        def hold() -> Any:
            if self._defect == "process-lock":
                with _IN_PROCESS:
                    yield
                return
            with open(self._path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

        return hold()

    def _read(self) -> dict[str, Any]:
        import json
        import os

        if not os.path.exists(self._path):
            return {"seq": 0, "messages": {}, "turns": {}, "claims": 0}
        with open(self._path) as f:
            state: dict[str, Any] = json.load(f)
        return state

    def _write(self, state: dict[str, Any]) -> None:
        import json
        import os

        temporary = f"{self._path}.{os.getpid()}.{threading.get_ident()}"
        with open(temporary, "w") as f:
            json.dump(state, f)
        os.replace(temporary, self._path)

    def _change(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        with self._locked():
            state = self._read()
            if self._defect != "unlocked":
                result = change(state)
                self._write(state)
                return result
        result = change(state)
        time.sleep(0.0005)
        with self._locked():
            self._write(state)
        return result

    def publish(
        self, group_id: str, event: object, priority: int = 0, *, key: str | None = None
    ) -> int:
        return self.publish_many([dt.Message(group_id, event, priority, key)])[0]

    def publish_many(
        self, items: Iterable[tuple[str, object, int] | dt.Message[object]]
    ) -> list[int]:
        encoded = self._codec.encode_items(items)

        def change(state: dict[str, Any]) -> list[int]:
            seqs: list[int] = []
            keys = state.setdefault("keys", {})  # "group key" -> seq; never forgotten
            for group, raw, _, key, *_ in encoded:
                scoped = f"{group} {key}"
                if key is not None and scoped in keys:
                    seqs.append(dt.Duplicate(keys[scoped]))
                    continue
                state["seq"] += 1
                state["messages"][str(state["seq"])] = [group, raw, 0, None, 0.0]
                if key is not None:
                    keys[scoped] = state["seq"]
                seqs.append(state["seq"])
            return seqs

        return list(self._change(change)) if encoded else []

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, wait: float = 0
    ) -> dt.Lease[Any] | None:
        core.check_worker_id(worker_id)

        def change(state: dict[str, Any]) -> tuple[Any, ...] | None:
            now = time.time()
            heads: dict[str, tuple[int, list[Any]]] = {}
            for key, m in state["messages"].items():
                if m[0] not in heads or int(key) < heads[m[0]][0]:
                    heads[m[0]] = (int(key), m)
            ready = [
                (state["turns"].get(g, 0), seq, g, m)
                for g, (seq, m) in heads.items()
                if m[3] is None or m[4] < now
            ]
            if not ready:
                return None
            _, seq, group, m = min(ready)
            state["claims"] += 1
            state["turns"][group] = state["claims"]
            m[2] += 1
            m[3], m[4] = worker_id, now + visibility
            return (seq, group, m[1], worker_id, m[2], m[4])

        got = self._change(change)
        return None if got is None else self._codec.lease(*got)

    def ack(self, lease: dt.Lease[object]) -> None:
        def change(state: dict[str, Any]) -> None:
            m = state["messages"].get(str(lease.seq))
            if m is None or (m[3], m[2]) != (lease.worker_id, lease.attempt):
                raise dt.LeaseLost(lease)
            del state["messages"][str(lease.seq)]

        self._change(change)

    def close(self) -> None:
        pass


def _open_file(url: str, event_type: object, options: Any) -> FileTransport:
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    return FileTransport(parts.path, parse_qs(parts.query).get("defect", [""])[0])


file_backend = core.Backend(open=_open_file)  # type: ignore[arg-type]  # contention calls only
