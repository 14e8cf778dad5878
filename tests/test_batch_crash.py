"""Workers that lease with ``claim_many`` and settle with ``settle_many``/``ack_many``,
SIGKILLed at random points of their work and restarted, then a clean drain: on every
backend, nothing is lost, no batch is half-settled, and each group keeps its order and
one lease at a time.

Each round starts `CHILDREN` worker processes (`tests._batch_workers.chaos`), which
announce on a pipe each settle they are about to send; at the k-th announcement of the
round (k at random), the parent kills all of them, a random fraction of a settle's time
later, so the one that made it is likely inside its settle call, the others wherever
they were. With every worker dead the store stands still, and the parent looks
at it: for each batch a worker was settling when it died, which items took effect (an
ack: its message is gone; a nack: parked; a bury: a dead letter with its reason) and
which did not (the message is still its group's head, on the same attempt). A batch is
whole when one answer fits all its items. The kills leave leases behind that lapse
`VISIBILITY` seconds later; the next rounds and the drain wait for them by blocking
claims, never by sleeping.

What "whole" can promise differs: on SQLite and PostgreSQL a ``settle_many`` is one
transaction; on Redis it is one script per 100 items (``transports_redis._ops.BATCH``)
and a larger batch is not atomic as a whole. The workers' batches are of 1 to 50 leases,
so each is one script there too, and the test asks the same of every backend.

A worker's last call may still be running on the server when the worker is dead: on
PostgreSQL the parent waits for the workers' sessions to end before it looks; Redis runs
the commands that reached it in their order, and a dead worker's script reached it
before the kill, long before the parent's reads.

An item is left out of the check when its lease was no longer current when the batch
was sent (another worker's later attempt of the message is logged, or is the head's):
that settle is fenced and rightly changes nothing while its batch-mates take effect.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from transports_core import Event, TransportAdmin, open_transport
from transports_core.backend import buried_reason

from . import _batch_workers as workers

GROUPS = 200
PER_GROUP = 12
CHILDREN = 3
ROUNDS = 12
SEED = int(os.environ.get("BATCH_CRASH_SEED", "20261206"))
# Leases are stamped on the store's clock, the logs on the host's: on one machine they
# are the same clock, read at slightly different moments.
CLOCK_MARGIN = 0.05
BACKENDS = ["sqlite", "sqlite-async", "postgres", "postgres-async", "redis", "redis-async"]


@dataclass
class Store:
    url: str
    twin: str
    # What is broken in the store's own bookkeeping, as the backend can tell: [] if whole.
    problems: Callable[[], list[str]] = lambda: []
    # The URL the workers open, when it must differ from the parent's.
    worker_url: str = ""
    # Wait until killed workers can change nothing more: a server may still be running
    # what a worker sent before it died.
    quiet: Callable[[], None] = lambda: None


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    backend, _, twin = request.param.partition("-")
    twin = twin or "sync"
    with ExitStack() as stack:
        if backend == "sqlite":
            from tests.sqlite._support import chain_problems

            db = tmp_path / "q.db"
            yield Store(f"sqlite:///{db}", twin, lambda: chain_problems(db))
        elif backend == "postgres":
            from tests.postgres.server import fresh_schema, group_problems, with_schema

            url, schema = stack.enter_context(fresh_schema("tbc"))
            queue_url = with_schema(url, schema, pool_min_size=0, pool_max_size=2)
            yield Store(
                queue_url,
                twin,
                lambda: group_problems(url, schema),
                f"{queue_url}&application_name={schema}",
                lambda: sessions_ended(url, schema),
            )
        else:
            from tests.redis.server import broken_invariants, fresh_queue, with_queue

            url, queue = stack.enter_context(fresh_queue("tbc"))
            queue_url = with_queue(url, queue)
            yield Store(queue_url, twin, lambda: broken_invariants(queue_url))


def sessions_ended(url: str, schema: str) -> None:
    """Wait until the PostgreSQL sessions of the workers (named after the schema) have
    ended: a server process finishes the statement or commit its client sent before it
    was killed, then finds the client gone and exits."""
    import psycopg

    deadline = time.monotonic() + 30
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute(query, (schema,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the killed workers' sessions live on"
            time.sleep(0.01)


@dataclass
class Delivery:
    seq: int
    attempt: int
    group: str
    n: int
    returned_at: float
    expires_at: float
    settle_sent: float | None = None  # when a settle of this lease was sent, if one was


@dataclass
class Batch:
    name: str
    leases: list[Delivery]
    sent_at: float | None = None  # the S? line
    actions: dict[int, str] = field(default_factory=dict)  # seq -> ack, nack, bury
    lost: list[int] | None = None  # the S line: the seqs reported stale


def read_log(path: Path) -> list[Batch]:
    """The batches of one worker's log, in order; a line cut short by a kill is left out."""
    batches: dict[str, Batch] = {}
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        kind, name, at, *items = line.split()
        if kind == "C":
            leases = []
            for item in items:
                seq, attempt, group, n, expires = item.split(":")
                leases.append(
                    Delivery(int(seq), int(attempt), group, int(n), float(at), float(expires))
                )
            batches[name] = Batch(name, leases)
        elif kind == "S?":
            batch = batches[name]
            batch.sent_at = float(at)
            for item in items:
                seq, _, action = item.split(":")
                batch.actions[int(seq)] = action
            for lease in batch.leases:
                if lease.seq in batch.actions:
                    lease.settle_sent = float(at)
        else:
            batches[name].lost = [int(seq) for seq in items]
    return list(batches.values())


