"""The Grafana dashboard and the Prometheus alert rules in docs/metrics/ ask only for
metrics that exist (the catalogue, which the docs page test holds to what is served)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from transports_worker._metrics import METRICS

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "metrics"
NAME = re.compile(r"\btransports_[a-z_]+")
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def _known() -> set[str]:
    names = {spec.name for spec in METRICS}
    for spec in METRICS:
        if spec.kind == "histogram":
            names.update(spec.name + suffix for suffix in HISTOGRAM_SERIES)
    return names


def _expressions() -> dict[str, str]:
    dashboard = json.loads((FOLDER / "grafana-dashboard.json").read_text())
    found = {
        f"panel {panel['title']!r}": target["expr"]
        for panel in dashboard["panels"]
        for target in panel["targets"]
    }
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found[f"variable {variable['name']}"] = variable["definition"]
    rules = (FOLDER / "alerts.yml").read_text()
    for alert, expr in re.findall(
        r"- alert: (\w+)\n\s+expr: (.*?)\n\s+(?:for|labels):", rules, re.S
    ):
        found[f"alert {alert}"] = expr
    return found


def test_every_expression_names_only_served_metrics() -> None:
    expressions = _expressions()
    assert len([k for k in expressions if k.startswith("alert ")]) == 5
    for where, expr in expressions.items():
        names = set(NAME.findall(expr))
        assert names, f"{where} names no metric: {expr}"
        assert names <= _known(), f"{where} asks for {names - _known()}"


def test_the_alerts_cover_dead_letters_idle_claims_an_old_and_a_growing_backlog() -> None:
    rules = (FOLDER / "alerts.yml").read_text()
    alerts = set(re.findall(r"- alert: (\w+)", rules))
    assert {
        "TransportsDeadLettersGrowing",
        "TransportsNoClaimsWhileReady",
        "TransportsBacklogGrowing",
        "TransportsOldestReadyTooOld",
    } <= alerts
