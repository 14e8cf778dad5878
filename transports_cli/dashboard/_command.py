"""The ``dashboard`` command: check where to listen, choose the actions token, bind the
socket, then serve the app of `_web` with uvicorn until interrupted.

The socket is bound and listening before the first line is printed, so that whoever reads
that line (a person, or a test on ``--port 0``) can connect at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import socket

import click

from transports_cli._output import url_argument
from transports_cli.admin._access import open_admin
from transports_core import redact_url

__all__ = ["TOKEN_VARIABLE", "dashboard", "is_loopback"]

TOKEN_VARIABLE = "TRANSPORTS_DASHBOARD_TOKEN"
MIN_TOKEN = 16  # characters: a shorter token could be guessed by trying


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only: ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _web_stack() -> None:
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the dashboard needs the 'dashboard' extra ({exc.name} is not installed): "
            "pip install 'durable-transports[dashboard]'"
        ) from exc


def _token(allow_actions: bool) -> tuple[str | None, bool]:
    """The actions token and whether it came from the environment (so is not printed)."""
    if not allow_actions:
        return None, False
    given = os.environ.get(TOKEN_VARIABLE)
    if given is None or given == "":
        return secrets.token_urlsafe(32), False
    if len(given) < MIN_TOKEN:
        raise click.ClickException(
            f"{TOKEN_VARIABLE} is {len(given)} characters long; the actions token must "
            f"have at least {MIN_TOKEN}, so that it cannot be guessed"
        )
    return given, True


def _listen(host: str, port: int) -> socket.socket:
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise click.ClickException(f"cannot listen on host {host!r}: {exc.strerror}") from exc
    family, kind, proto, _, address = info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    return sock


@click.command(short_help="Serve a web page showing a queue (read-only unless asked).")
@url_argument()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port; the first line printed says which).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a --host that is not a loopback address (anyone who reaches it sees the queue).",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help=f"Offer requeue, discard, purge (and pause/resume), to whoever signs in with the "
    f"token: printed once at start, or taken from {TOKEN_VARIABLE}.",
)
@click.option(
    "--refresh",
    type=click.FloatRange(0.5, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between the samples an open page takes of the queue's counts.",
)
def dashboard(
    url: str, host: str, port: int, allow_remote: bool, allow_actions: bool, refresh: float
) -> None:
    """Serve a dashboard of the queue at URL: its counts, a sparkline of its backlog,
    its groups (deepest, held, parked, in flight), its dead letters with their reasons
    and payloads, and a dead letter by seq. Needs the 'dashboard' extra.

    It only reads, unless started with --allow-actions: then a page signed in with the
    token can requeue and discard dead letters, purge a group, and pause or resume one
    where the backend can. Every action form carries a per-session CSRF token, checked
    by the server; cookies are HttpOnly and SameSite=Strict. The URL's password is never
    shown. It listens on loopback only, unless --allow-remote (then put it behind a proxy
    that adds TLS and authentication).

    \b
    Example:
      transports dashboard sqlite:///queue.db
      transports dashboard sqlite:///queue.db --port 0 --allow-actions
    """
    if not is_loopback(host) and not allow_remote:
        raise click.ClickException(
            f"refusing to listen on {host!r}: it is not a loopback address, so anyone who "
            "can reach this machine could read the queue, payloads included, over plain "
            "HTTP; pass --allow-remote to do it anyway (behind a proxy with TLS)"
        )
    _web_stack()
    token, from_environment = _token(allow_actions)
    from ._web import serve

    with open_admin(url) as admin:
        sock = _listen(host, port)
        bound = sock.getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        address = f"http://{shown_host}:{bound}/"
        mode = "actions allowed" if allow_actions else "read-only"
        click.echo(f"Dashboard of {redact_url(url)} at {address} ({mode}; Ctrl-C to stop)")
        if token is not None and from_environment:
            click.echo(f"Sign in at {address}login with the token in {TOKEN_VARIABLE}")
        elif token is not None:
            click.echo(f"Sign in at {address}login with the token {token} (printed only now)")
        loopback_names = {host, "localhost", "127.0.0.1", "::1"}
        # uvicorn shuts down on Ctrl-C, then raises it again: for a server, the normal end.
        with contextlib.suppress(KeyboardInterrupt):
            serve(
                admin,
                url,
                sock,
                token=token,
                refresh=refresh,
                hosts=loopback_names if is_loopback(host) else None,
            )
        click.echo("Dashboard stopped.")