@dataclass
class Outcomes:
    """What the logs and the looks at the store say happened."""

    acked: dict[int, int] = field(default_factory=dict)  # seq -> attempt acked
    buried: dict[int, int] = field(default_factory=dict)  # seq -> attempt buried
    problems: list[str] = field(default_factory=list)
    half: list[str] = field(default_factory=list)  # batches half-settled
    in_flight: int = 0  # settles a kill cut short
    whole: dict[str, int] = field(default_factory=lambda: {"all": 0, "none": 0})

    def settled(self, kind: str, seq: int, attempt: int, where: str) -> None:
        table = self.acked if kind == "ack" else self.buried
        if seq in self.acked or seq in self.buried:
            self.problems.append(
                f"message {seq} settled again ({kind}, attempt {attempt}, {where})"
            )
        table[seq] = attempt


def fates(
    admin: Any, batch: Batch, later: dict[int, int], nack_visible: bool
) -> dict[int, set[bool] | str]:
    """For each lease of a batch cut short by a kill: whether its settle took effect
    ({True}, {False}, or both when the store cannot tell), "stale" when it was no longer
    current, or a description of an effect that its settle could not have had."""
    dead = {letter.seq: letter for letter in admin.dead_letters()}
    result: dict[int, set[bool] | str] = {}
    for lease in batch.leases:
        head = next(iter(admin.peek(lease.group, 1)), None)
        action = batch.actions.get(lease.seq, "none")
        if later.get(lease.seq, 0) > lease.attempt or (
            head is not None and head.seq == lease.seq and head.attempts > lease.attempt
        ):
            result[lease.seq] = "stale"
            continue
        if lease.seq in dead:
            seen = "bury"
            if dead[lease.seq].reason != buried_reason(f"r{lease.seq}"):
                seen = f"dead letter {dead[lease.seq].reason!r}"
        elif head is None or head.seq != lease.seq:
            seen = "ack"
        elif head.state == "parked":
            seen = "nack"
        else:
            seen = "none"  # still leased on the same attempt, or lapsed
        if seen == "none":
            # A lease walked away from (no action) is left as it was, whatever the
            # batch did; a nack whose park may have ended looks the same.
            unknown = action == "none" or (action == "nack" and not nack_visible)
            result[lease.seq] = {True, False} if unknown else {False}
        elif seen == action:
            result[lease.seq] = {True}
        else:
            result[lease.seq] = f"{action} sent, {seen} seen"
    return result


def judge(admin: Any, batch: Batch, later: dict[int, int], out: Outcomes) -> None:
    """Check one batch a kill cut short, and note what of it took effect."""
    if batch.sent_at is not None:
        out.in_flight += 1
    # A nack that took effect shows as parked only until its park ends.
    nack_visible = (
        batch.sent_at is not None and time.time() < batch.sent_at + workers.NACK_DELAY - 0.5
    )
    seen = fates(admin, batch, later, nack_visible)
    wrong = {seq: fate for seq, fate in seen.items() if isinstance(fate, str) and fate != "stale"}
    if wrong:
        out.problems.append(f"batch {batch.name}: effects it could not have had: {wrong}")
    answers = {True, False}
    for fate in seen.values():
        if isinstance(fate, set):
            answers &= fate
    if wrong:
        pass
    elif not answers:
        out.half.append(f"batch {batch.name} half-settled: {seen}, actions {batch.actions}")
    elif answers == {True}:
        out.whole["all"] += 1
    elif answers == {False} and batch.sent_at is not None:
        out.whole["none"] += 1
    for lease in batch.leases:  # what took effect, whole batch or not
        action = batch.actions.get(lease.seq)
        if seen[lease.seq] == {True} and action in ("ack", "bury"):
            out.settled(action, lease.seq, lease.attempt, f"in flight in {batch.name}")


