"""Core's operation shape and the code that runs it, with no store at all: `drive` and
`drive_async` over a list of replies, the wait plan of a blocking claim over a clock the
test moves, and `GiveBack` over asyncio futures the test resolves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence

import pytest

from transports_core.backend import (
    CLAIM,
    LOOK,
    MORE,
    Backoff,
    GiveBack,
    More,
    Operation,
    Steps,
    WaitState,
    drive,
    drive_async,
    wait_for,
    wait_plan,
)

# --- drive ------------------------------------------------------------------------------


class Echo(Operation[str, int, str]):
    """A first step whose reply decides: 0 goes on to the steps, 1 goes on with
    `Twice`, anything else is the value."""

    __slots__ = ()

    def first(self, now: float | None) -> str:
        return "first"

    def done(self, reply: int, now: float | None) -> str | More:
        if reply == 0:
            return MORE
        if reply == 1:
            return More(Twice())
        return f"first:{reply}"

    def steps(self, now: float | None) -> Steps[str, int, str]:
        a = yield "a"
        b = yield "b"
        if a == b:
            raise ValueError(f"the same reply twice: {a}")
        return f"steps:{a}+{b}@{now}"


class Twice(Operation[str, int, str]):
    __slots__ = ()

    def steps(self, now: float | None) -> Steps[str, int, str]:
        x = yield "x"
        return f"twice:{x}"


def run(
    op: Operation[str, int, str], replies: list[int], now: float | None = 1.5
) -> tuple[str, list[str]]:
    sent: list[str] = []
    it = iter(replies)

    def execute(step: str) -> int:
        sent.append(step)
        return next(it)

    return drive(op, now, execute), sent


def run_async(
    op: Operation[str, int, str], replies: list[int], now: float | None = 1.5
) -> tuple[str, list[str]]:
    sent: list[str] = []
    it = iter(replies)

    async def execute(step: str) -> int:
        await asyncio.sleep(0)
        sent.append(step)
        return next(it)

    return asyncio.run(drive_async(op, now, execute)), sent


Runner = Callable[[Operation[str, int, str], list[int]], tuple[str, list[str]]]


@pytest.mark.parametrize("runner", [run, run_async], ids=["sync", "async"])
def test_a_first_step_that_finishes_is_one_round_trip(runner: Runner) -> None:
    assert runner(Echo(), [7]) == ("first:7", ["first"])


@pytest.mark.parametrize("runner", [run, run_async], ids=["sync", "async"])
def test_more_goes_on_with_the_steps_of_the_same_operation(runner: Runner) -> None:
    assert runner(Echo(), [0, 2, 3]) == ("steps:2+3@1.5", ["first", "a", "b"])


@pytest.mark.parametrize("runner", [run, run_async], ids=["sync", "async"])
def test_more_with_then_goes_on_with_the_other_operation(runner: Runner) -> None:
    assert runner(Echo(), [1, 9]) == ("twice:9", ["first", "x"])


@pytest.mark.parametrize("runner", [run, run_async], ids=["sync", "async"])
def test_an_operation_without_a_first_step_runs_its_steps(runner: Runner) -> None:
    assert runner(Twice(), [4]) == ("twice:4", ["x"])


def test_an_error_raised_by_the_steps_reaches_the_caller() -> None:
    with pytest.raises(ValueError, match="the same reply twice: 5"):
        run(Echo(), [0, 5, 5])


def test_the_base_has_no_steps() -> None:
    with pytest.raises(NotImplementedError, match="Operation has no steps"):
        drive(Operation[str, int, str](), None, len)


# --- the wait plan ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def start(
    wait: float, clock: Clock, confirm: Sequence[float] = (), backoff: Backoff | None = None
) -> Generator[object, object, None]:
    plan = wait_plan(wait, clock, clock, confirm=confirm, backoff=backoff)
    assert next(plan) == LOOK
    return plan


def test_a_wake_up_that_changes_nothing_goes_back_to_sleep_until_the_wait_is_over() -> None:
    clock = Clock()
    plan = start(5.0, clock)
    assert plan.send(WaitState(1, None)) == CLAIM
    assert plan.send(False) == 1.0  # sleep: at most `recheck`
    clock.now += 0.1
    assert plan.send(True) == LOOK  # woken...
    assert plan.send(WaitState(1, None)) == 1.0  # ...by nothing: sleep again, no claim
    for _ in range(4):
        clock.now += 1.0
        assert plan.send(False) == LOOK
        step = plan.send(WaitState(1, None))
        assert step != CLAIM
    assert step == pytest.approx(0.9)
    clock.now += 0.9
    assert plan.send(False) == LOOK
    with pytest.raises(StopIteration):  # the wait's seconds have passed
        plan.send(WaitState(1, None))


def test_a_changed_version_is_worth_a_claim() -> None:
    clock = Clock()
    plan = start(5.0, clock)
    assert plan.send(WaitState(1, None)) == CLAIM
    assert plan.send(False) == 1.0
    assert plan.send(True) == LOOK
    assert plan.send(WaitState(2, None)) == CLAIM
    with pytest.raises(StopIteration):  # leased: the plan is over
        plan.send(True)


def test_a_due_lease_shortens_the_sleep_and_is_worth_a_claim_once_over() -> None:
    clock = Clock()
    plan = start(5.0, clock)
    assert plan.send(WaitState(1, clock.now + 0.3)) == CLAIM
    assert plan.send(False) == pytest.approx(0.3 + 0.002)
    clock.now += 0.302
    assert plan.send(False) == LOOK
    assert plan.send(WaitState(1, None)) == CLAIM


def test_a_due_time_already_past_when_looked_at_is_not_waited_for() -> None:
    clock = Clock()
    plan = start(5.0, clock)
    assert plan.send(WaitState(1, clock.now - 1)) == CLAIM
    assert plan.send(False) == 1.0


def test_confirming_looks_follow_a_wake_up_only() -> None:
    clock = Clock()
    plan = start(5.0, clock, confirm=(0.01, 0.02))
    assert plan.send(WaitState(1, None)) == CLAIM
    assert plan.send(False) == 1.0
    clock.now += 1.0
    assert plan.send(False) == LOOK  # not woken: no confirming looks
    assert plan.send(WaitState(1, None)) == 1.0
    assert plan.send(True) == LOOK  # woken: look again after each delay
    assert plan.send(WaitState(1, None)) == 0.01
    assert plan.send(False) == LOOK
    assert plan.send(WaitState(1, None)) == 0.02
    assert plan.send(False) == LOOK
    assert plan.send(WaitState(2, None)) == CLAIM


def test_a_backoff_caps_each_sleep_and_starts_over_after_a_change() -> None:
    clock = Clock()
    plan = start(5.0, clock, backoff=Backoff())
    assert plan.send(WaitState(1, None)) == CLAIM
    assert plan.send(False) == Backoff.FIRST
    assert plan.send(False) == LOOK
    assert plan.send(WaitState(1, None)) == 2 * Backoff.FIRST
    assert plan.send(False) == LOOK
    assert plan.send(WaitState(2, None)) == CLAIM
    assert plan.send(False) == Backoff.FIRST


def test_wait_for_returns_what_the_claim_leased_and_stops_once_closed() -> None:
    clock = Clock()
    claims = iter([None, "leased"])
    slept: list[float] = []

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return True

    versions = iter(range(10))
    got = wait_for(
        wait_plan(5.0, clock, clock),
        lambda: WaitState(next(versions), None),
        lambda: next(claims),
        sleep,
        lambda: False,
    )
    assert (got, slept) == ("leased", [1.0])
    closed = wait_for(
        wait_plan(5.0, clock, clock),
        lambda: WaitState(0, None),
        lambda: pytest.fail("claimed after close"),
        sleep,
        lambda: True,
    )
    assert closed is None


# --- a cancelled async claim ------------------------------------------------------------


def test_a_claim_not_cancelled_gives_nothing_back() -> None:
    given: list[str] = []

    async def give_back(value: str) -> None:
        given.append(value)

    async def main() -> str | None:
        back = GiveBack(give_back)
        got = await back.claim(asyncio.sleep(0, "leased"))
        await back.drain()
        return got

    assert asyncio.run(main()) == "leased"
    assert given == []


@pytest.mark.parametrize("leased", ["leased", None])
def test_a_cancelled_claim_ends_only_once_what_it_leased_is_given_back(
    leased: str | None,
) -> None:
    given: list[str] = []

    async def give_back(value: str) -> None:
        await asyncio.sleep(0)
        given.append(value)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        back: GiveBack[str] = GiveBack(give_back)
        store: asyncio.Future[str | None] = loop.create_future()
        task = asyncio.ensure_future(back.claim(store))
        await asyncio.sleep(0)
        task.cancel()
        loop.call_later(0.01, store.set_result, leased)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.done()  # the cancellation waited for the store's answer...
        assert given == ([] if leased is None else ["leased"])  # ...and the give-back

    asyncio.run(main())


def test_a_claim_cancelled_after_its_value_arrived_gives_it_back() -> None:
    given: list[str] = []

    async def give_back(value: str) -> None:
        given.append(value)

    async def main() -> None:
        back: GiveBack[str] = GiveBack(give_back)
        store: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(back.claim(store))
        await asyncio.sleep(0)
        store.set_result("leased")  # answered, but the task has not run again...
        task.cancel()  # ...when it is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        assert given == ["leased"]

    asyncio.run(main())


def test_a_second_cancellation_leaves_the_give_back_to_drain() -> None:
    given: list[str] = []

    async def give_back(value: str) -> None:
        await asyncio.sleep(0.01)
        given.append(value)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        back: GiveBack[str] = GiveBack(give_back)
        store: asyncio.Future[str | None] = loop.create_future()
        task = asyncio.ensure_future(back.claim(store))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()  # the caller gives up waiting for the give-back
        with pytest.raises(asyncio.CancelledError):
            await task
        assert given == []
        loop.call_later(0.01, store.set_result, "leased")
        await back.drain()  # returns only once the store answered and it was given back
        assert given == ["leased"]

    asyncio.run(main())


def test_a_failed_give_back_does_not_replace_the_cancellation() -> None:
    async def give_back(value: str) -> None:
        raise OSError("the store went away")

    async def main() -> None:
        back: GiveBack[str] = GiveBack(give_back)
        store: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(back.claim(store))
        await asyncio.sleep(0)
        store.set_result("leased")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await back.drain()

    asyncio.run(main())


def owed(back: GiveBack[str]) -> bool:
    return back.owed  # read anew each time: mypy would narrow the property itself


def test_patience_bounds_how_long_a_cancellation_waits_and_owed_says_what_is_left() -> None:
    given: list[str] = []

    async def give_back(value: str) -> None:
        given.append(value)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        back: GiveBack[str] = GiveBack(give_back, patience=0.01)
        store: asyncio.Future[str | None] = loop.create_future()  # a call stuck on a lock
        task = asyncio.ensure_future(back.claim(store))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)  # ends after `patience`, store still silent
        assert owed(back)
        assert given == []
        loop.call_later(0.01, store.set_result, "leased")
        await back.drain()
        assert not owed(back)
        assert given == ["leased"]

    asyncio.run(main())
