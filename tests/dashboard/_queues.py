"""A queue in a known state on any backend, prepared with the library itself."""

from __future__ import annotations

from dataclasses import dataclass

from tests._services import with_query
from transports_core import Event, Lease, TransportAdmin, open_transport

LONG = 600.0  # seconds: leases and parks that cannot lapse while a test runs
# A payload a page must show as text, never run: the page's escaping is under test too.
HOSTILE = "<script>alert('dashboard')</script>"


@dataclass(frozen=True)
class Prepared:
    """The queue at ``url`` holds (seqs in publish order):

    * ``leased`` (priority 0): seq 1 leased to worker ``w`` (in flight), seq 2 behind it;
    * ``parked`` (priority 0): seq 3, nacked with a long delay;
    * ``poison`` (priority 1): seq 4 buried with ``on_dead=hold`` (its reason and the
      hostile payload), holding seq 5 behind it;
    * ``retry`` (priority 0): seq 6 buried with ``on_dead=release`` (the group is gone);
    * ``deep`` (priority 2): seqs 7, 8, 9, never claimed;
    * ``ready`` (priority 0): seq 10, never claimed.
    """

    url: str
    held_seq: int
    released_seq: int
    lease: Lease[Event]


def prepare(url: str) -> Prepared:
    with open_transport(with_query(url, on_dead="hold")) as holding, open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        queue.publish("leased", Event(step=1))
        queue.publish("leased", Event(step=2))
        queue.publish("parked", Event(step=1))
        held = queue.publish("poison", Event(order=17, note=HOSTILE), priority=1)
        queue.publish("poison", Event(order=18), priority=1)
        released = queue.publish("retry", Event(step=1))
        heads: dict[str, Lease[Event]] = {}
        while (lease := queue.claim("w", LONG)) is not None:
            heads[lease.group_id] = lease
        assert sorted(heads) == ["leased", "parked", "poison", "retry"]
        queue.nack(heads["parked"], delay=LONG)
        holding.bury(heads["poison"], "order 17 refers to a missing customer")
        queue.bury(heads["retry"], "gave up")
        for step in (1, 2, 3):
            queue.publish("deep", Event(step=step), priority=2)
        queue.publish("ready", Event(step=1))
        assert [d.seq for d in queue.dead_letters()] == [held, released]
    return Prepared(url, held, released, heads["leased"])