def confirmed(batch: Batch, out: Outcomes) -> None:
    """Note what a batch whose settle returned did."""
    if batch.lost is None:
        if batch.sent_at is not None:
            out.problems.append(f"batch {batch.name}: its settle never returned")
        return  # every lease walked away from
    for lease in batch.leases:
        action = batch.actions.get(lease.seq)
        if action in ("ack", "bury") and lease.seq not in batch.lost:
            out.settled(action, lease.seq, lease.attempt, f"by {batch.name}")


def store_problems(admin: Any, store: Store) -> list[str]:
    """The backend's own checks, and the admin views agreeing with each other."""
    problems = list(store.problems())
    stats = admin.stats()
    depth = sum(group.depth for group in admin.groups(GROUPS * 2))
    if depth != stats.ready + stats.in_flight + stats.parked:
        problems.append(f"groups hold {depth} messages, stats count {stats}")
    return problems


def undone(admin: Any) -> int:
    """How many messages are left to deliver or settle."""
    stats = admin.stats()
    return int(stats.ready + stats.in_flight + stats.parked + stats.delayed)


def spawn_children(
    store: Store, logs: Path, round_: int, rng: random.Random
) -> tuple[list[Any], Any]:
    """The round's workers, started together once all are ready, and the receiving end of
    the pipe on which they announce each settle they are about to send."""
    context = multiprocessing.get_context("spawn")
    announced, announce = context.Pipe(duplex=False)
    start = context.Barrier(CHILDREN + 1)
    children = []
    for i in range(CHILDREN):
        name = f"w{round_}.{i}"
        url = store.worker_url or store.url
        args = (url, name, str(logs / f"{name}.log"), rng.randrange(2**32), store.twin)
        children.append(context.Process(target=workers.run, args=(*args, start, announce)))
        children[-1].start()
    announce.close()  # the workers hold their own copies: when all die, the pipe ends
    start.wait(60)
    return children, announced


