"""Scenarios of shutdown: drain within ``grace``, then hand leases back."""

from __future__ import annotations

import threading

from transports_core import Event, Transport

from ._support import PATIENCE, VISIBILITY, Recorder, Start, sleepers, wait_for


class ShutdownScenarios:
    """A worker stopped once (drains) and twice (hands back at once)."""

    def test_stop_mid_handler_drains_within_grace_and_claims_nothing_new(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("a", Event(n=1))
        store.publish("b", Event(n=2))
        running_flag = threading.Event()
        running = start(*sleepers(running_flag, 1.5 * VISIBILITY), concurrency=1)
        wait_for(running_flag, "the handler to start")
        assert running.stop() == 0
        assert recorder.outcomes() == [(1, 1, "acked")]
        assert len(recorder.started_) == 1
        left = store.claim("check", VISIBILITY)
        assert left is not None
        assert (left.seq, left.attempt) == (2, 1), "the worker claimed after it was stopped"

    def test_past_grace_the_lease_is_handed_back_to_another_worker(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("g", Event(n=1))
        running_flag, cancelled = threading.Event(), threading.Event()
        running = start(*sleepers(running_flag, PATIENCE, cancelled), grace=0.2)
        wait_for(running_flag, "the handler to start")
        assert running.stop() == 75
        wait_for(cancelled, "the handler to be cancelled")
        assert recorder.outcomes() == [(1, 1, "handed_back")]
        # Handed back with nack(0): claimable at once, not after the lease would lapse.
        again = store.claim("other", VISIBILITY, wait=1.0)
        assert again is not None, "the handed-back message was not claimable within a second"
        assert (again.seq, again.attempt) == (1, 2)

    def test_a_second_stop_cancels_without_waiting_for_grace(
        self, start: Start, store: Transport[Event], recorder: Recorder
    ) -> None:
        store.publish("g", Event(n=1))
        running_flag = threading.Event()
        running = start(*sleepers(running_flag, 10 * PATIENCE), grace=10 * PATIENCE)
        wait_for(running_flag, "the handler to start")
        running.worker.stop()
        running.worker.stop()
        assert running.join(PATIENCE) == 75
        assert recorder.outcomes() == [(1, 1, "handed_back")]
