"""Actions change the store only when allowed: never without --allow-actions, never
without a signed-in session and its CSRF token, and then they do what they say. Against a
live queue on each backend, through real HTTP (and a real browser for the allowed path)."""

from __future__ import annotations

import re
from pathlib import Path

import markupsafe
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from transports_cli.dashboard import TOKEN_VARIABLE
from transports_core import TransportAdmin, open_transport

from ._queues import prepare
from ._server import Answer, dashboard, request
from .test_pages import local_url, screenshot

TOKEN = "a-test-token-of-enough-length-42"


def state(url: str) -> tuple[list[int], list[tuple[str, int]]]:
    """The dead letters' seqs and each group's depth: what an action would change."""
    with open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        groups = [(g.group_id, g.depth) for g in queue.groups(limit=100)]
        return [d.seq for d in queue.dead_letters()], sorted(groups)


def session_of(answer: Answer) -> tuple[str, str]:
    """The session cookie set by a page, and the CSRF token in its forms."""
    cookie = re.search(r"transports_dashboard=([^;]+)", answer.headers.get("set-cookie", ""))
    csrf = re.search(r'name="csrf" value="([^"]+)"', answer.body)
    assert cookie is not None, answer.headers
    assert csrf is not None, answer.body
    return cookie.group(1), csrf.group(1)


def test_without_allow_actions_nothing_acts(store: tuple[str, str | None]) -> None:
    url, _ = store
    prepared = prepare(url)
    before = state(url)
    with dashboard(url) as running:
        for action, form in [
            ("requeue", {"seq": str(prepared.held_seq)}),
            ("discard", {"seq": str(prepared.released_seq)}),
            ("purge", {"group": "deep"}),
        ]:
            answer = request(running.at(f"/actions/{action}"), {**form, "csrf": "x"})
            assert answer.status == 403
            assert "started without --allow-actions" in answer.body
        assert request(running.at("/login"), {"token": TOKEN, "csrf": "x"}).status == 403
        page = request(running.at("/dead"))
        assert page.status == 200
        assert "/actions/" not in page.body
        assert "set-cookie" not in {k.lower() for k in page.headers}
    assert state(url) == before


@pytest.mark.slow
def test_actions_need_the_token_and_the_csrf_token(
    store: tuple[str, str | None], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    url, password = store
    prepared = prepare(url)
    before = state(url)
    discard = {"seq": str(prepared.released_seq)}
    served, cwd = local_url(url, tmp_path)
    environ = {TOKEN_VARIABLE: TOKEN}
    with dashboard(served, "--allow-actions", env=environ, cwd=cwd) as running:
        assert TOKEN not in running.output  # taken from the environment: never printed
        act = running.at("/actions/discard")
        # No session at all, then a session that is not signed in (with its own CSRF).
        assert "not signed in" in request(act, {**discard, "csrf": "x"}).body
        cookie, csrf = session_of(request(running.at("/login")))
        answer = request(
            act, {**discard, "csrf": csrf}, {"Cookie": f"transports_dashboard={cookie}"}
        )
        assert (answer.status, "not signed in" in answer.body) == (403, True)

        # A wrong token signs nobody in.
        browser.delete_all_cookies()
        browser.get(running.at("/login"))
        browser.find_element(By.ID, "token").send_keys("not-the-token-at-all-000")
        browser.find_element(By.ID, "sign-in").click()
        # The click submits a form: wait for the answer's page rather than race its load.
        refused = WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "refused"))
        assert "wrong token" in refused[0].text
        assert state(url) == before

        # The right one does; that session's cookie without its CSRF token, or from
        # another origin, still acts on nothing.
        browser.get(running.at("/login"))
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "sign-in").click()
        WebDriverWait(browser, 10).until(lambda b: "Signed in" in b.page_source)
        signed = browser.get_cookie("transports_dashboard")
        assert signed is not None
        assert (signed["httpOnly"], signed["sameSite"]) == (True, "Strict")
        jar = {"Cookie": f"transports_dashboard={signed['value']}"}
        for form, headers, why in [
            (discard, jar, "CSRF token is missing"),
            ({**discard, "csrf": csrf}, jar, "CSRF token is missing or wrong"),
        ]:
            answer = request(act, form, headers)
            assert (answer.status, why in answer.body) == (403, True), answer.body
        browser.get(running.at("/dead"))
        page_csrf = browser.find_element(By.CSS_SELECTOR, "input[name=csrf]").get_attribute("value")
        assert page_csrf
        elsewhere = {**jar, "Origin": "http://evil.example"}
        answer = request(act, {**discard, "csrf": page_csrf}, elsewhere)
        assert (answer.status, "another origin" in answer.body) == (403, True)
        assert state(url) == before

        # With both, in the browser: requeue the held dead letter, discard the other.
        if cwd is not None:
            screenshot(browser, tmp_path, "actions")
        browser.find_element(By.ID, f"requeue-{prepared.held_seq}").click()
        WebDriverWait(browser, 10).until(
            lambda b: f"Requeued dead letter {prepared.held_seq}." in b.page_source
        )
        browser.find_element(By.ID, f"discard-{prepared.released_seq}").click()
        WebDriverWait(browser, 10).until(
            lambda b: f"Discarded dead letter {prepared.released_seq}." in b.page_source
        )
        dead, groups = state(url)
        assert dead == []
        assert dict(groups)["poison"] == 2  # its dead letter is back at its head

        # Purge a group, through its confirmation page.
        browser.get(running.at("/purge?group=deep"))
        assert "3 messages and 0 dead letters" in browser.find_element(By.ID, "purge-question").text
        browser.find_element(By.ID, "confirm-purge").click()
        WebDriverWait(browser, 10).until(lambda b: "Purged group 'deep'" in b.page_source)
        assert "deep" not in dict(state(url)[1])
        if password is not None:
            assert password not in browser.page_source
    assert running.returncode == 0, running.output