@pytest.mark.slow
def test_sigkilled_batch_workers_lose_nothing_and_settle_whole_batches(
    store: Store, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    logs = tmp_path / "logs"
    logs.mkdir()
    started = time.monotonic()
    with open_transport(store.url) as queue:
        assert isinstance(queue, TransportAdmin)
        items = [(f"g{g}", Event(n=n), 0) for n in range(PER_GROUP) for g in range(GROUPS)]
        published = {
            seq: (group, event.n)
            for (group, event, _), seq in zip(items, queue.publish_many(items), strict=True)
        }
        out = Outcomes()
        kills = 0
        for round_ in range(ROUNDS):
            if not undone(queue):
                break
            children, announced = spawn_children(store, logs, round_, rng)
            settles = rng.randint(1, 15)
            deadline = time.monotonic() + 20
            try:
                # Woken by the announcement itself, so the kill follows it closely; or
                # by the queue running dry first.
                while settles and time.monotonic() < deadline:
                    if not announced.poll(0.25):
                        if not undone(queue):
                            break
                        continue
                    try:
                        announced.recv_bytes()
                    except EOFError:
                        break  # they died on their own: their exit codes say how
                    settles -= 1
                # A settle takes about a millisecond: the kill lands anywhere in it, or
                # just before or after.
                time.sleep(rng.uniform(0, 0.0015))
            finally:
                for child in children:
                    if child.pid is not None:
                        os.kill(child.pid, signal.SIGKILL)
                for child in children:
                    child.join(30)
            codes = [child.exitcode for child in children]
            assert codes == [-signal.SIGKILL] * CHILDREN, f"a worker died on its own: {codes}"
            announced.close()
            kills += CHILDREN
            store.quiet()
            # Every worker is dead and all it sent done: the store stands still while we
            # look.
            batches = {path: read_log(path) for path in logs.glob(f"w{round_}.*.log")}
            later: dict[int, int] = defaultdict(int)
            for path in logs.glob("w*.log"):
                for batch in read_log(path):
                    for lease in batch.leases:
                        later[lease.seq] = max(later[lease.seq], lease.attempt)
            for round_batches in batches.values():
                for batch in round_batches[:-1]:
                    confirmed(batch, out)
                if round_batches and round_batches[-1].lost is None:
                    # later: the highest attempt logged anywhere, so a lease of this
                    # batch is stale if a higher one exists.
                    judge(queue, round_batches[-1], later, out)
                elif round_batches:
                    confirmed(round_batches[-1], out)
            out.problems += [f"after round {round_}: {p}" for p in store_problems(queue, store)]

        drain_log = logs / "drain.log"
        drainer = multiprocessing.get_context("spawn").Process(
            target=workers.run,
            args=(store.url, "drainer", str(drain_log), None, store.twin, None, None),
        )
        drainer.start()
        drainer.join(60)
        if drainer.exitcode is None:
            drainer.kill()
            drainer.join()
        assert drainer.exitcode == 0, "the drain did not finish"
        for batch in read_log(drain_log):
            assert batch.lost == [], f"the drain's own leases were reported stale: {batch}"
            confirmed(batch, out)
        stats = queue.stats()
        dead = {letter.seq: letter for letter in queue.dead_letters()}
        out.problems += store_problems(queue, store)

    deliveries = [
        lease
        for path in sorted(logs.glob("*.log"))
        for batch in read_log(path)
        for lease in batch.leases
    ]
    problems = out.half + out.problems + check_deliveries(deliveries, published, out)
    # Nothing lost: every message acked or buried, once, and the buried ones are dead
    # letters with their reason.
    missing = set(published) - set(out.acked) - set(out.buried)
    if missing:
        problems.append(f"{len(missing)} messages neither acked nor buried: {sorted(missing)[:20]}")
    if set(dead) != set(out.buried):
        problems.append(f"dead letters {sorted(dead)}, buried {sorted(out.buried)}")
    problems += [
        f"dead letter {seq}: {letter.reason!r}"
        for seq, letter in dead.items()
        if letter.reason != buried_reason(f"r{seq}")
    ]
    if (stats.ready, stats.in_flight, stats.parked, stats.delayed) != (0, 0, 0, 0):
        problems.append(f"left in the queue after the drain: {stats}")
    summary = (
        f"seed {SEED}, {store.twin} twin: {kills} kills, {out.in_flight} settles cut short "
        f"(whole: {out.whole}, half: {len(out.half)}), {len(deliveries)} deliveries, "
        f"{len(out.acked)} acked, {len(out.buried)} buried, {time.monotonic() - started:.1f}s"
    )
    print(summary)
    assert not problems, "\n".join([summary, *problems[:40]])
    # The run was a real one: kills landed inside settles.
    assert out.in_flight >= 3, summary


def check_deliveries(
    deliveries: list[Delivery], published: dict[int, tuple[str, int]], out: Outcomes
) -> list[str]:
    """Each group's messages delivered in order, one lease at a time, none after it was
    acked or buried."""
    problems = []
    by_group: dict[str, list[Delivery]] = defaultdict(list)
    for lease in deliveries:
        if published.get(lease.seq) != (lease.group, lease.n):
            problems.append(f"delivered {lease}, published as {published.get(lease.seq)}")
        settled = out.acked.get(lease.seq, out.buried.get(lease.seq))
        if settled is not None and lease.attempt > settled:
            problems.append(
                f"message {lease.seq} delivered (attempt {lease.attempt}) "
                f"after it was settled on attempt {settled}"
            )
        by_group[lease.group].append(lease)
    for group, leases in by_group.items():
        leases.sort(key=lambda lease: lease.returned_at)
        for before, after in itertools.pairwise(leases):
            if after.n < before.n:
                problems.append(f"{group}: message {after.n} delivered after {before.n}")
            ended = before.expires_at - CLOCK_MARGIN
            if before.settle_sent is not None:
                ended = min(ended, before.settle_sent)
            if after.returned_at < ended:
                problems.append(
                    f"{group}: {after.seq}/{after.attempt} leased at {after.returned_at!r} "
                    f"while {before.seq}/{before.attempt} held until {ended!r} at least"
                )
    return problems
