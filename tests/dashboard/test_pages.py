"""The pages, in a real headless Chromium, against a live queue on each backend: the
figures are those of ``transports inspect --json`` and ``transports dead --json``, a
payload is shown as text (never run), and no page shows the URL's password."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.cli._command import transports
from transports_core import Event, TransportAdmin, open_transport

from ._queues import HOSTILE, prepare
from ._server import dashboard, inspect_json

pytestmark = pytest.mark.slow

# Where screenshots are copied besides tmp_path: `DASHBOARD_SCREENSHOTS=docs pytest ...`
# refreshes the ones docs/dashboard.md shows.
SCREENSHOTS = os.environ.get("DASHBOARD_SCREENSHOTS")


def screenshot(browser: webdriver.Chrome, directory: Path, name: str) -> None:
    path = directory / f"dashboard-{name}.png"
    assert browser.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SCREENSHOTS:
        shutil.copyfile(path, Path(SCREENSHOTS) / path.name)


def table(browser: webdriver.Chrome, selector: str) -> list[list[str]]:
    """The text of each cell of each body row of the first table matching ``selector``."""
    rows = browser.find_elements(By.CSS_SELECTOR, f"{selector} tbody tr")
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]


def figure(browser: webdriver.Chrome, name: str) -> int:
    return int(browser.find_element(By.ID, f"stat-{name}").text)


def shows(waiting: int) -> Callable[[webdriver.Chrome], bool]:
    """A wait condition: the page shows ``waiting`` messages waiting."""
    return lambda b: figure(b, "waiting") == waiting


def local_url(url: str, tmp_path: Path) -> tuple[str, Path | None]:
    """A SQLite queue is served by a path relative to its directory, so that the pages
    (and the screenshots) show no machine's path."""
    prefix = f"sqlite:///{tmp_path}/"
    return (f"sqlite:///{url[len(prefix) :]}", tmp_path) if url.startswith(prefix) else (url, None)


