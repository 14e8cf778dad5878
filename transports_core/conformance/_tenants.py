"""Scenarios of tenants: while two tenants both have groups to serve, their shares of
the claims stay within one claim of their weights' ratio whatever the number of groups
each has; a tenant back from idle gets its share from then on, not the turns it missed; a
group's tenant is set by the publish that creates it; the priority floor filters before
tenants are weighed; weights are stored and checked. A backend without the ``tenants``
capability must refuse a publish with a tenant with `Unsupported`.

Tenant names carry a token of the test's own, because weights are stored in the queue
and a store shared by the tests (the suite at a URL) keeps them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from functools import partial
from typing import Any, cast

from transports_core import Event, Message, TenantInfo, Transport, TransportAdmin, Unsupported

from ._base import ADMIN, TENANTS, checks, must_raise
from ._properties import (
    TENANT_FAIRNESS,
    TENANT_FLOOR,
    TENANT_ON_CREATE,
    TENANT_REFUSED,
    TENANT_RETURN,
    TENANT_WEIGHTS,
)
from ._steps import Steps, ev, take


class TenantScenarios(Steps):
    def _tenants(self) -> tuple[Transport[Event], TransportAdmin, str]:
        """A handle, as itself and as an admin, and a token for names; skips unless the
        backend declares tenants."""
        self.require(ADMIN)
        self.require(TENANTS)
        t = self.open()
        return t, cast(TransportAdmin, t), uuid.uuid4().hex[:8]

    def _fill(
        self, t: Transport[Event], tenant: str | None, groups: int, each: int, priority: int = 0
    ) -> None:
        """``groups`` groups of ``each`` messages for ``tenant``, in one batch."""
        name = tenant or "none"
        t.publish_many(
            [
                Message(f"{name}-g{g}", ev(n), priority, tenant=tenant)
                for n in range(each)
                for g in range(groups)
            ]
        )

    def _claims(self, t: Transport[Event], n: int, floor: int = 0) -> list[str]:
        """The group ids of ``n`` claims, each acked at once."""
        got = []
        for _ in range(n):
            lease = take(t, "w-tenants", self.hold, floor)
            got.append(lease.group_id)
            t.ack(lease)
        return got

    @staticmethod
    def _check_shares(claims: list[str], weights: dict[str, int], prop: str, what: str) -> None:
        """Fail unless, at every point of ``claims`` (group ids prefixed by their tenant),
        each pair of tenants' counts is within one claim of their weights' ratio."""
        counts: Counter[str] = Counter()
        for i, group in enumerate(claims, 1):
            counts[group.split("-g", 1)[0]] += 1
            names = sorted(weights)
            for x in names:
                for y in names:
                    if x >= y:
                        continue
                    wx, wy = weights[x], weights[y]
                    off = abs(counts[x] * wy - counts[y] * wx)
                    assert off <= wx + wy, (
                        f"{prop}: {what}: after {i} claims the tenants had "
                        f"{dict(counts)} for weights {weights}: more than one claim off "
                        "their ratio"
                    )

    @checks(TENANT_FAIRNESS)
    def test_tenant_weighted_fairness_whatever_their_groups(self) -> None:
        t, a, token = self._tenants()
        big, small = f"big{token}", f"small{token}"
        a.set_tenant_weight(big, 3)
        # The small tenant has few groups, the big one many, and those without a tenant
        # some: group counts must not sway the shares, only weights.
        self._fill(t, big, groups=2, each=40)
        self._fill(t, small, groups=9, each=8)
        self._fill(t, None, groups=5, each=8)
        claims = self._claims(t, 60)  # all three tenants keep ready groups throughout
        self._check_shares(claims, {big: 3, small: 1, "none": 1}, TENANT_FAIRNESS, "weights 3:1:1")

    @checks(TENANT_RETURN)
    def test_tenant_back_from_idle_gets_its_share_not_missed_turns(self) -> None:
        t, _, token = self._tenants()
        busy, idle = f"busy{token}", f"idle{token}"
        self._fill(t, busy, groups=3, each=30)
        self._fill(t, idle, groups=1, each=1)
        first = self._claims(t, 2)
        assert sorted(g.split("-g")[0] for g in first) == sorted([busy, idle]), (
            f"{TENANT_RETURN}: two tenants of equal weight shared the first claims as {first}"
        )
        self._claims(t, 40)  # only the busy tenant has groups now
        self._fill(t, idle, groups=3, each=10)
        after = self._claims(t, 20)
        self._check_shares(after, {busy: 1, idle: 1}, TENANT_RETURN, "back from idle")

    @checks(TENANT_ON_CREATE)
    def test_tenant_set_by_the_publish_that_creates_the_group(self) -> None:
        t, a, token = self._tenants()
        first, second = f"first{token}", f"second{token}"
        t.publish("g", ev(1), tenant=first)
        t.publish("g", ev(2), tenant=second)  # the group exists: its tenant stays
        t.publish("h", ev(3))
        (info,) = [g for g in a.groups(limit=10) if g.group_id == "g"]
        assert info.tenant == first, f"{TENANT_ON_CREATE}: group g's tenant is {info.tenant!r}"
        tenants = {x.tenant: x for x in a.tenants()}
        assert tenants.get(first) == TenantInfo(first, 1, 1), (
            f"{TENANT_ON_CREATE}: tenants() gave {tenants.get(first)} for {first!r}"
        )
        assert tenants.get(None) == TenantInfo(None, 1, 1), (
            f"{TENANT_ON_CREATE}: tenants() gave {tenants.get(None)} for groups without one"
        )
        assert second not in tenants, f"{TENANT_ON_CREATE}: tenants() lists {second!r}"
        for _ in range(2):
            t.ack(take(t, "w1", self.hold))
        t.ack(take(t, "w1", self.hold))  # g and h drain: g is forgotten
        t.publish("g", ev(4), tenant=second)  # ... so this publish creates it anew
        (info,) = [g for g in a.groups(limit=10) if g.group_id == "g"]
        assert info.tenant == second, (
            f"{TENANT_ON_CREATE}: g recreated by a publish for {second!r} has {info.tenant!r}"
        )

    @checks(TENANT_FLOOR)
    def test_tenant_priority_floor_filters_first(self) -> None:
        t, a, token = self._tenants()
        low, high = f"low{token}", f"high{token}"
        a.set_tenant_weight(low, 1000)
        self._fill(t, low, groups=3, each=5, priority=0)
        self._fill(t, high, groups=1, each=5, priority=3)
        got = self._claims(t, 5, floor=3)
        assert all(g.startswith(high) for g in got), (
            f"{TENANT_FLOOR}: claims with min_priority=3 gave {got}"
        )
        assert t.claim("w1", self.hold, 3) is None, f"{TENANT_FLOOR}: the floor let low through"

    @checks(TENANT_WEIGHTS)
    def test_tenant_weights_stored_and_checked(self) -> None:
        t, a, token = self._tenants()
        name = f"w{token}"
        a.set_tenant_weight(name, 7)
        a.set_tenant_weight(name, 1000)
        stored = {x.tenant: x for x in a.tenants()}
        assert stored.get(name) == TenantInfo(name, 1000, 0), (
            f"{TENANT_WEIGHTS}: tenants() gave {stored.get(name)} after weight 1000"
        )
        loose: Any = a
        for bad_name, weight, error in (
            (name, 0, ValueError),
            (name, 1001, ValueError),
            (name, True, TypeError),
            (name, "3", TypeError),
            (name, 2.0, TypeError),
            ("", 2, ValueError),
            (None, 2, TypeError),
        ):
            must_raise(
                TENANT_WEIGHTS,
                error,
                f"set_tenant_weight({bad_name!r}, {weight!r})",
                partial(loose.set_tenant_weight, bad_name, weight),
            )
        again = {x.tenant: x.weight for x in a.tenants()}
        assert again.get(name) == 1000, f"{TENANT_WEIGHTS}: a refused call changed {again}"
        must_raise(
            TENANT_WEIGHTS,
            ValueError,
            "publish(tenant='')",
            lambda: t.publish("g", ev(1), tenant=""),
        )

    @checks(TENANT_REFUSED)
    def test_tenant_refused_without_tenants(self) -> None:
        if self.has(TENANTS):
            return
        t = self.open()
        must_raise(
            TENANT_REFUSED,
            Unsupported,
            "publish(tenant='x')",
            lambda: t.publish("a", ev(1), tenant="x"),
        )
        assert t.claim("w1", self.hold) is None, (
            f"{TENANT_REFUSED}: a refused publish stored a message"
        )
