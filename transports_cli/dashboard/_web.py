"""The dashboard's web app: Starlette routes over one `TransportAdmin`, pages rendered on
the server from the Jinja2 templates beside this module, served by uvicorn.

Every read and action goes through the public admin interface (`TransportAdmin`, and
``pause_group``/``resume_group`` where the transport has them), run on Starlette's thread
pool since those calls block. The transports are thread-safe, so one handle serves every
request. What may act is decided by `_guard`; this module only asks it. Every response
carries a strict Content-Security-Policy (scripts and styles from this server only), and
on loopback a request must name a loopback host (a DNS-rebinding page cannot).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from transports_cli._output import one_line, scrub
from transports_cli.admin._access import all_groups, relative
from transports_core import (
    DeadLetter,
    GroupInfo,
    QueueStats,
    RequeueRefused,
    TransportAdmin,
    TransportError,
    redact_url,
)

from ._guard import COOKIE, Guard, Session

__all__ = ["make_app", "serve"]

HERE = Path(__file__).parent
# GroupInfo's own fields; any others (``paused``, ``tenant`` where the core has them)
# are shown as extra columns.
_GROUP_FIELDS = ("group_id", "priority", "depth", "head_seq", "state", "busy_until",
                 "last_claimed_at")  # fmt: skip
_STATES = ("ready", "in_flight", "parked", "held")
_SHORT_EVENT = 80  # characters of a payload shown in a table; its page shows all of it
_MAX_FORM = 16 * 1024  # bytes: every form here is a few short fields
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _host_name(header: str) -> str:
    """The host of a Host header, without its port: ``[::1]:8765`` -> ``::1``."""
    if header.startswith("["):
        return header[1 : header.find("]")]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _Hardened:
    """ASGI middleware: refuse a Host outside ``hosts`` (None: any), and add the security
    headers to every response."""

    def __init__(self, app: App, hosts: set[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", []),
                    (b"content-security-policy", _CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"same-origin"),  # no-referrer would make Origin "null"
                    (b"cache-control", b"no-store"),
                ]
            await send(message)

        headers = dict(scope["headers"])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if self.hosts is not None and host not in self.hosts:
            response = Response(
                f"unexpected Host header {host!r}: this dashboard answers only to "
                f"{', '.join(sorted(self.hosts))}",
                status_code=421,
                media_type="text/plain",
            )
            await response(scope, receive, secured)
            return

        await self.app(scope, receive, secured)


def _payload(event: str) -> str:
    """A stored event as indented JSON (as stored, if it is not JSON)."""
    try:
        return json.dumps(json.loads(event), indent=2, ensure_ascii=False)
    except ValueError:
        return event


def _short(text: str) -> str:
    return text if len(text) <= _SHORT_EVENT else text[: _SHORT_EVENT - 1] + "\u2026"


def _age(seconds: float | None) -> str:
    """An age as the pages show it (dashboard.js writes it the same way)."""
    return "-" if seconds is None else f"{seconds:.1f} s"


def _stats_json(stats: QueueStats) -> dict[str, Any]:
    document = {f.name: getattr(stats, f.name) for f in fields(stats) if f.name != "by_priority"}
    document["waiting"] = stats.ready + stats.in_flight + stats.parked
    document["by_priority"] = [asdict(p) for p in stats.by_priority]
    return document


class Dashboard:
    """The routes, over ``admin`` (opened from ``url``); ``guard`` None: read-only."""

    def __init__(
        self, admin: TransportAdmin, url: str, guard: Guard | None, refresh: float
    ) -> None:
        self.admin = admin
        self.url = redact_url(url)
        self.guard = guard
        self.refresh = refresh
        self.can_pause = callable(getattr(admin, "pause_group", None)) and callable(
            getattr(admin, "resume_group", None)
        )
        self.extra_columns = [f.name for f in fields(GroupInfo) if f.name not in _GROUP_FIELDS]
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            trim_blocks=True,
            lstrip_blocks=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.globals["age"] = _age

    # -- helpers ---------------------------------------------------------------------

    def _session(self, request: Request) -> tuple[str | None, Session | None]:
        if self.guard is None:
            return None, None
        sid = request.cookies.get(COOKIE)
        return sid, self.guard.find(sid)

    def render(
        self, request: Request, name: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        _, session = self._session(request)
        new_sid = None
        if self.guard is not None and session is None:
            new_sid, session = self.guard.start()
        flash = list(session.flash) if session is not None else []
        if session is not None:
            session.flash.clear()
        page = self.templates.get_template(name).render(
            url=self.url,
            actions=self.guard is not None,
            signed_in=session is not None and session.signed_in,
            csrf=session.csrf if session is not None else "",
            can_pause=self.can_pause,
            flash=flash,
            refresh=self.refresh,
            path=request.url.path,
            **context,
        )
        response = HTMLResponse(page, status_code=status)
        if new_sid is not None:
            self._set_cookie(response, new_sid)
        return response

    @staticmethod
    def _set_cookie(response: Response, sid: str) -> None:
        response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/")

    def refuse(self, request: Request, why: str, status: int = 403) -> HTMLResponse:
        return self.render(request, "refused.html", status=status, why=why)

    async def read(self, call: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(call, *args)

    async def failed(self, request: Request, exc: Exception) -> Response:
        """A read or action the store could not do (down, locked, gone): say so, 503."""
        why = f"the queue did not answer: {scrub(one_line(str(exc)))}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": why}, status_code=503)
        return self.refuse(request, why, status=503)

    # -- pages -----------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        def snapshot() -> tuple[QueueStats, list[GroupInfo], list[Any]]:
            stats = self.admin.stats()
            return stats, all_groups(self.admin, stats), self.admin.held_groups()

        stats, every, held = await self.read(snapshot)
        now = time.time()
        return self.render(
            request,
            "overview.html",
            stats=_stats_json(stats),
            deepest=every[:10],
            groups_total=len(every),
            by_state={s: sum(g.state == s for g in every) for s in _STATES},
            held=held,
            extra=self.extra_columns,
            relative=lambda when: relative(when, now),
        )

    async def groups(self, request: Request) -> Response:
        state = request.query_params.get("state", "")
        if state and state not in _STATES:
            return self.refuse(request, f"no such state {state!r}: one of {', '.join(_STATES)}",
                               status=400)  # fmt: skip

        def snapshot() -> tuple[list[GroupInfo], list[Any]]:
            return all_groups(self.admin, self.admin.stats()), self.admin.held_groups()

        every, held = await self.read(snapshot)
        shown = [g for g in every if not state or g.state == state]
        now = time.time()
        return self.render(
            request,
            "groups.html",
            state=state,
            states=_STATES,
            groups=shown,
            groups_total=len(every),
            held=held,
            extra=self.extra_columns,
            relative=lambda when: relative(when, now),
        )

    async def dead(self, request: Request) -> Response:
        try:
            limit = int(request.query_params.get("limit", "100"))
            if limit < 1:
                raise ValueError
        except ValueError:
            return self.refuse(request, "limit must be a whole number of at least 1", 400)

        def snapshot() -> tuple[QueueStats, list[DeadLetter]]:
            return self.admin.stats(), self.admin.dead_letters(limit)

        stats, letters = await self.read(snapshot)
        now = time.time()
        return self.render(
            request,
            "dead.html",
            letters=[(d, _short(d.event)) for d in letters],
            total=stats.dead,
            limit=limit,
            relative=lambda when: relative(when, now),
        )

    async def lookup(self, request: Request) -> Response:
        given = request.query_params.get("seq", "").strip()
        if not given.isdigit() or int(given) < 1:
            return self.refuse(request, f"{given!r} is not a seq (a whole number from 1)", 400)
        return RedirectResponse(f"/messages/{int(given)}", status_code=303)

    async def message(self, request: Request) -> Response:
        seq: int = request.path_params["seq"]

        def find() -> tuple[DeadLetter | None, GroupInfo | None]:
            letter = next((d for d in self.admin.dead_letters() if d.seq == seq), None)
            if letter is not None:
                return letter, None
            heads = all_groups(self.admin, self.admin.stats())
            return None, next((g for g in heads if g.head_seq == seq), None)

        letter, head = await self.read(find)
        return self.render(
            request,
            "message.html",
            status=200 if letter is not None or head is not None else 404,
            seq=seq,
            letter=letter,
            payload=_payload(letter.event) if letter is not None else "",
            head=head,
            relative=lambda when: relative(when, time.time()),
        )

    async def api_stats(self, request: Request) -> Response:
        stats = await self.read(self.admin.stats)
        return JSONResponse({"time": time.time(), **_stats_json(stats)})

    async def confirm_purge(self, request: Request) -> Response:
        if self.guard is None:
            return self.refuse(request, _DISABLED)
        group_id = request.query_params.get("group", "")

        def count() -> tuple[GroupInfo | None, int]:
            every = all_groups(self.admin, self.admin.stats())
            group = next((g for g in every if g.group_id == group_id), None)
            return group, sum(d.group_id == group_id for d in self.admin.dead_letters())

        group, letters = await self.read(count)
        return self.render(request, "purge.html", group_id=group_id, group=group,
                           letters=letters)  # fmt: skip

    # -- sign-in and actions ---------------------------------------------------------

    async def _form(self, request: Request) -> dict[str, str] | str:
        """The posted form's fields, or why the request is refused before looking."""
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return f"a form posted from another origin ({origin}) is refused"
        kind = request.headers.get("content-type", "").partition(";")[0].strip()
        if kind != "application/x-www-form-urlencoded":
            return "expected a form (application/x-www-form-urlencoded)"
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM:
                return "form too large"
        try:
            pairs = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            return "the form is not UTF-8"
        return {key: values[0] for key, values in pairs.items()}

    async def login_page(self, request: Request) -> Response:
        if self.guard is None:
            return self.refuse(request, _DISABLED)
        return self.render(request, "login.html")

    async def login(self, request: Request) -> Response:
        if self.guard is None:
            return self.refuse(request, _DISABLED)
        form = await self._form(request)
        if isinstance(form, str):
            return self.refuse(request, form)
        outcome = self.guard.sign_in(
            request.cookies.get(COOKIE), form.get("csrf", ""), form.get("token", "")
        )
        if isinstance(outcome, str):
            return self.refuse(request, f"not signed in: {outcome}")
        sid, session = outcome
        session.flash.append("Signed in: actions are available until this process stops.")
        response = RedirectResponse("/", status_code=303)
        self._set_cookie(response, sid)
        return response

    async def logout(self, request: Request) -> Response:
        if self.guard is None:
            return self.refuse(request, _DISABLED)
        form = await self._form(request)
        sid, session = self._session(request)
        if isinstance(form, str) or session is None or self.guard.refusal(sid, form.get("csrf")):
            return self.refuse(request, "sign-out refused: a stale or forged form")
        self.guard.sign_out(sid)
        return RedirectResponse("/", status_code=303)

    async def act(self, request: Request) -> Response:
        if self.guard is None:
            return self.refuse(request, _DISABLED)
        form = await self._form(request)
        if isinstance(form, str):
            return self.refuse(request, form)
        sid, session = self._session(request)
        why = self.guard.refusal(sid, form.get("csrf"))
        if why is not None or session is None:
            return self.refuse(request, why or "no session")
        name = request.path_params["name"]
        try:
            done = await self._do(name, form)
        except ValueError as exc:
            return self.refuse(request, str(exc), status=400)
        session.flash.append(done)
        back = form.get("back", "/")
        if back not in ("/", "/groups", "/dead") and not back.startswith("/groups?state="):
            back = "/"
        return RedirectResponse(back, status_code=303)

    async def _do(self, name: str, form: dict[str, str]) -> str:
        """Do action ``name``; what happened, in words. Raises ValueError for bad input."""
        if name in ("requeue", "discard"):
            given = form.get("seq", "")
            if not given.isdigit() or int(given) < 1:
                raise ValueError(f"{given!r} is not a seq (a whole number from 1)")
            seq = int(given)
            call = self.admin.requeue if name == "requeue" else self.admin.discard
            try:
                found = await self.read(call, seq)
            except RequeueRefused as exc:
                return f"Requeue of {seq} refused: {exc}"
            except TransportError as exc:
                return f"{name.capitalize()} of {seq} failed: {exc}"
            if not found:
                return f"No dead letter {seq} (requeued or discarded meanwhile?)"
            return f"{'Requeued' if name == 'requeue' else 'Discarded'} dead letter {seq}."
        group_id = form.get("group", "")
        if not group_id:
            raise ValueError("no group given")
        if name == "purge":
            removed = await self.read(self.admin.purge_group, group_id)
            return f"Purged group {group_id!r}: removed {removed} messages and dead letters."
        if name in ("pause", "resume") and self.can_pause:
            call = getattr(self.admin, f"{name}_group")
            changed = await self.read(call, group_id)
            verb = "Paused" if name == "pause" else "Resumed"
            return (
                f"{verb} group {group_id!r}."
                if changed
                else (
                    f"Group {group_id!r} was already {'paused' if name == 'pause' else 'running'}."
                )
            )
        raise ValueError(f"no action {name!r} here")


