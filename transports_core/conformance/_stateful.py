"""The model-based scenario: hypothesis drives random publish / claim / ack / nack /
extend / time steps against the backend and the `ReferenceModel`, and compares every
result: which message claim returns (or None), its attempt and expiry, and LeaseLost.

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
from typing import Any, ClassVar

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
        rule,
        run_state_machine_as_test,
    )
except ImportError as exc:  # the rest of the suite runs on pytest alone
    HYPOTHESIS_MISSING: str | None = str(exc)
else:
    HYPOTHESIS_MISSING = None

from transports_core import Event, Lease, LeaseLost, Transport

from ._base import MULTI_HANDLE, ManualClock, SuiteBase, checks
from ._model import Delivery, ReferenceModel, Stale
from ._properties import MODEL

NEEDS_HYPOTHESIS = (
    "the model-based scenario needs hypothesis, which is not installed: "
    "pip install 'durable-transports[conformance]'"
)


_runs = itertools.count()


class _ManualTime:
    visibilities = (1.0, 2.0, 5.0)
    delays = (0.0, 0.0, 1.0, 3.0)
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


def _describe(lease: Lease[Event] | None, keys: dict[int, int]) -> str:
    if lease is None:
        return "None"
    return (
        f"message #{keys.get(lease.seq, '?')} (seq {lease.seq}) of {lease.group_id!r}, "
        f"attempt {lease.attempt}"
    )


def _expected(want: Delivery | None, prefix: str) -> str:
    if want is None:
        return "None"
    return f"message #{want.key} of {prefix + want.group!r}, attempt {want.attempt}"


def check_against_model(
    handles: list[Transport[Event]],
    clock: ManualClock | None,
    examples: int,
    steps: int,
    shrink: bool = True,
) -> None:
    timing: _ManualTime | _RealTime = _ManualTime(clock) if clock is not None else _RealTime()
    workers = st.sampled_from(["w1", "w2", "w3"])
    groups = st.sampled_from("abcd")
    priorities = st.sampled_from([0, 0, 0, 1, 3, 4])
    via = st.integers(0, len(handles) - 1)

    class Machine(RuleBasedStateMachine):
        leases: ClassVar[Bundle[Lease[Event]]] = Bundle("leases")

        def __init__(self) -> None:
            super().__init__()
            self.model = ReferenceModel()
            self.keys: dict[int, int] = {}  # backend seq -> model key
            self.last_seq = 0
            self.prefix = f"m{next(_runs)}-"
            self.live: dict[tuple[int, str, int], Lease[Event]] = {}

        def key(self, lease: Lease[Event]) -> int:
            assert lease.seq in self.keys, f"{MODEL}: seq {lease.seq} was never published here"
            return self.keys[lease.seq]

        @initialize(
            batch=st.lists(st.tuples(groups, priorities), min_size=4, max_size=12),
        )
        def seed(self, batch: list[tuple[str, int]]) -> None:
            # Start from a backlog: from an empty store most steps would claim nothing.
            for group, priority in batch:
                self.publish(group, priority, 0)

        @rule(group=groups, priority=priorities, handle=via)
        def publish(self, group: str, priority: int, handle: int) -> None:
            key = self.model.publish(group, priority)
            seq = handles[handle].publish(self.prefix + group, Event(n=key), priority)
            assert seq > self.last_seq, f"{MODEL}: publish returned seq {seq} after {self.last_seq}"
            self.last_seq = seq
            self.keys[seq] = key

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
            got = handles[handle].claim(worker, visibility, min_priority)
            assume(timing.judgeable(started, timing.now()))
            want = self.model.claim(worker, started, visibility, min_priority)
            call = f"claim({worker!r}, {visibility}, min_priority={min_priority})"
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
                return multiple()
            assert got.event == Event(n=want.key), f"{MODEL}: {call} gave event {got.event!r}"
            assert (
                -timing.slack
                <= got.expires_at - want.expires_at
                <= timing.slack + (timing.now() - started)
            ), f"{MODEL}: {call} gave expires_at {got.expires_at}, expected {want.expires_at}"
            self.live[(want.key, worker, want.attempt)] = got
            return got

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
                lambda: handles[handle].ack(lease),
                lambda: self.model.ack(key, lease.worker_id, lease.attempt),
            )

        @rule(lease=leases, delay=st.sampled_from(timing.delays), handle=via)
        def nack(self, lease: Lease[Event], delay: float, handle: int) -> None:
            key = self.key(lease)
            now = timing.now()
            self.settle(
                lease,
                f"nack(delay={delay})",
                lambda: handles[handle].nack(lease, delay),
                lambda: self.model.nack(key, lease.worker_id, lease.attempt, now, delay),
            )

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
                lambda: handles[handle].extend(lease, visibility),
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

        def teardown(self) -> None:
            # Give everything back, so that the next example starts from an empty store.
            transport = handles[0]
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


class ModelScenarios(SuiteBase):
    # Examples x steps for the model-based test; raise them for a deeper (slower) search.
    model_examples: ClassVar[int] = 30
    model_steps: ClassVar[int] = 30
    # Without the clock capability every lapse is a real sleep, so fewer and shorter runs.
    real_time_model_examples: ClassVar[int] = 8
    real_time_model_steps: ClassVar[int] = 20
    # Shrinking turns a failure into a short reproduction, at the price of time.
    model_shrink: ClassVar[bool] = True

    @checks(MODEL)
    def test_model_agreement_random_operations(self) -> None:
        if HYPOTHESIS_MISSING is not None:
            pytest.skip(f"{NEEDS_HYPOTHESIS} ({HYPOTHESIS_MISSING})")
        handles = [self.open(), self.open()] if self.has(MULTI_HANDLE) else [self.open()]
        if self._clock is not None:
            check_against_model(
                handles, self._clock, self.model_examples, self.model_steps, self.model_shrink
            )
        else:
            check_against_model(
                handles,
                None,
                self.real_time_model_examples,
                self.real_time_model_steps,
                self.model_shrink,
            )
