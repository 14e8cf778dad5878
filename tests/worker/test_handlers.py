"""What the worker does with what a handler returns and raises, when that is not what
its runtime expects: an awaitable returned to `Worker` (never acked, a failure), a
handler `AsyncWorker` cannot await, async handlers behind decorators or as objects;
and the other twin's transport, refused before anything is claimed. On SQLite files."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any, cast

import pytest

from transports_core import (
    AsyncTransport,
    Event,
    TransportAdmin,
    open_async_transport,
    open_transport,
)
from transports_worker import (
    AsyncContext,
    AsyncWorker,
    Bury,
    Context,
    Retry,
    RetryPolicy,
    Worker,
)
from transports_worker.testing._support import PATIENCE, Recorder, RunningWorker

from ._drain import drain, either


def _queue(tmp_path: Path, count: int = 1) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        for n in range(count):
            store.publish(f"g{n}", Event(n=n))
    return url


def _letters(url: str) -> list[str]:
    with open_transport(url) as store:
        return [letter.reason for letter in cast(TransportAdmin, store).dead_letters()]


def test_a_handler_that_returns_a_coroutine_to_worker_fails_and_its_body_never_runs(
    tmp_path: Path,
) -> None:
    url = _queue(tmp_path)
    ran: list[int] = []

    async def body(event: Event, ctx: Context[Event]) -> None:
        ran.append(ctx.attempt)

    recorder = Recorder()
    # A plain function that returns a coroutine: nothing marks it as async.
    worker: Worker[Event] = Worker(
        url,
        lambda event, ctx: body(event, ctx),
        hooks=[recorder],
        handle_signals=False,
        retry=RetryPolicy(max_attempts=1),
    )
    drain(worker, recorder, 1)
    assert recorder.outcomes() == [(1, 1, "buried")]  # the policy's last attempt, not acked
    (error,) = [error for _, _, error in recorder.settled_]
    assert isinstance(error, TypeError)
    assert "returned an awaitable (coroutine), which Worker does not await" in str(error)
    assert ran == []
    (reason,) = _letters(url)
    assert "run an async handler with AsyncWorker" in reason


class _AsyncCallable:
    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, event: Event, ctx: AsyncContext[Event]) -> None:
        await asyncio.sleep(0)
        self.seen.append(event.n)


def test_async_worker_runs_an_async_handler_behind_a_decorator_and_an_async_callable(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    seen: list[int] = []

    def traced(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    @traced
    async def handle(event: Event, ctx: AsyncContext[Event]) -> None:
        await asyncio.sleep(0)
        seen.append(event.n)

    for handler, saw in ((handle, seen), (callable_ := _AsyncCallable(), callable_.seen)):
        with open_transport(url) as store:
            store.publish("g", Event(n=len(saw)))
        recorder = Recorder()
        worker = AsyncWorker(url, handler, hooks=[recorder], handle_signals=False)
        running = RunningWorker(worker)
        recorder.wait_settled(1)
        assert running.stop() == 0
        assert [outcome for _, _, outcome in recorder.outcomes()] == ["acked"]
        assert saw == [0]


class _SyncCallable:
    def __call__(self, event: Event, ctx: AsyncContext[Event]) -> None:
        pass


def test_a_handler_async_worker_cannot_await_fails_naming_why(tmp_path: Path) -> None:
    url = _queue(tmp_path)
    recorder = Recorder()
    worker = AsyncWorker(
        url,
        _SyncCallable(),  # type: ignore[arg-type]  # returns None, on purpose
        hooks=[recorder],
        handle_signals=False,
        retry=RetryPolicy(max_attempts=1),
    )
    drain(worker, recorder, 1)
    assert recorder.outcomes() == [(1, 1, "buried")]
    (reason,) = _letters(url)
    assert "returned NoneType, not an awaitable" in reason


def test_the_other_twins_transport_is_refused_before_anything_is_claimed(tmp_path: Path) -> None:
    url = _queue(tmp_path)

    def handle(event: Event, ctx: Context[Event]) -> None:
        raise AssertionError("nothing is claimed")

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        raise AssertionError("nothing is claimed")

    async def opened() -> AsyncTransport[Event]:
        return open_async_transport(url)

    asynchronous = asyncio.run(opened())
    try:
        with pytest.raises(TypeError, match="is an async transport: Worker needs a Transport"):
            Worker(asynchronous, handle)  # type: ignore[arg-type]  # the wrong twin, on purpose
    finally:
        asyncio.run(asynchronous.close())
    with open_transport(url) as synchronous:
        with pytest.raises(TypeError, match="is a sync transport: AsyncWorker needs an Async"):
            AsyncWorker(synchronous, ahandle)  # type: ignore[arg-type]  # the wrong twin
        # From a factory, the handle is checked as it opens, before any claim.
        worker = AsyncWorker(lambda: open_transport(url), ahandle, handle_signals=False)  # type: ignore[arg-type,return-value]
        with pytest.raises(TypeError, match="is a sync transport"):
            asyncio.run(worker.run())
        assert synchronous.claim("check", 1.0) is not None, "a message was claimed"
    with pytest.raises(TypeError, match="source must be a URL, a transport or a factory"):
        Worker(5, handle)  # type: ignore[arg-type]  # not a source, on purpose
    with pytest.raises(TypeError, match="source must be a URL, a transport or a factory"):
        AsyncWorker(5, ahandle)  # type: ignore[arg-type]  # not a source, on purpose


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_cancelled_error_the_worker_did_not_cause_is_a_failure_retried_with_backoff(
    tmp_path: Path, flavour: str
) -> None:
    # The handler's own await meets a CancelledError (what it awaited was cancelled by
    # something else): its lease is fine, so the policy decides, as for any exception.
    url = _queue(tmp_path)
    recorder = Recorder()

    def handle(event: Event, ctx: Context[Event]) -> None:
        if ctx.attempt == 1:
            raise asyncio.CancelledError("its own")

    async def ahandle(event: Event, ctx: AsyncContext[Event]) -> None:
        if ctx.attempt == 1:
            helper = asyncio.ensure_future(asyncio.sleep(PATIENCE))
            asyncio.get_running_loop().call_soon(helper.cancel)
            await helper

    options: dict[str, Any] = {
        "hooks": [recorder],
        "handle_signals": False,
        "retry": RetryPolicy(base=0.05, jitter=0),
    }
    worker = either(flavour, url, handle, ahandle, **options)
    drain(worker, recorder, 2)
    assert recorder.outcomes() == [(1, 1, "failed"), (1, 2, "acked")]
    assert isinstance(recorder.settled_[0][2], asyncio.CancelledError)


def test_deliveries_that_ended_in_retry_count_toward_the_policys_max_attempts(
    tmp_path: Path,
) -> None:
    # As docs/worker.md says: the store counts every delivery, Retry's too.
    url = _queue(tmp_path)
    recorder = Recorder()

    def handle(event: Event, ctx: Context[Event]) -> None:
        if ctx.attempt == 1:
            raise Retry(0.01)
        raise ValueError("a real failure")

    worker = Worker(
        url,
        handle,
        hooks=[recorder],
        handle_signals=False,
        retry=RetryPolicy(max_attempts=2, base=0.01, jitter=0),
    )
    drain(worker, recorder, 2)
    assert recorder.outcomes() == [(1, 1, "retried"), (1, 2, "buried")]


@pytest.mark.parametrize(
    ("raised", "stored"),
    [
        (ValueError("bad\x00input"), "buried: ValueError: bad\\x00input"),
        (ValueError("lone \ud800"), "buried: ValueError: lone \\ud800"),
        (Bury("no\x00such customer"), "buried: no\\x00such customer"),
        (Bury("x" * 2000), "buried: " + "x" * 997 + "..."),
    ],
    ids=["nul", "surrogate", "bury-nul", "bury-long"],
)
def test_a_reason_no_store_could_keep_is_buried_escaped_and_cut(
    tmp_path: Path, raised: Exception, stored: str
) -> None:
    # Exception texts are the application's: one with a NUL or a lone surrogate, or a
    # Bury reason past the transports' longest, must still make a dead letter.
    url = _queue(tmp_path)

    def handler(event: Event, ctx: Context[Event]) -> None:
        raise raised

    recorder = Recorder()
    worker: Worker[Event] = Worker(
        url, handler, hooks=[recorder], handle_signals=False, retry=RetryPolicy(max_attempts=1)
    )
    drain(worker, recorder, 1)
    assert recorder.outcomes() == [(1, 1, "buried")]
    assert _letters(url) == [stored]
