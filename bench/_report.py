"""Turning results into the targets check, the printed table and the plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from . import batch

Results = dict[str, Any]


def _median(results: Results, key: str) -> float | None:
    case = results.get(key)
    return None if case is None else float(case["median"])


def _ratio(results: Results, key: str, base: str) -> float | None:
    top, bottom = _median(results, key), _median(results, base)
    return None if top is None or bottom is None else top / bottom


def _backlog_ratio(results: Results, prefix: str) -> tuple[float | None, str]:
    sizes = sorted(int(k.rsplit(".", 1)[1]) for k in results if k.startswith(prefix + "."))
    if len(sizes) < 2:
        return None, ""
    small, large = sizes[0], sizes[-1]
    return _ratio(results, f"{prefix}.{large}", f"{prefix}.{small}"), f"{large:,} vs {small:,}"


def targets(results: Results) -> list[dict[str, Any]]:
    """Each target of the issue: measured value, bound, and whether it holds."""
    out: list[dict[str, Any]] = []

    def add(name: str, measured: float | None, bound: float, at_least: bool) -> None:
        passed = (
            None if measured is None else (measured >= bound if at_least else measured <= bound)
        )
        out.append(
            {
                "name": name,
                "measured": measured,
                "target": f"{'>=' if at_least else '<='} {bound}",
                "passed": passed,
            }
        )

    for groups in (10, 10_000, 100):
        ratio, which = _backlog_ratio(results, f"backlog.{groups}")
        if ratio is not None:
            add(f"claim+ack latency, {groups} groups, {which} queued", ratio, 1.3, False)
    # (name, case, baseline, lower bound) of each ratio that must reach its bound; the
    # async twin is held to the sync twin, measured in the same interleaved rounds.
    ratios = [
        ("claim+ack vs floor, synchronous=full", "sync.full", "floor.full", 0.7),
        ("claim+ack vs floor, synchronous=normal", "sync.normal", "floor.normal", 0.5),
        ("async claim+ack vs sync twin, synchronous=full", "async.full", "sync.full", 0.8),
        ("async claim+ack vs sync twin, synchronous=normal", "async.normal", "sync.normal", 0.5),
    ]
    for sync in ("full", "normal"):
        ratios.append(
            (
                f"publish vs raw INSERT commit, synchronous={sync}",
                f"publish.{sync}",
                f"publish_raw.{sync}",
                0.7,
            )
        )
    for sync in ("full", "normal"):
        ratios.append(
            (
                f"publish_many vs raw batched INSERT, synchronous={sync}",
                f"publish_many.{sync}",
                f"publish_many_raw.{sync}",
                0.5,
            )
        )
    for name, key, base, bound in ratios:
        add(name, _ratio(results, key, base), bound, True)
    for sync in ("normal", "full"):  # bench.batch's targets on SQLite, each at its level
        measured = {
            key.split(".", 2)[2]: case
            for key, case in results.items()
            if key.startswith(f"batch.{sync}.")
        }
        out += [t for t in batch.check(measured, "sqlite", sync) if t["passed"] is not None]
    for sync in ("normal", "full"):
        key = f"processes.{sync}.4"
        add(
            f"4 processes vs 1, synchronous={sync}",
            _ratio(results, key, f"processes.{sync}.1"),
            0.8,
            True,
        )
        runs = [results.get(f"processes.{sync}.{w}") for w in (1, 4)]
        if all(runs):
            ok = all(not r["errors"] and r["drained"] for r in runs if r)
            add(f"processes, synchronous={sync}: no errors, all acked once", float(ok), 1.0, True)
    for peer in ("persist_queue", "litequeue"):
        theirs = results.get(f"peers.{peer}")
        if theirs is None:
            out.append(
                {"name": f"ahead of {peer}", "measured": None, "target": "> 1", "passed": None}
            )
            continue
        ours = results[f"peers.ours.{theirs['synchronous']}"]
        for what in ("put", "get_ack"):
            add(
                f"ahead of {peer} ({what}, synchronous={theirs['synchronous']})",
                ours[what] / theirs[what],
                1.0,
                True,
            )
    return out


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.3f} ms"
    if unit == "msg/s":
        return f"{value:,.0f}/s"
    return f"{value:.2f}"


def table(results: Results, checked: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """A plain-text table: every case's median (and ratio to its baseline), then targets."""
    base = {
        "sync": "floor",
        "async": "floor",
        "publish": "publish_raw",
        "publish_many": "publish_many_raw",
        "publish_many_spread": "publish_many_raw",
    }
    lines = [f"{'case':<34} {'median':>16} {'ratio':>8}  baseline", "-" * 72]
    for key, case in results.items():
        if key.startswith("peers.") or case is None:
            continue
        kind = key.split(".")[0]
        ratio, against = None, ""
        if kind in base:
            against = f"{base[kind]}.{key.split('.', 1)[1]}"
            ratio = _ratio(results, key, against)
        elif kind == "batch":
            _, sync, name = key.split(".")
            bottom = next((r.bottom for r in batch.RATIOS["sqlite"] if r.top == name), None)
            if bottom is not None:  # as its target is judged: the rounds' own ratios
                against = f"batch.{sync}.{bottom}"
                top_rounds, bottom_rounds = case["rounds"], results[against]["rounds"]
                ratio = statistics.median(
                    a / b for a, b in zip(top_rounds, bottom_rounds, strict=True)
                )
        elif kind == "processes":
            against = key.rsplit(".", 1)[0] + ".1"
            ratio = _ratio(results, key, against) if against != key else None
        elif kind in ("backlog", "seed"):
            _, groups, _size = key.split(".")
            first = min(
                (k for k in results if k.startswith(f"{kind}.{groups}.")),
                key=lambda k: int(k.rsplit(".", 1)[1]),
            )
            against, ratio = (first, _ratio(results, key, first)) if first != key else ("", None)
        lines.append(
            f"{key:<34} {_fmt(case['median'], case['unit']):>16} {_fmt(ratio):>8}  {against}"
        )
    lines.append("")
    lines.append(f"{'peer (same messages, same run)':<40} {'put':>12} {'get+ack':>12}  synchronous")
    for key in ("peers.persist_queue", "peers.litequeue", "peers.ours.full", "peers.ours.normal"):
        peer = results.get(key)
        if peer is None:
            lines.append(f"{key:<40} {'not installed':>12}")
        else:
            lines.append(
                f"{key:<40} {_fmt(peer['put'], 'msg/s'):>12} {_fmt(peer['get_ack'], 'msg/s'):>12}"
                f"  {peer['synchronous']}"
            )
    lines.append("")
    lines.append(f"{'target':<62} {'measured':>9} {'bound':>8}  result")
    for t in checked:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["passed"]]
        lines.append(f"{t['name']:<62} {_fmt(t['measured']):>9} {t['target']:>8}  {verdict}")
    machine = meta["machine"]
    lines.append("")
    lines.append(
        f"python {machine['python']}, sqlite {machine['sqlite']}, {machine['cpus']} cpus, "
        f"a thread trip {machine['thread_trip_us']:.0f} us, "
        f"load {machine['loadavg'][0]:.2f} before / {meta['loadavg_after'][0]:.2f} after, "
        f"{meta['seconds']:.0f} s"
    )
    return "\n".join(lines)


def plot(results: Results, path: Path) -> bool:
    """Claim+ack latency against backlog size, per design and group count (log-log)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for key, case in results.items():
        kind = key.split(".")[0]
        if kind in ("backlog", "seed"):
            _, groups, size = key.split(".")
            series.setdefault((kind, groups), []).append((int(size), case["median"]))
    label = {"backlog": "this transport", "seed": "seed query, literal"}
    for (kind, groups), points in sorted(series.items()):
        points.sort()
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs,
            ys,
            marker="o" if kind == "backlog" else "s",
            linestyle="-" if groups == min(g for _, g in series) else "--",
            color="tab:blue" if kind == "backlog" else "tab:red",
            label=f"{label[kind]}, {int(groups):,} groups",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("queued messages")
    ax.set_ylabel("claim + ack, median (ms)")
    ax.set_title("Claim latency against backlog (synchronous=normal)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
