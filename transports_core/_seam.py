"""The one shape every backend's operations take, and the code that runs them.

An `Operation` is one call of the contract, its arguments checked when it is built. It
does no I/O and reads no clock: it says what to send to the store (a *step*: a
statement, a pipelined batch, a script call, whatever the backend's driver sends in one
round trip), is handed what came back (a *reply*), decides, and ends with the call's
value or an error such as `LeaseLost`. The backend supplies the steps and how to make
sense of replies; core supplies the loop that runs them, once for blocking code
(`drive`) and once for asyncio (`drive_async`), as psycopg runs its generators under
both ``Connection`` and ``AsyncConnection``.

Around that loop, three decisions every backend would otherwise make on its own:

* `wait_plan`: when a claim that may wait tries again, how long it sleeps, and what is
  worth waking for, driven by `wait_for` and `wait_for_async` over the backend's look,
  claim and sleep;
* `GiveBack`: what happens to a message that an async claim leased after its task was
  cancelled (it is given back at once, with its delivery uncounted);
* `ReuseLast` (in `_base`): the claim cache.

Imports nothing of the library but `_errors`; knows nothing of any backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Sequence
from typing import Any, Final, Generic, Literal, NamedTuple, TypeVar

__all__ = [
    "AFTER_DUE",
    "CLAIM",
    "LOOK",
    "MORE",
    "Backoff",
    "GiveBack",
    "More",
    "Operation",
    "Steps",
    "WaitState",
    "WaitStep",
    "drive",
    "drive_async",
    "wait_for",
    "wait_for_async",
    "wait_plan",
]

S = TypeVar("S")  # a step: what one round trip sends
R = TypeVar("R")  # a reply: what that round trip brought back
T = TypeVar("T")  # the operation's value
C = TypeVar("C")  # what a claim leased

Steps = Generator[S, R, T]


class More:
    """What `Operation.done` answers when its first step did not finish the call: the
    driver goes on with ``then`` (its first step if it has one, else its steps) or, when
    ``then`` is None, with the operation's own `Operation.steps`. Operations may be
    shared between threads (see `ReuseLast`), so whatever the first step taught travels
    here, in a new operation, never on the shared one."""

    __slots__ = ("then",)

    # Any: the operation that goes on sends the same kind of steps as the one that
    # answered, which the type of a sentinel shared by every backend cannot say.
    def __init__(self, then: Operation[Any, Any, Any] | None = None) -> None:
        self.then = then

    def __repr__(self) -> str:
        return "MORE" if self.then is None else f"More({self.then!r})"


MORE: Final = More()


class Operation(Generic[S, R, T]):
    """One call, checked and ready to run: ``S`` is the step the backend sends in one
    round trip, ``R`` the reply it gets back, ``T`` the call's value.

    Most calls on a worker's path are one round trip. `first` gives that step (None: the
    operation has none) and `done` makes the value of its reply, or answers `MORE` to go
    on. Everything else is `steps`: a generator that yields steps, is sent their replies,
    and returns the value. The driver runs `first` and `done` without building a
    generator, which is what makes them worth having.

    Slotted and holding only its checked arguments, so one may be built per call or kept
    and shared (see `ReuseLast`). The ``now`` each method is given is the injected
    clock's reading, or None where the store's own clock rules; whether the steps run in
    one transaction, and how it opens, is the backend's (its driver brackets them, or its
    steps begin and end it)."""

    __slots__ = ()

    def first(self, now: float | None) -> S | None:
        """The one step that may finish the call by itself, or None."""
        return None

    def done(self, reply: R, now: float | None) -> T | More:
        """The value made of `first`'s reply, or `MORE` (or ``More(then)``)."""
        return MORE

    def steps(self, now: float | None) -> Steps[S, R, T]:
        """The steps of the whole call, for when `first` gives none or did not finish."""
        raise NotImplementedError(f"{type(self).__name__} has no steps")


def drive(op: Operation[S, R, T], now: float | None, execute: Callable[[S], R]) -> T:
    """Run ``op`` to its value, ``execute`` sending each step and returning its reply."""
    step = op.first(now)
    while step is not None:
        value = op.done(execute(step), now)
        if not isinstance(value, More):
            return value
        if value.then is None:
            break
        op = value.then
        step = op.first(now)
    steps = op.steps(now)
    try:
        step = next(steps)
        while True:
            step = steps.send(execute(step))
    except StopIteration as stop:
        result: T = stop.value
        return result


