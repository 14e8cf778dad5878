"""Scenarios of what a handler's end leads to: retries in group order, dead letters, the
timeout, and an event that no longer decodes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from transports_core import Event, Transport, TransportAdmin
from transports_core.backend import buried_reason
from transports_worker._context import AsyncContext, Running
from transports_worker._outcomes import Bury, Retry, RetryPolicy

from ._support import PATIENCE, Recorder, Start, sleepers, wait_for


def dead_letters_of(store: Transport[Event]) -> TransportAdmin:
    """``store`` as a `TransportAdmin`, or the scenario skips."""
    if not isinstance(store, TransportAdmin):
        pytest.skip("the transport is not a TransportAdmin: its dead letters cannot be read")
    return store


class OutcomeScenarios:
    """Each way a handler ends, and what the worker makes of it."""

    def test_retries_keep_group_order(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        for n in range(1, 4):
            store.publish("g", Event(n=n))
        store.publish("h", Event(n=10))
        order: list[tuple[int, int]] = []

        def flaky(event: Event, ctx: Running[Event]) -> None:
            order.append((event.n, ctx.attempt))
            if event.n == 2 and ctx.attempt == 1:
                raise Retry(0.2)
            if event.n == 3 and ctx.attempt == 1:
                raise ValueError("first try fails")

        async def aflaky(event: Event, ctx: AsyncContext[Event]) -> None:
            flaky(event, ctx)

        running = start(flaky, aflaky, concurrency=4, retry=RetryPolicy(base=0.1))
        recorder.wait_settled(6)
        assert running.stop() == 0
        in_g = [step for step in order if step[0] < 10]
        assert in_g == [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2)]
        assert sorted(outcome for _, _, outcome in recorder.outcomes()) == [
            "acked",
            "acked",
            "acked",
            "acked",
            "failed",
            "retried",
        ]

    def test_permanent_errors_and_the_last_attempt_bury_with_the_exception_text(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        admin = dead_letters_of(store)
        store.publish("p", Event(kind="permanent"))
        store.publish("l", Event(kind="always"))
        store.publish("b", Event(kind="bury"))

        def failing(event: Event, ctx: Running[Event]) -> None:
            if event.kind == "permanent":
                raise KeyError("missing")
            if event.kind == "bury":
                raise Bury("not for us")
            raise ValueError(f"boom {ctx.attempt}")

        async def afailing(event: Event, ctx: AsyncContext[Event]) -> None:
            failing(event, ctx)

        policy = RetryPolicy(max_attempts=2, base=0.05, permanent=(KeyError,))
        running = start(failing, afailing, retry=policy)
        recorder.wait_settled(4)
        assert running.stop() == 0
        dead = {letter.group_id: letter for letter in admin.dead_letters()}
        assert set(dead) == {"p", "l", "b"}
        assert dead["p"].reason == buried_reason("KeyError: 'missing'")
        assert dead["p"].attempts == 1
        assert dead["l"].reason == buried_reason("ValueError: boom 2")
        assert dead["l"].attempts == 2
        assert dead["b"].reason == buried_reason("not for us")

    def test_timeout_cancels_the_handler_and_counts_as_a_failure(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        admin = dead_letters_of(store)
        store.publish("g", Event(n=1))
        cancelled = threading.Event()
        handlers = sleepers(threading.Event(), PATIENCE, cancelled)
        running = start(*handlers, timeout=0.3, retry=RetryPolicy(max_attempts=1))
        recorder.wait_settled(1)
        wait_for(cancelled, "the handler to be cancelled")
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "buried")]
        (letter,) = admin.dead_letters()
        assert letter.reason.startswith(buried_reason("TimeoutError: "))

    def test_an_event_that_does_not_decode_is_buried(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        from pydantic import BaseModel

        class Strict(BaseModel):
            amount: int

        admin = dead_letters_of(store)
        store.publish("g", Event(note="no amount"))
        store.publish("h", Event(amount=3))
        amounts: list[int] = []

        def handle(event: Any, ctx: Any) -> None:
            amounts.append(event.amount)

        async def ahandle(event: Any, ctx: Any) -> None:
            amounts.append(event.amount)

        running = start(handle, ahandle, event_type=Strict)
        recorder.wait_settled(2)
        assert running.stop() == 0
        assert amounts == [3]
        (letter,) = admin.dead_letters()
        assert letter.group_id == "g"
        assert "does not decode" in letter.reason
