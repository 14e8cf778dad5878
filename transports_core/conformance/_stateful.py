"""The model-based scenario: hypothesis drives random publish / claim / ack / nack /
extend / time steps, and the batch calls (claim_many, settle_many, ack_and_claim),
against the backend and the `ReferenceModel`, and compares every result: which message
a claim returns (or None), its attempt and expiry, and LeaseLost.

The only module of the suite that imports hypothesis; without it the scenario skips,
naming the ``conformance`` extra.

Time moves by the suite's manual clock when the backend takes it. Otherwise it is real
time, and the machine keeps every claim unambiguous: before a claim it sleeps past any
deadline that falls too close to now, and it discards a step that ran too slowly to judge.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import pytest

try:
    from hypothesis import HealthCheck, Phase, assume, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        Bundle,
        MultipleResults,
        RuleBasedStateMachine,
        initialize,
        multiple,
        precondition,
        rule,
        run_state_machine_as_test,
    )
except ImportError as exc:  # the rest of the suite runs on pytest alone
    HYPOTHESIS_MISSING: str | None = str(exc)
else:
    HYPOTHESIS_MISSING = None

from transports_core import Event, Lease, LeaseLost, Message, Settlement, Transport

from ._base import (
    ADMIN,
    CONTROL,
    DURABLE,
    MULTI_HANDLE,
    TENANTS,
    TIMERS,
    ManualClock,
    SuiteBase,
    TransportFactory,
    checks,
)
from ._model import ModelLease, ReferenceModel, Stale
from ._properties import MODEL

NEEDS_HYPOTHESIS = (
    "the model-based scenario needs hypothesis, which is not installed: "
    "pip install 'durable-transports[conformance]'"
)


_runs = itertools.count()
# The actions the model test settles with in a batch (bury has its own scenarios).
_SETTLES: tuple[Literal["ack", "nack"], ...] = ("ack", "nack")


class _ManualTime:
    visibilities = (1.0, 2.0, 5.0)
    delays = (0.0, 0.0, 1.0, 3.0)
    handling = (0.0, 0.0, 0.5)  # time a handler takes before it nacks
    publish_delays = (1.0, 4.0)
    steps = (0.5, 1.5, 3.0, 6.0)
    slack = 0.01

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    def advance(self, seconds: float, deadlines: list[float]) -> None:
        # Never stop right at a deadline: which side of it "now" is would be a coin toss.
        target = self.now() + seconds
        while any(abs(target - d) < 0.01 for d in deadlines):
            target += 0.05
        self.clock.advance_to(target)

    def before_claim(self, deadlines: list[float]) -> None:
        pass

    def judgeable(self, started: float, ended: float) -> bool:
        return True


class _RealTime:
    visibilities = (0.6, 60.0)
    delays = (0.0, 0.0, 0.6)
    handling = (0.0,)
    publish_delays = (0.6,)
    steps = (0.7,)
    slack = 0.05
    SLOW = 0.1  # a step that takes longer cannot be judged against the model
    GUARD = 0.3  # a deadline closer than this to a claim is waited out first

    def now(self) -> float:
        return time.time()

    def advance(self, seconds: float, deadlines: list[float]) -> None:
        now = time.time()
        passing = [d for d in deadlines if d <= now + seconds]
        if passing:
            self._sleep_past(max(passing))

    def before_claim(self, deadlines: list[float]) -> None:
        now = time.time()
        near = [d for d in deadlines if now - self.slack - self.SLOW < d < now + self.GUARD]
        if near:
            self._sleep_past(max(near))

    def judgeable(self, started: float, ended: float) -> bool:
        return ended - started < self.SLOW

    def _sleep_past(self, deadline: float) -> None:
        while (left := deadline + self.slack + self.SLOW - time.time()) > 0:
            time.sleep(left)


def _describe(lease: Lease[Any] | None, keys: dict[int, int]) -> str:
    if lease is None:
        return "None"
    return (
        f"message #{keys.get(lease.seq, '?')} (seq {lease.seq}) of {lease.group_id!r}, "
        f"attempt {lease.attempt}"
    )


def _expected(want: ModelLease | None, prefix: str) -> str:
    if want is None:
        return "None"
    return f"message #{want.key} of {prefix + want.group!r}, attempt {want.attempt}"


def check_against_model(
    store: Callable[[], TransportFactory],
    count: int,
    durable: bool,
    clock: ManualClock | None,
    examples: int,
    steps: int,
    shrink: bool = True,
    fresh: bool = True,
    features: frozenset[str] = frozenset(),
) -> None:
    """``store()`` gives, for each example, a factory of ``count`` handles on one store:
    a fresh, empty store when ``fresh``, else the same one, emptied after each example.
    Every handle opened here is closed here: per example when ``fresh``, else the one
    set of handles all examples share, at the end of the run. ``features`` are the
    capabilities among ``timers``, ``tenants`` and ``group-control`` (with ``admin``)
    whose steps join the others."""
    timers, tenants, control = (c in features for c in (TIMERS, TENANTS, CONTROL))
    timing: _ManualTime | _RealTime = _ManualTime(clock) if clock is not None else _RealTime()
    workers = st.sampled_from(["w1", "w2", "w3"])
    groups = st.sampled_from("abcd")
    priorities = st.sampled_from([0, 0, 0, 1, 3, 4])
    via = st.integers(0, count - 1)
    tenant_names = st.sampled_from([None, None, "t1", "t2"]) if tenants else st.just(None)
    # (delay, hold) of a publish: most are due at once.
    later = (
        st.tuples(st.sampled_from((0.0, 0.0, *timing.publish_delays)), st.booleans())
        if timers
        else st.just((0.0, False))
    )

    class Machine(RuleBasedStateMachine):
        leases: ClassVar[Bundle[Lease[Event]]] = Bundle("leases")

        def __init__(self) -> None:
            super().__init__()
            self.factory = store()
            self.handles: list[Transport[Any]] = [self.factory() for _ in range(count)]
            self.model = ReferenceModel()
            self.keys: dict[int, int] = {}  # backend seq -> model key
            self.last_seq = 0
            self.prefix = f"m{next(_runs)}-"
            self.live: dict[tuple[int, str, int], Lease[Event]] = {}

        def key(self, lease: Lease[Event]) -> int:
            assert lease.seq in self.keys, f"{MODEL}: seq {lease.seq} was never published here"
            return self.keys[lease.seq]

        @initialize(
            batch=st.lists(
                st.tuples(groups, priorities, tenant_names, later), min_size=4, max_size=12
            ),
        )
        def seed(self, batch: list[tuple[str, int, str | None, tuple[float, bool]]]) -> None:
            # Start from a backlog: from an empty store most steps would claim nothing. Its
            # groups get their tenants and delays here too, so that a delayed message or a
            # tenant's share comes to the head of a group within a few steps.
            for group, priority, tenant, when in batch:
                self.publish(group, priority, 0, tenant, when)

        def tenant(self, name: str | None) -> str | None:
            if name is None and (fresh or not tenants):
                return None
            # The default tenant's share of turns outlives an example on a shared store,
            # where the model would start it afresh: there each example has its own.
            return self.prefix + (name or "t0")

        @rule(
            group=groups,
            priority=priorities,
            handle=via,
            tenant=tenant_names,
            later=later,
        )
        def publish(
            self,
            group: str,
            priority: int,
            handle: int,
            tenant: str | None,
            later: tuple[float, bool],
        ) -> None:
            delay, hold = later
            now = timing.now()
            options: dict[str, Any] = {"tenant": self.tenant(tenant)}
            if delay:
                options.update(delay=delay, hold=hold)
            key = self.model.publish(group, priority, now, **options)
            seq = self.handles[handle].publish(
                self.prefix + group, Event(n=key), priority, **options
            )
            assert seq > self.last_seq, f"{MODEL}: publish returned seq {seq} after {self.last_seq}"
            self.last_seq = seq
            self.keys[seq] = key

        @precondition(lambda self: control)
        @rule(group=groups, paused=st.booleans(), handle=via)
        def pause(self, group: str, paused: bool, handle: int) -> None:
            admin: Any = self.handles[handle]
            call = admin.pause_group if paused else admin.resume_group
            changed = call(self.prefix + group)
            expected = self.model.pause(group, paused)
            assert changed == expected, (
                f"{MODEL}: {'pause' if paused else 'resume'}_group({group!r}) said {changed}, "
                f"the model {expected}"
            )

        @precondition(lambda self: tenants)
        @rule(tenant=st.sampled_from(["t1", "t2"]), weight=st.sampled_from([1, 2, 5]))
        def set_tenant_weight(self, tenant: str, weight: int) -> None:
            admin: Any = self.handles[0]
            admin.set_tenant_weight(self.prefix + tenant, weight)
            self.model.set_weight(self.prefix + tenant, weight)

        @rule(
            target=leases,
            worker=workers,
            visibility=st.sampled_from(timing.visibilities),
            min_priority=st.sampled_from([0, 0, 0, 2, 4]),
            handle=via,
        )
        def claim(
            self, worker: str, visibility: float, min_priority: int, handle: int
        ) -> Lease[Event] | MultipleResults[Lease[Event]]:
            timing.before_claim(self.model.deadlines())
            started = timing.now()
            got = self.handles[handle].claim(worker, visibility, min_priority)
            assume(timing.judgeable(started, timing.now()))
            want = self.model.claim(worker, started, visibility, min_priority)
            call = f"claim({worker!r}, {visibility}, min_priority={min_priority})"
            self.agree(got, want, worker, call, started)
            return multiple() if got is None else got

        def agree(
            self,
            got: Lease[Event] | None,
            want: ModelLease | None,
            worker: str,
            call: str,
            started: float,
        ) -> None:
            """A lease from the backend is the model's, and is kept for later steps."""
            same = (
                got is None
                if want is None
                else got is not None
                and (self.keys.get(got.seq), got.group_id, got.attempt, got.worker_id)
                == (want.key, self.prefix + want.group, want.attempt, worker)
            )
            assert same, (
                f"{MODEL}: {call} returned {_describe(got, self.keys)}; the model expected "
                f"{_expected(want, self.prefix)}"
            )
            if got is None or want is None:
                return
            assert got.event == Event(n=want.key), f"{MODEL}: {call} gave event {got.event!r}"
            assert (
                -timing.slack
                <= got.expires_at - want.expires_at
                <= timing.slack + (timing.now() - started)
            ), f"{MODEL}: {call} gave expires_at {got.expires_at}, expected {want.expires_at}"
            self.live[(want.key, worker, want.attempt)] = got

        @rule(
            target=leases,
            worker=workers,
            visibility=st.sampled_from(timing.visibilities),
            min_priority=st.sampled_from([0, 0, 2]),
            limit=st.integers(1, 4),
            handle=via,
        )
        def claim_many(
            self, worker: str, visibility: float, min_priority: int, limit: int, handle: int
        ) -> MultipleResults[Lease[Event]]:
            timing.before_claim(self.model.deadlines())
            started = timing.now()
            got = self.handles[handle].claim_many(worker, visibility, limit, min_priority)
            assume(timing.judgeable(started, timing.now()))
            wants: list[ModelLease] = []
            while len(wants) < limit:
                want = self.model.claim(worker, started, visibility, min_priority)
                if want is None:
                    break
                wants.append(want)
            call = f"claim_many({worker!r}, {visibility}, {limit}, min_priority={min_priority})"
            assert len(got) == len(wants), (
                f"{MODEL}: {call} returned {[_describe(g, self.keys) for g in got]}; the model "
                f"expected {[_expected(w, self.prefix) for w in wants]}"
            )
            for one, want in zip(got, wants, strict=True):
                self.agree(one, want, worker, call, started)
            return multiple(*got)

        @rule(
            target=leases,
            worker=workers,
            visibility=st.sampled_from(timing.visibilities),
            handle=via,
        )
        def claim_any(
            self, worker: str, visibility: float, handle: int
        ) -> Lease[Event] | MultipleResults[Lease[Event]]:
            # Claims without a floor, as often again: the steps above mostly add work.
            return self.claim(worker, visibility, 0, handle)

        def settle(self, lease: Lease[Event], action: str, backend: Any, model: Any) -> Any:
            expected_lost = False
            try:
                result = model()
            except Stale:
                expected_lost = True
            try:
                value = backend()
            except LeaseLost:
                assert expected_lost, (
                    f"{MODEL}: {action} on {_describe(lease, self.keys)} held by "
                    f"{lease.worker_id!r} raised LeaseLost; the lease is current in the model"
                )
                return None
            assert not expected_lost, (
                f"{MODEL}: {action} on {_describe(lease, self.keys)} held by "
                f"{lease.worker_id!r} succeeded; the lease is stale in the model, so it must "
                "raise LeaseLost"
            )
            return value if result is None else (value, result)

        @rule(lease=leases, handle=via)
        def ack(self, lease: Lease[Event], handle: int) -> None:
            key = self.key(lease)
            self.settle(
                lease,
                "ack",
                lambda: self.handles[handle].ack(lease),
                lambda: self.model.ack(key, lease.worker_id, lease.attempt),
            )

        @rule(
            lease=leases,
            delay=st.sampled_from(timing.delays),
            handling=st.sampled_from(timing.handling),
            handle=via,
        )
        def nack(self, lease: Lease[Event], delay: float, handling: float, handle: int) -> None:
            key = self.key(lease)
            if handling:
                # The handler worked a while first: a park counts from the nack, not the claim.
                timing.advance(handling, self.model.deadlines())
            now = timing.now()
            self.settle(
                lease,
                f"nack(delay={delay})",
                lambda: self.handles[handle].nack(lease, delay),
                lambda: self.model.nack(key, lease.worker_id, lease.attempt, now, delay),
            )

        @rule(
            items=st.lists(
                st.tuples(leases, st.sampled_from(_SETTLES), st.sampled_from(timing.delays)),
                min_size=1,
                max_size=3,
            ),
            handle=via,
        )
        def settle_many(
            self, items: list[tuple[Lease[Event], Literal["ack", "nack"], float]], handle: int
        ) -> None:
            now = timing.now()
            settlements: list[Settlement[object]] = []
            expected: list[Lease[Event]] = []
            for lease, action, delay in items:
                key, worker, attempt = self.key(lease), lease.worker_id, lease.attempt
                try:
                    if action == "ack":
                        self.model.ack(key, worker, attempt)
                    else:
                        self.model.nack(key, worker, attempt, now, delay)
                except Stale:
                    expected.append(lease)
                delay = delay if action == "nack" else 0.0
                settlements.append(Settlement(lease, action, delay))
            stale = [lost.lease for lost in self.handles[handle].settle_many(settlements)]
            assert stale == expected, (
                f"{MODEL}: settle_many of {[(_describe(x, self.keys), a) for x, a, _ in items]} "
                f"reported {[_describe(x, self.keys) for x in stale]} stale; the model "
                f"{[_describe(x, self.keys) for x in expected]}"
            )

        @rule(
            target=leases,
            lease=leases,
            worker=workers,
            visibility=st.sampled_from(timing.visibilities),
            handle=via,
        )
        def ack_and_claim(
            self, lease: Lease[Event], worker: str, visibility: float, handle: int
        ) -> Lease[Event] | MultipleResults[Lease[Event]]:
            key = self.key(lease)
            timing.before_claim(self.model.deadlines())
            started = timing.now()
            call = f"ack_and_claim({_describe(lease, self.keys)}, {worker!r}, {visibility})"
            try:
                got = self.handles[handle].ack_and_claim(lease, worker, visibility)
            except LeaseLost:
                got, lost = None, True
            else:
                lost = False
            assume(timing.judgeable(started, timing.now()))
            try:
                self.model.ack(key, lease.worker_id, lease.attempt)
            except Stale:
                assert lost, f"{MODEL}: {call} succeeded; the lease is stale in the model"
                return multiple()
            assert not lost, f"{MODEL}: {call} raised LeaseLost; the lease is current"
            self.agree(got, self.model.claim(worker, started, visibility, 0), worker, call, started)
            return multiple() if got is None else got

        @rule(
            target=leases,
            lease=leases,
            visibility=st.sampled_from(timing.visibilities),
            handle=via,
        )
        def extend(
            self, lease: Lease[Event], visibility: float, handle: int
        ) -> Lease[Event] | MultipleResults[Lease[Event]]:
            key = self.key(lease)
            now = timing.now()
            outcome = self.settle(
                lease,
                f"extend({visibility})",
                lambda: self.handles[handle].extend(lease, visibility),
                lambda: self.model.extend(key, lease.worker_id, lease.attempt, now, visibility),
            )
            if outcome is None:
                return multiple()
            renewed, expected = outcome
            assert abs(renewed.expires_at - expected) <= timing.slack + (timing.now() - now), (
                f"{MODEL}: extend({visibility}) gave expires_at {renewed.expires_at}, "
                f"expected {expected}"
            )
            self.live[(key, lease.worker_id, lease.attempt)] = renewed
            return multiple(renewed)

        @rule(seconds=st.sampled_from(timing.steps))
        def let_time_pass(self, seconds: float) -> None:
            timing.advance(seconds, self.model.deadlines())

        @rule(
            batch=st.lists(st.tuples(groups, priorities, tenant_names), min_size=1, max_size=4),
            handle=via,
        )
        def publish_many(self, batch: list[tuple[str, int, str | None]], handle: int) -> None:
            now = timing.now()  # due delayed messages join their groups first, as in publish
            keys = [
                self.model.publish(group, priority, now, tenant=self.tenant(tenant))
                for group, priority, tenant in batch
            ]
            items = [
                Message(self.prefix + group, Event(n=key), priority, tenant=self.tenant(tenant))
                for (group, priority, tenant), key in zip(batch, keys, strict=True)
            ]
            seqs = self.handles[handle].publish_many(items)
            assert (len(seqs), seqs) == (len(keys), sorted(seqs)), (
                f"{MODEL}: publish_many of {len(keys)} items returned seqs {seqs}"
            )
            assert seqs[0] > self.last_seq, (
                f"{MODEL}: publish_many returned seq {seqs[0]} after {self.last_seq}"
            )
            self.last_seq = seqs[-1]
            self.keys.update(zip(seqs, keys, strict=True))

        @precondition(lambda self: durable)
        @rule()
        def reopen(self) -> None:
            # Every handle closed, then as many opened again: a durable store keeps it all.
            for transport in self.handles:
                transport.close()
            self.handles = [self.factory() for _ in range(count)]

        @precondition(lambda self: clock is not None and bool(self.model.deadlines()))
        @rule(pick=st.integers(0, 100), after=st.booleans())
        def to_the_edge_of_a_deadline(self, pick: int, after: bool) -> None:
            # A millisecond either side of a lease's expiry or a park's end.
            assert clock is not None
            ahead = sorted(d for d in self.model.deadlines() if d > clock.now() + 0.002)
            if ahead:
                clock.advance_to(ahead[pick % len(ahead)] + (0.001 if after else -0.001))

        def teardown(self) -> None:
            if fresh:
                for handle in self.handles:
                    handle.close()
                return
            # Give everything back, so that the next example starts from an empty store.
            transport = self.handles[0]
            if timers or control:
                admin: Any = transport
                for group in "abcd":
                    admin.resume_group(self.prefix + group)
                    admin.purge_group(self.prefix + group)
                return
            for key, worker, attempt in self.model.current():
                lease = self.live.get((key, worker, attempt))
                if lease is not None:
                    with contextlib.suppress(LeaseLost):
                        transport.ack(lease)
                    self.model.ack(key, worker, attempt)
            deadlines = self.model.deadlines()
            if deadlines:
                timing.advance(max(deadlines) - timing.now() + 1, deadlines)
            for _ in range(len(self.model) + 20):
                lease = transport.claim("model-cleanup", 3600)
                if lease is None:
                    break
                with contextlib.suppress(LeaseLost):
                    transport.ack(lease)

    # On a shared store the examples take turns with one set of handles: a set opened for
    # each example and left open would add up to more connections than a server takes.
    # (`Machine` is left as it is: its source seeds the derandomized examples.)
    shared: list[Transport[Any]] = []
    try:
        if not fresh:
            on_store = store()
            shared.extend(on_store() for _ in range(count))
            turns = itertools.cycle(shared)

            def store() -> TransportFactory:
                return lambda **options: next(turns)

        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                derandomize=True,
                database=None,
                print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                phases=tuple(Phase) if shrink else tuple(p for p in Phase if p is not Phase.shrink),
            ),
        )
    finally:
        for handle in shared:
            handle.close()