async def drive_async(
    op: Operation[S, R, T], now: float | None, execute: Callable[[S], Awaitable[R]]
) -> T:
    """`drive` for asyncio: ``execute`` is awaited for each step's reply."""
    step = op.first(now)
    while step is not None:
        value = op.done(await execute(step), now)
        if not isinstance(value, More):
            return value
        if value.then is None:
            break
        op = value.then
        step = op.first(now)
    steps = op.steps(now)
    try:
        step = next(steps)
        while True:
            step = steps.send(await execute(step))
    except StopIteration as stop:
        result: T = stop.value
        return result


# --- a claim that waits -----------------------------------------------------------------


class WaitState(NamedTuple):
    """What a waiting claim compares between looks: ``version``, anything that changes
    whenever a message may have become deliverable (a change counter, a count of
    wake-ups received), and ``due``, when the next lease or park at or above the claim's
    floor ends, on the plan's ``clock`` (None: none)."""

    version: Hashable
    due: float | None


LOOK: Final = "look"  # the driver answers with a fresh `WaitState`
CLAIM: Final = "claim"  # the driver claims, and answers whether it leased
# Any other step is a float: sleep that long unless woken, and answer whether woken.
WaitStep = Literal["look", "claim"] | float

# A lease or park that ends is looked at this long after its end, so that the store's
# clock has passed it too.
AFTER_DUE: Final = 0.002


class Backoff:
    """For a store that cannot wake a waiting claim: look again after 1 ms, then ever
    less often, up to a quarter of a second; any change starts the schedule over."""

    FIRST: Final = 0.001
    LAST: Final = 0.25

    __slots__ = ("delay",)

    def __init__(self) -> None:
        self.delay = self.FIRST

    def next(self) -> float:
        delay = self.delay
        self.delay = min(delay * 2, self.LAST)
        return delay

    def reset(self) -> None:
        self.delay = self.FIRST


def wait_plan(
    wait: float,
    clock: Callable[[], float],
    monotonic: Callable[[], float],
    *,
    recheck: float = 1.0,
    confirm: Sequence[float] = (),
    backoff: Backoff | None = None,
) -> Generator[WaitStep, object, None]:
    """The steps of one claim that waits up to ``wait`` seconds, for every backend.

    A claim is tried again only when something may have become deliverable: the look's
    ``version`` moved, or a lease or park it reported ran out. Each look comes before
    the claim it guards, so that a change landing between the two is seen at the next
    look. Between looks it sleeps until woken, the next due time, ``recheck`` seconds
    (so that a moved clock or a missed wake-up is noticed), or the end of the wait.

    A wake-up that changes nothing goes back to sleep: the wait ends only when its
    seconds have passed (or the driver stops it, having leased). ``confirm`` is for a
    store whose wake-ups can run ahead of the change becoming visible: after a wake-up,
    the plan looks again after each of those delays before going back to sleep.
    ``backoff`` caps each sleep, for a store with no wake-ups at all."""
    deadline = monotonic() + wait
    seen = yield LOOK
    assert isinstance(seen, WaitState)
    while True:
        # A lease or park already over when looked at, which the claim did not take, is
        # not ours to wait for (below the floor once freed, or taken meanwhile).
        pending = seen.due if seen.due is not None and seen.due > clock() else None
        if (yield CLAIM):
            return
        while True:
            left = deadline - monotonic()
            if left <= 0:
                return
            timeout = min(left, recheck)
            if pending is not None:
                timeout = min(timeout, max(pending - clock(), 0.0) + AFTER_DUE)
            if backoff is not None:
                timeout = min(timeout, backoff.next())
            woke = yield timeout
            state = yield LOOK
            confirms = iter(confirm if woke else ())
            while not _worth_a_claim(seen, state, pending, clock()):
                delay = next(confirms, None)
                if delay is None:
                    break
                yield delay
                state = yield LOOK
            else:
                break
        if backoff is not None:
            backoff.reset()
        assert isinstance(state, WaitState)
        seen = state


def _worth_a_claim(seen: WaitState, state: object, pending: float | None, now: float) -> bool:
    assert isinstance(state, WaitState)
    return state.version != seen.version or (pending is not None and pending < now)


