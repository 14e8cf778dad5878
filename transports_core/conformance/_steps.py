"""The steps that scenarios repeat: publishing numbered events, claiming what must come,
letting a lease lapse or a park run out, and the checks that follow. Each check fails
(never errors) with a message that starts with the running scenario's property, so a
scenario reads as its steps and still says which promise broke."""

from __future__ import annotations

from collections.abc import Callable

from transports_core import Event, Lease, LeaseLost, Transport

from ._base import SuiteBase, current_property, seen


def ev(n: int) -> Event:
    return Event(n=n)


def publish(t: Transport[Event], group: str, *ns: int) -> list[int]:
    """Publish ``ev(n)`` to ``group`` for each n, in order; their seqs."""
    return [t.publish(group, ev(n)) for n in ns]


def take(
    t: Transport[Event], worker: str, visibility: float, min_priority: int = 0
) -> Lease[Event]:
    """Claim, failing (not erroring) if nothing comes."""
    lease = t.claim(worker, visibility, min_priority)
    assert lease is not None, (
        f"{current_property()}: claim by {worker!r} (min_priority={min_priority}) returned None"
    )
    return lease


def must_not_lose(what: str, call: Callable[[], object]) -> None:
    """Call ``call``, a call on a lease that must still be current; fail if it raises
    `LeaseLost`, saying ``what`` it was."""
    try:
        call()
    except LeaseLost as exc:
        raise AssertionError(
            f"{current_property()}: {what} raised LeaseLost: the lease must be current ({exc})"
        ) from exc


class Steps(SuiteBase):
    """The steps that need the suite's time: leases that lapse, parks that end."""

    def lapsed(self, t: Transport[Event], worker: str = "w1") -> Lease[Event]:
        """A brief lease of ``worker``'s, once its deadline has passed (nobody re-claimed
        it)."""
        lease = take(t, worker, self.brief)
        self.pass_deadline(lease.expires_at)
        return lease

    def reclaimed(self, t: Transport[Event]) -> tuple[Lease[Event], Lease[Event]]:
        """w1's lease on the next message, lapsed, and w2's on the same message after it:
        (the stale lease, the current one)."""
        stale = self.lapsed(t, "w1")
        current = take(t, "w2", self.hold)
        assert current.seq == stale.seq, (
            f"{current_property()}: after w1's lease on seq {stale.seq} lapsed, w2's claim "
            f"gave {current}"
        )
        return stale, current

    def buried(self, t: Transport[Event]) -> Lease[Event]:
        """The next message, claimed by w1 and buried."""
        dead = take(t, "w1", self.hold)
        t.bury(dead, "bad")
        return dead

    def park(self, t: Transport[Event], lease: Lease[Event]) -> float:
        """``nack(lease, brief)``; when the park ends."""
        ends = self.now() + self.brief
        t.nack(lease, self.brief)
        return ends

    def again(self, t: Transport[Event], lease: Lease[Event], when: str) -> Lease[Event]:
        """Claim by w2, which must give ``lease``'s message again, as its next delivery."""
        back = t.claim("w2", self.hold)
        want = (lease.seq, lease.attempt + 1)
        assert seen(back, "seq", "attempt") == want, (
            f"{current_property()}: {when}, claim gave {back}; expected seq {lease.seq} "
            f"again, attempt {want[1]}"
        )
        assert back is not None
        return back