def test_the_printed_token_signs_in_and_old_sessions_do_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    prepared = prepare(url)
    with dashboard(url, "--allow-actions", env={TOKEN_VARIABLE: ""}) as running:
        printed = re.search(r"with the token (\S+) \(printed only now\)", running.lines[1])
        assert printed is not None, running.lines
        token = printed.group(1)
        assert len(token) >= 32
        cookie, csrf = session_of(request(running.at("/login")))
        before = {"Cookie": f"transports_dashboard={cookie}"}
        answer = request(running.at("/login"), {"token": token, "csrf": csrf}, before)
        assert (answer.status, answer.headers["location"]) == (303, "/")
        signed = re.search(r"transports_dashboard=([^;]+)", answer.headers["set-cookie"])
        assert signed is not None
        assert signed.group(1) != cookie  # a new session: one planted before is worth nothing
        discard = {"seq": str(prepared.released_seq), "csrf": csrf}
        assert request(running.at("/actions/discard"), discard, before).status == 403
        after = {"Cookie": f"transports_dashboard={signed.group(1)}"}
        fresh = session_of_page(request(running.at("/dead"), headers=after).body)
        answer = request(running.at("/actions/discard"), {**discard, "csrf": fresh}, after)
        assert answer.status == 303
    assert state(url)[0] == [prepared.held_seq]
    assert running.output.count(token) == 1  # printed once, at start


def session_of_page(body: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', body)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize(
    ("host", "why"),
    [("evil.example", "unexpected Host header"), ("localhost", "")],
)
def test_a_loopback_dashboard_answers_only_to_loopback_names(
    tmp_path: Path, host: str, why: str
) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    prepare(url)
    with dashboard(url) as running:
        port = running.address.rsplit(":", 1)[1].strip("/")
        answer = request(running.at("/"), headers={"Host": f"{host}:{port}"})
        assert answer.status == (421 if why else 200)
        assert why in answer.body
        assert "script-src 'self'" in answer.headers["content-security-policy"]


def sign_in(browser: webdriver.Chrome, address: str) -> dict[str, str]:
    """Sign the browser in with `TOKEN`; the session's cookie and CSRF token, to post
    with outside the browser."""
    browser.delete_all_cookies()
    browser.get(address + "login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "sign-in").click()
    WebDriverWait(browser, 10).until(lambda b: "Signed in" in b.page_source)
    cookie = browser.get_cookie("transports_dashboard")
    assert cookie is not None
    csrf = browser.find_element(By.CSS_SELECTOR, "input[name=csrf]").get_attribute("value")
    assert csrf
    return {"Cookie": f"transports_dashboard={cookie['value']}", "csrf": csrf}


def paused(url: str, group_id: str) -> object:
    with open_transport(url) as queue:
        assert isinstance(queue, TransportAdmin)
        group = next(g for g in queue.groups(limit=100) if g.group_id == group_id)
        return getattr(group, "paused", None)


@pytest.mark.slow
def test_pause_and_resume_are_offered_where_the_backend_can(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    prepare(url)
    with open_transport(url) as queue:
        can = all(callable(getattr(queue, m, None)) for m in ("pause_group", "resume_group"))
    env = {TOKEN_VARIABLE: TOKEN}
    with dashboard("sqlite:///queue.db", "--allow-actions", env=env, cwd=tmp_path) as running:
        session = sign_in(browser, running.address)
        browser.get(running.at("/groups"))
        pause = "//tr[@data-group='deep']//form[@action='/actions/pause']/button"
        buttons = browser.find_elements(By.XPATH, pause)
        if not can:  # this core has no pause: no button, and the endpoint refuses
            assert buttons == []
            form = {"group": "deep", "csrf": session["csrf"]}
            answer = request(running.at("/actions/pause"), form, {"Cookie": session["Cookie"]})
            refusal = str(markupsafe.escape("no action 'pause' here"))
            assert (answer.status, refusal in answer.body) == (400, True)
            return
        buttons[0].click()
        WebDriverWait(browser, 10).until(lambda b: "Paused group 'deep'." in b.page_source)
        assert paused(url, "deep") is True
        resume = "//tr[@data-group='deep']//form[@action='/actions/resume']/button"
        browser.find_element(By.XPATH, resume).click()
        WebDriverWait(browser, 10).until(lambda b: "Resumed group 'deep'." in b.page_source)
        assert paused(url, "deep") is False
