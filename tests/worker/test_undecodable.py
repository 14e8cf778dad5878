"""A message that no longer decodes is buried alone and never reaches the handler, also
when several of them come in one ``claim_many`` (core's `EventDecodeError` then names
the others that failed in ``undecodable``). On SQLite files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pydantic
import pytest

from transports_core import Event, TransportAdmin, open_transport
from transports_worker.testing._support import Recorder

from ._drain import drain, either


class Order(pydantic.BaseModel):
    amount: int


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("batch", [True, False], ids=["batches", "single claims"])
def test_every_undecodable_message_of_a_claim_is_buried_without_reaching_the_handler(
    tmp_path: Path, flavour: str, batch: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with open_transport(url) as store:
        # Two that do not decode as an Order, then one that does: one claim_many of
        # four leases all three.
        store.publish("a", Event(amount="lots"))
        store.publish("b", Event(amount="many"))
        good = store.publish("c", Event(amount=3))
    seen: list[tuple[int, object]] = []
    recorder = Recorder()

    def handle(event: Any, ctx: Any) -> None:
        seen.append((ctx.lease.seq, event))

    async def ahandle(event: Any, ctx: Any) -> None:
        seen.append((ctx.lease.seq, event))

    options: dict[str, Any] = {
        "event_type": Order,
        "concurrency": 4,
        "batch": batch,
        "hooks": [recorder],
        "handle_signals": False,
    }
    worker = either(flavour, url, handle, ahandle, **options)
    drain(worker, recorder, 3)
    assert seen == [(good, Order(amount=3))]
    assert sorted(outcome for _, _, outcome in recorder.outcomes()) == [
        "acked",
        "buried",
        "buried",
    ]
    with open_transport(url) as store:
        letters = cast(TransportAdmin, store).dead_letters()
    assert sorted(letter.group_id for letter in letters) == ["a", "b"]
    assert all("does not decode" in letter.reason for letter in letters)