_DISABLED = (
    "actions are disabled: this dashboard was started without --allow-actions, so it only reads"
)


def make_app(
    admin: TransportAdmin,
    url: str,
    *,
    token: str | None,
    refresh: float = 2.0,
    hosts: set[str] | None = None,
) -> App:
    """The dashboard's ASGI app over ``admin``; ``token`` None: read-only."""
    board = Dashboard(admin, url, Guard(token) if token is not None else None, refresh)
    app = Starlette(
        routes=[
            Route("/", board.overview),
            Route("/groups", board.groups),
            Route("/dead", board.dead),
            Route("/message", board.lookup),
            Route("/messages/{seq:int}", board.message),
            Route("/api/stats", board.api_stats),
            Route("/purge", board.confirm_purge),
            Route("/login", board.login_page, methods=["GET"]),
            Route("/login", board.login, methods=["POST"]),
            Route("/logout", board.logout, methods=["POST"]),
            Route("/actions/{name}", board.act, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={TransportError: board.failed},
    )
    return _Hardened(app, hosts)


def serve(
    admin: TransportAdmin,
    url: str,
    sock: Any,
    *,
    token: str | None,
    refresh: float,
    hosts: set[str] | None,
) -> None:
    """Serve the dashboard on the listening socket ``sock`` until interrupted."""
    app = make_app(admin, url, token=token, refresh=refresh, hosts=hosts)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