class ModelScenarios(SuiteBase):
    # Examples x steps for the model-based test; raise them for a deeper (slower) search.
    model_examples: ClassVar[int] = 40
    model_steps: ClassVar[int] = 40
    # Without the clock capability every lapse is a real sleep, so fewer and shorter runs.
    real_time_model_examples: ClassVar[int] = 8
    real_time_model_steps: ClassVar[int] = 20
    # Shrinking turns a failure into a short reproduction, at the price of time.
    model_shrink: ClassVar[bool] = True

    @pytest.fixture
    def make_store(self) -> Callable[[], TransportFactory] | None:
        """Override to give the model-based test a fresh store for each example: return a
        callable that makes a new, empty store and returns a factory of handles on it.
        Without it (None) every example runs on the test's store, emptied in between,
        where a broken backend's leftovers can spill into the next example."""
        return None

    @checks(MODEL)
    def test_model_agreement_random_operations(
        self, make_store: Callable[[], TransportFactory] | None
    ) -> None:
        if HYPOTHESIS_MISSING is not None:
            pytest.skip(f"{NEEDS_HYPOTHESIS} ({HYPOTHESIS_MISSING})")
        count = 2 if self.has(MULTI_HANDLE) else 1
        fresh = make_store is not None and not self.shared_store
        store = make_store if make_store is not None and fresh else (lambda: self.open)
        # Reopening a shared store would close the handles the test itself keeps.
        durable = self.has(DURABLE) and fresh
        if self._clock is not None:
            examples, steps = self.model_examples, self.model_steps
        else:
            examples, steps = self.real_time_model_examples, self.real_time_model_steps
        # Timers on a shared store need admin to clear them between examples.
        features = frozenset(
            c
            for c in (TIMERS, TENANTS, CONTROL)
            if self.has(c) and (self.has(ADMIN) or (c == TIMERS and fresh))
        )
        check_against_model(
            store, count, durable, self._clock, examples, steps, self.model_shrink, fresh, features
        )