def wait_for(
    plan: Generator[WaitStep, object, None],
    look: Callable[[], WaitState],
    claim: Callable[[], C | None],
    sleep: Callable[[float], bool],
    closed: Callable[[], bool],
) -> C | None:
    """Run a `wait_plan` with the backend's ``look``, ``claim`` and ``sleep`` (which
    answers whether it was woken); None when the plan ends or once ``closed()``."""
    reply: object = None
    try:
        while not closed():
            step = plan.send(reply)
            if step == LOOK:
                reply = look()
            elif step == CLAIM:
                claimed = claim()
                if claimed is not None:
                    return claimed
                reply = False
            else:
                assert isinstance(step, float)
                reply = sleep(step)
    except StopIteration:
        pass
    finally:
        plan.close()
    return None


async def wait_for_async(
    plan: Generator[WaitStep, object, None],
    look: Callable[[], Awaitable[WaitState]],
    claim: Callable[[], Awaitable[C | None]],
    sleep: Callable[[float], Awaitable[bool]],
    closed: Callable[[], bool],
) -> C | None:
    """`wait_for` for asyncio: each of ``look``, ``claim`` and ``sleep`` is awaited."""
    reply: object = None
    try:
        while not closed():
            step = plan.send(reply)
            if step == LOOK:
                reply = await look()
            elif step == CLAIM:
                claimed = await claim()
                if claimed is not None:
                    return claimed
                reply = False
            else:
                assert isinstance(step, float)
                reply = await sleep(step)
    except StopIteration:
        pass
    finally:
        plan.close()
    return None


# --- a cancelled async claim ------------------------------------------------------------


def _one(value: C | None) -> tuple[C, ...]:
    return () if value is None else (value,)


class GiveBack(Generic[C]):
    """The one rule for an async claim whose task is cancelled: when the store leased a
    message anyway, that message is given back, its delivery uncounted, so that it is
    claimable again at once and its next delivery carries the same attempt number.
    Nothing leased is ever left to lapse with nobody holding it.

    `claim` awaits the store's call shielded from the caller's cancellation. If the
    caller is cancelled meanwhile, the call still finishes, and whatever it leased goes
    to ``give_back`` (the backend's operation that undoes a claim) in a task of its own.
    The cancellation is raised once that is done, so that a claim made after the
    cancelled task has ended finds the message; but not later than ``patience`` seconds
    (None: no limit), for a store whose call may itself wait long (for a lock another
    process holds, say), which must not hold a cancellation up. A backend that sets
    ``patience`` makes its next calls wait for the give-backs still `owed` (`drain`),
    and every backend drains them before it closes.
    """

    __slots__ = ("_give_back", "_giving", "_patience")

    def __init__(
        self, give_back: Callable[[C], Awaitable[object]], *, patience: float | None = None
    ) -> None:
        self._give_back = give_back
        self._patience = patience
        self._giving: set[asyncio.Future[None]] = set()

    @property
    def owed(self) -> bool:
        """Whether give-backs are still under way (`drain` waits for them)."""
        return bool(self._giving)

    async def claim(self, call: Awaitable[C | None]) -> C | None:
        """The value of ``call``; if cancelled meanwhile, give back what it leased."""
        return await self.guard(call, _one)

    async def guard(self, call: Awaitable[T], leased: Callable[[T], Iterable[C]]) -> T:
        """`claim` for a call that may lease several messages, or lease one beside other
        work (``claim_many``, ``ack_and_claim``): ``leased`` names what its value leased,
        each of which is given back if the caller is cancelled meanwhile."""
        future = asyncio.ensure_future(call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            back = asyncio.ensure_future(self._undo(future, leased))
            self._giving.add(back)
            back.add_done_callback(self._giving.discard)
            # Never raises what the give-back raised; a second cancellation stops only
            # this wait, and `drain` still knows the give-back.
            await asyncio.wait((back,), timeout=self._patience)
            raise

    async def _undo(self, future: asyncio.Future[T], leased: Callable[[T], Iterable[C]]) -> None:
        try:
            for claimed in leased(await future):
                await self._give_back(claimed)
        except Exception:
            # A call that failed leased nothing anyone can name; a give-back that failed
            # leaves the lease to lapse, as a crashed worker's would.
            return

    async def drain(self) -> None:
        """Wait for the give-backs still under way."""
        while self._giving:
            await asyncio.wait(tuple(self._giving))
