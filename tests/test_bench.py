"""`python -m bench --quick`, `python -m bench.worker --quick` (either flavour) and `python -m
bench.overhead --quick` keep working: they exit 0 and write every case and target.

Timings are not checked here (speed is judged by the benchmark itself, never by tests)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import batch, keys, peers, timers
from tests.core.broken_backends import MemoryStore
from transports_core import Backend, register_backend

ROOT = Path(__file__).resolve().parent.parent


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module --quick *args`` from the repository, which must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_quick_benchmark_runs_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = _run("bench", "--out", str(out), "--dir", str(tmp_path))
    report = json.loads(out.read_text())
    assert set(report) == {"meta", "cases", "targets"}
    cases = report["cases"]
    for key in (
        "floor.full",
        "floor.normal",
        "sync.full",
        "sync.normal",
        "async.full",
        "async.normal",
        "publish.full",
        "publish_raw.full",
        "publish_many.normal",
        "publish_many_raw.normal",
        "backlog.10.2000",
        "seed.10.2000",
        "processes.normal.1",
        "processes.normal.4",
        "batch.normal.floor",
        "batch.normal.chain",
        "batch.full.chain",
        "batch.full.chain_async",
        "batch.full.batch",
    ):
        assert cases[key] is not None, key
    for peer in ("persist_queue", "litequeue"):
        theirs = cases[f"peers.{peer}"]  # None when the peer is not installed
        if theirs is not None:  # then this transport ran beside it, at its setting
            ours = cases[f"peers.ours.{theirs['synchronous']}"]
            assert len(ours["put_rounds"]) == len(theirs["put_rounds"])
    for workers in (1, 4):
        run = cases[f"processes.normal.{workers}"]
        assert run["errors"] == []
        assert run["drained"] is True
    names = {t["name"] for t in report["targets"]}
    assert "claim+ack vs floor, synchronous=full" in names
    assert "4 processes vs 1, synchronous=normal" in names
    assert "async claim+ack vs sync twin, synchronous=full" in names
    assert "ack_and_claim loop / two-commit floor, synchronous=normal" in names
    assert "async ack_and_claim / sync twin, synchronous=full" in names
    assert "ack_and_claim loop / two-commit floor, synchronous=full" not in names  # no target
    assert "claim+ack" in done.stdout  # the table was printed
    assert not list(tmp_path.glob("bench-*")), "the benchmark left its databases behind"


@pytest.mark.slow
def test_quick_worker_benchmark_reports_rates_and_costs_per_message(tmp_path: Path) -> None:
    out = tmp_path / "worker.json"
    done = _run("bench.worker", "--out", str(out))
    report = json.loads(out.read_text())
    assert 0 <= report["idle_core_share"] < 1
    for concurrency in (1, 8):
        row = report[f"concurrency_{concurrency}"]
        assert row["ratio"] == pytest.approx(row["runtime"] / row["bare"])
        for case in ("bare", "runtime"):
            assert row[case] > 0
            cost = row["per_message"][case]
            assert cost["rate"] == pytest.approx(row[case])  # one round: its median
            assert cost["cpu_us"] > 0
    assert "per message: bare" in done.stdout


@pytest.mark.slow
def test_quick_worker_benchmark_measures_the_async_worker_apart(tmp_path: Path) -> None:
    out = tmp_path / "worker.json"
    done = _run("bench.worker", "--flavour", "async", "--batch", "both", "--out", str(out))
    report = json.loads(out.read_text())
    # Only the async twin ran: its figures under "async", none where the sync ones go.
    assert not {"idle_core_share", "concurrency_1", "concurrency_8"} & set(report)
    figures = report["async"]
    assert 0 <= figures["idle_core_share"] < 1
    for concurrency in (1, 8):
        row = figures[f"concurrency_{concurrency}"]
        assert row["ratio"] == pytest.approx(row["runtime"] / row["bare"])
        assert row["batches_ratio"] == pytest.approx(row["runtime"] / row["unbatched"])
        for case in ("bare", "runtime", "unbatched"):
            assert row["all"][case] == [pytest.approx(row[case])]  # one round
            assert row["per_message"][case]["cpu_us"] > 0
        assert f"async claim+ack, concurrency {concurrency}: bare " in done.stdout
        assert f"async batches, concurrency {concurrency}: on " in done.stdout
    assert "idle async worker: " in done.stdout
    assert "\nclaim+ack" not in done.stdout  # no sync line


def test_quick_overhead_benchmark_prints_both_loops_and_their_difference() -> None:
    done = _run("bench.overhead", "--concurrency", "2")
    costs = {}
    for line in done.stdout.splitlines():
        name, _, rest = line.partition(": ")
        if name in ("bare", "runtime"):
            costs[name] = float(rest.split()[0])
    assert set(costs) == {"bare", "runtime"}
    assert all(cost > 0 for cost in costs.values())
    added = float(done.stdout.split("the runtime adds ")[1].split()[0])
    # All three are printed to 0.01, each within 0.005 of its value: the printed
    # difference and the difference of the printed two can be 0.015 apart.
    assert added == pytest.approx(costs["runtime"] - costs["bare"], abs=0.0151)


def test_keys_benchmark_prints_both_pairs_and_their_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In process, on the suite's in-memory backend, which keeps keys as every backend must
    # (a subprocess cannot see register_backend); a --url names any backend the same way.
    store = MemoryStore(time.time)
    register_backend("benchkeys", Backend(open=lambda url, event_type, options: store.open()))
    try:
        assert keys.main(["--quick", "--url", "benchkeys://queue"]) == 0
    finally:
        register_backend("benchkeys", None)
    out = capsys.readouterr().out
    figures = {}
    for line in out.splitlines()[1:]:
        label, _, value = line.rpartition(" ")
        figures[" ".join(label.split())] = float(value)
    assert list(figures) == [
        "publish, plain (us a message)",
        "publish, keyed (us a message)",
        "keyed / plain (target <= 1.4)",
        "publish_many of 100, plain (us a message)",
        "publish_many of 100, keyed (us a message)",
        "keyed / plain (target <= 1.5)",
    ]
    assert all(value > 0 for value in figures.values())
    # One round: each ratio is that round's, so it agrees with the printed costs (each
    # printed to 0.1 us, the ratio to 0.01).
    costs = list(figures.values())
    for plain, keyed, ratio in (costs[0:3], costs[3:6]):
        low, high = (keyed - 0.05) / (plain + 0.05), (keyed + 0.05) / max(plain - 0.05, 1e-9)
        assert low - 0.005 <= ratio <= high + 0.005, (plain, keyed, ratio)
    # Every keyed publish used a fresh key: each stored a message; the run purged them all.
    assert len(store.keys) == 10 + 50 + 2 * 100
    assert store.messages == {}


def test_timers_benchmark_prints_claim_costs_and_wake_latencies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In process on the in-memory backend, which keeps delayed messages as every backend
    # with timers must; a waiting claim there rechecks five times a second.
    store = MemoryStore(time.time)
    register_backend("benchtimers", Backend(open=lambda url, event_type, options: store.open()))
    try:
        assert timers.main(["--quick", "--url", "benchtimers://queue", "--due-in", "0.3"]) == 0
    finally:
        register_backend("benchtimers", None)
    lines = capsys.readouterr().out.splitlines()
    figures = {" ".join(line.split()[:-1]): float(line.split()[-1]) for line in lines[1:]}
    assert list(figures)[1:4] == [
        "claim p50, no delayed messages (us)",
        "claim p50, 2,000 delayed (us)",
        "with / without (target <= 1.3)",
    ]
    assert all(value > 0 for value in figures.values()), figures
    # A due message cannot wake a claim before it is due, nor (here) much after.
    assert 0 < figures["wake for a due message, median (ms)"] < 1000
    assert (store.messages, store.timers) == ({}, {}), "the run left messages behind"


CASES = {
    "sqlite": ["single", "batch", "chain", "floor", "chain_async"],
    "postgresql": ["single", "batch", "chain", "floor_batch", "floor_groups"],
    "redis": ["single", "batch", "chain", "floor", "floor_batch"],
}
# Each backend's ratios with a target: (name, bound), in the order printed.
TARGETED = {
    ("sqlite", "normal"): [("ack_and_claim loop / two-commit floor, synchronous=normal", 1.0)],
    ("sqlite", "full"): [("async ack_and_claim / sync twin, synchronous=full", 0.8)],
    ("postgresql", None): [
        ("claim_many+ack_many / claim+ack", 8.0),
        ("claim_many+ack_many / raw SQL batches", 0.7),
    ],
    ("redis", None): [
        ("claim_many+ack_many / claim+ack", 5.0),
        ("claim+ack / its round trips", 0.8),
    ],
}


def _check_section(section: batch.Section, rounds: int) -> None:
    """Every case measured ``rounds`` times; each ratio the median of the rounds' own,
    within their range; each target judged against its bound, and only those targets."""
    assert sorted(section.results) == sorted(CASES[section.scheme])
    for name, result in section.results.items():
        assert len(result["rounds"]) == rounds, name
        assert all(rate > 0 for rate in result["rounds"]), name
    targeted = []
    for ratio in section.checked:
        assert ratio["low"] <= ratio["measured"] <= ratio["high"], ratio
        if ratio["target"] == "-":
            assert ratio["passed"] is None
            continue
        bound = float(ratio["target"].removeprefix(">= "))
        assert ratio["passed"] is (ratio["measured"] >= bound)
        targeted.append((ratio["name"], bound))
    assert targeted == TARGETED[section.scheme, section.level]


def test_batch_benchmark_measures_sqlite_at_both_levels_and_prints_tables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert batch.main(["--quick", "--rounds", "2", "-n", "60"]) == 0
    out = capsys.readouterr().out
    titles = [line.split(":")[0] for line in out.splitlines() if line.startswith("sqlite")]
    assert titles == ["sqlite, synchronous=normal", "sqlite, synchronous=full"]
    for label in (
        "claim + ack, one at a time",
        "claim_many(50) + ack_many",
        "ack_and_claim loop, async twin",
        "floor: UPDATE commit + DELETE commit",
    ):
        assert out.count(f"  {label} ") == 2, label
    floors = [line for line in out.splitlines() if "ack_and_claim loop / two-commit" in line]
    assert len(floors) == 2
    # held to its bound at normal only, and judged
    assert floors[0].endswith((">= 1  met", ">= 1  NOT MET")), floors[0]
    assert ">=" not in floors[1], floors[1]


def test_batch_benchmark_reports_each_ratio_from_the_rounds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}?synchronous=normal"
    queue, [section] = batch.measure(url, rounds=3, n=40, limit=7)
    assert (queue, section.scheme, section.level) == (url, "sqlite", "normal")
    _check_section(section, 3)
    chain, floor = section.results["chain"]["rounds"], section.results["floor"]["rounds"]
    [first] = [r for r in section.checked if r["name"].startswith("ack_and_claim loop / two")]
    assert first["measured"] == pytest.approx(
        sorted(a / b for a, b in zip(chain, floor, strict=True))[1]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["q.db"], "the floor's file was left behind"


def test_batch_benchmark_measures_the_raw_floor_on_postgresql() -> None:
    from tests.postgres.server import server_url

    url = server_url()
    _, [section] = batch.measure(url, rounds=2, n=120, limit=batch.LIMIT)
    _check_section(section, 2)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench\\_batch\\_%'"
        ).fetchone()
    assert left == (0,), "the run left its schemas behind"


def test_batch_benchmark_measures_the_round_trip_floors_on_redis() -> None:
    import redis

    from tests.redis.server import server_url

    url = server_url()
    queue, [section] = batch.measure(url, rounds=2, n=120, limit=batch.LIMIT)
    _check_section(section, 2)
    name = queue.partition("queue=")[2]
    client = redis.Redis.from_url(url)
    try:
        assert list(client.scan_iter(match=f"dt:{{{name}}}:*")) == [], "keys left behind"
    finally:
        client.close()


def test_batch_benchmark_refuses_a_batch_larger_than_a_round_fills() -> None:
    with pytest.raises(SystemExit):
        batch.main(["--quick", "--limit", "501"])


@pytest.mark.slow
def test_peers_benchmark_runs_ours_everywhere_and_each_installed_peer(tmp_path: Path) -> None:
    import psycopg
    import redis

    from tests.postgres.server import server_url as postgres_url
    from tests.redis.server import server_url as redis_url

    out = tmp_path / "peers.json"
    postgres, redis_server = postgres_url(), redis_url()
    argv = ["--messages", "200", "--groups", "20", "--rounds", "1", "--concurrency", "4"]
    argv += ["--postgres", postgres, "--redis", redis_server, "--out", str(out)]
    assert peers.main(argv) == 0
    cases = json.loads(out.read_text())["cases"]
    assert list(cases) == list(peers.CASES)
    for name, case in cases.items():
        needs = {"procrastinate": ["procrastinate"], "pgqueuer": ["pgqueuer", "asyncpg"]}.get(
            name.partition("-")[0], []
        )
        missing = [m for m in needs if importlib.util.find_spec(m) is None]
        if name == "pgmq" or missing:  # a server extension; or a peer not installed here
            assert "not_run" in case, name
            assert name == "pgmq" or "is not installed" in case["not_run"], case
            continue
        # It ran, and its checks passed: every message once, in order where promised.
        assert "not_run" not in case, case
        assert len(case["drain"]) == len(case["publish"]) == 1, name
        assert case["drain_median"] > 0, name
        assert case["publish_median"] > 0, name
        if peers.CASES[name].ordered:
            assert case["seen"] == [{"groups_out_of_order": 0, "overlaps": 0}], name
    with psycopg.connect(postgres, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench\\_peers\\_%'"
        ).fetchone()
    assert left == (0,), "the run left its schemas behind"
    client = redis.Redis.from_url(redis_server)
    try:
        assert list(client.scan_iter(match="dt:{bench-peers-*")) == [], "keys left behind"
    finally:
        client.close()


def test_peers_benchmark_refuses_a_broken_drain() -> None:
    record = peers.Record()
    size = peers.Size(messages=4, groups=2, concurrency=1)
    for group, n in [(0, 0), (1, 1), (1, 3), (0, 2)]:
        record.handle(group, n)
    assert record.check(size, ordered=True) == {"groups_out_of_order": 0, "overlaps": 0}
    record.handle(0, 2)  # handled twice
    with pytest.raises(peers.Broken, match="1 handled more than once"):
        record.check(size, ordered=True)
    reordered = peers.Record()
    for group, n in [(0, 2), (1, 1), (1, 3), (0, 0)]:
        reordered.handle(group, n)
    assert reordered.check(size, ordered=False)["groups_out_of_order"] == 1
    with pytest.raises(peers.Broken, match="1 groups handled out of publish order"):
        reordered.check(size, ordered=True)
    overlapping = peers.Record()
    overlapping.begin(0, 0)
    overlapping.begin(0, 2)  # while 0 still runs
    for group, n in [(1, 1), (1, 3)]:
        overlapping.handle(group, n)
    with pytest.raises(peers.Broken, match="1 handlers started while another"):
        overlapping.check(size, ordered=True)