def test_pages_show_what_inspect_reports(
    store: tuple[str, str | None], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    url, password = store
    prepared = prepare(url)
    served, cwd = local_url(url, tmp_path)
    pages: list[str] = []
    with dashboard(served, cwd=cwd) as running:
        report = inspect_json(url)
        browser.get(running.address)
        pages.append(browser.page_source)
        totals = report["totals"]
        assert isinstance(totals, dict)
        assert {name: figure(browser, name) for name in totals} == totals
        assert figure(browser, "keys") == report["keys"]
        assert figure(browser, "waiting") == sum(
            totals[n] for n in ("ready", "in_flight", "parked")
        )
        assert int(browser.find_element(By.ID, "groups-total").text) == report["groups_total"]
        groups = report["groups"]
        assert isinstance(groups, list)
        assert [row[:5] for row in table(browser, "table.groups")] == [
            [g["group_id"], str(g["priority"]), str(g["depth"]), str(g["head_seq"]),
             g["state"].replace("_", " ")]
            for g in groups
        ]  # fmt: skip
        held = report["held_groups"]
        assert isinstance(held, list)
        assert [row[:3] for row in table(browser, "#held")] == [
            [h["group_id"], str(h["seq"]), str(h["waiting"])] for h in held
        ]
        assert [h["seq"] for h in held] == [prepared.held_seq]
        by_priority = report["by_priority"]
        assert isinstance(by_priority, list)
        counted = ["priority", "ready", "in_flight", "parked", "dead"]
        counted += ["ready_groups", "busy_groups"]
        shown = table(browser, "#by-priority")
        assert [row[:-1] for row in shown] == [[str(p[k]) for k in counted] for p in by_priority]
        assert figure(browser, "ready_groups") == report["ready_groups"]
        assert figure(browser, "busy_groups") == report["busy_groups"]
        # Ages grow between inspect's read and the page's: the page's is no younger.
        total = browser.find_element(By.ID, "stat-oldest_ready_age").text
        ages = [row[-1] for row in shown]
        for text, p in zip([*ages, total], [*by_priority, report], strict=True):
            if p["oldest_ready_age"] is None:
                assert text == "-", (text, p)
            else:
                assert text.endswith(" s"), text
                assert float(text[:-2]) >= p["oldest_ready_age"] - 0.05, (text, p)
        assert browser.find_element(By.ID, "mode").text == "read-only"
        assert browser.find_elements(By.CSS_SELECTOR, "form[action^='/actions/']") == []

        # Groups, filtered by state.
        browser.get(running.at("/groups?state=parked"))
        pages.append(browser.page_source)
        assert [row[0] for row in table(browser, "table.groups")] == ["parked"]

        # Dead letters: as `transports dead --json` lists them, payloads as text.
        done = transports("dead", url, "--json")
        assert done.returncode == 0, done.stderr
        letters = json.loads(done.stdout)
        browser.get(running.at("/dead"))
        pages.append(browser.page_source)
        rows = table(browser, "#dead")
        assert [(r[0], r[1], r[3], r[5], r[6]) for r in rows] == [
            (str(d["seq"]), d["group_id"], str(d["attempts"]), "yes" if d["held"] else "no",
             d["reason"])
            for d in letters
        ]  # fmt: skip
        assert HOSTILE in rows[0][7]  # shown as text: had it run, its alert would fail .get

        # One dead letter by seq, through the look-up form; then a seq that is none.
        browser.find_element(By.ID, "lookup-seq").send_keys(str(prepared.held_seq))
        browser.find_element(By.CSS_SELECTOR, "form.lookup button").click()
        WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "message-payload"))
        pages.append(browser.page_source)
        payload = browser.find_element(By.ID, "message-payload").text
        assert json.loads(payload) == {"order": 17, "note": HOSTILE}
        assert browser.find_element(By.ID, "message-reason").text == letters[0]["reason"]
        if cwd is not None:
            screenshot(browser, tmp_path, "message")
        browser.get(running.at("/messages/999999"))
        pages.append(browser.page_source)
        assert browser.find_element(By.ID, "not-found").text.startswith("Not found: no dead")
        browser.get(running.at("/messages/1"))  # the leased group's head: no payload to show
        assert "head of group leased" in browser.find_element(By.ID, "not-found").text
    assert running.returncode == 0, running.output
    if password is not None:
        for text in [*pages, running.output]:
            assert password not in text
        assert "***" in running.lines[0]


def test_sparkline_and_counts_follow_the_queue(browser: webdriver.Chrome, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    prepare(url)
    with dashboard("sqlite:///queue.db", "--refresh", "0.5", cwd=tmp_path) as running:
        browser.get(running.address)
        start = figure(browser, "waiting")
        line = browser.find_element(By.ID, "sparkline-line")
        with open_transport(url) as queue:
            assert isinstance(queue, TransportAdmin)
            for batch in range(1, 6):
                for _ in range(batch * 3):
                    queue.publish(f"burst-{batch}", Event(batch=batch))
                want = queue.stats()
                waiting = want.ready + want.in_flight + want.parked
                # The page samples on its own: wait until it has shown this figure.
                WebDriverWait(browser, 20, poll_frequency=0.1).until(shows(waiting))
            by_priority = [
                [str(p.priority), str(p.ready), str(p.in_flight), str(p.parked), str(p.dead),
                 str(p.ready_groups), str(p.busy_groups)]
                for p in queue.stats().by_priority
            ]  # fmt: skip
        points = line.get_attribute("points") or ""
        assert len(points.split()) >= 6
        assert figure(browser, "waiting") == start + 3 * (1 + 2 + 3 + 4 + 5)
        assert "per second" in browser.find_element(By.ID, "rate").text
        # updated in place too (the ages apart: they grow)
        assert [row[:-1] for row in table(browser, "#by-priority")] == by_priority
        screenshot(browser, tmp_path, "overview")
    assert running.returncode == 0, running.output
