"""Who may act: the actions token, browser sessions and their CSRF tokens.

Only a dashboard started with ``--allow-actions`` has a `Guard`. A visitor gets a
session (a random id in an HttpOnly, SameSite=Strict cookie) with a CSRF token of its
own, which every form of that session carries in a hidden field. Signing in with the
actions token marks a *new* session as signed in (the old id is dropped, so an id planted
before sign-in is worth nothing). An action is done only for a signed-in session whose
form carries that session's CSRF token. Sessions live in memory: a restart signs everyone
out. Pure Python; imports no web framework.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

__all__ = ["COOKIE", "Guard", "Session"]

COOKIE = "transports_dashboard"
LIFETIME = 12 * 3600.0  # seconds a session lasts after it was made
MOST = 1000  # sessions kept; the oldest go first, so a flood of visits cannot fill memory


@dataclass
class Session:
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    signed_in: bool = False
    created: float = field(default_factory=time.monotonic)
    flash: list[str] = field(default_factory=list)  # results to show on the next page


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """The sessions of one dashboard process, and the token that signs them in."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._sessions: dict[str, Session] = {}

    def find(self, sid: str | None) -> Session | None:
        """The live session with id ``sid``, if any."""
        if not sid:
            return None
        session = self._sessions.get(sid)
        if session is not None and time.monotonic() - session.created > LIFETIME:
            del self._sessions[sid]
            return None
        return session

    def start(self, signed_in: bool = False) -> tuple[str, Session]:
        """A new session and its id."""
        while len(self._sessions) >= MOST:
            del self._sessions[next(iter(self._sessions))]
        sid = secrets.token_urlsafe(32)
        session = Session(signed_in=signed_in)
        self._sessions[sid] = session
        return sid, session

    def sign_in(self, sid: str | None, csrf: str, token: str) -> tuple[str, Session] | str:
        """The new signed-in session for a sign-in form, or why it is refused."""
        session = self.find(sid)
        if session is None or not _same(csrf, session.csrf):
            return "the sign-in form is stale or forged (no session, or a wrong CSRF token)"
        if not _same(token, self._token):
            return "wrong token"
        assert sid is not None
        del self._sessions[sid]
        return self.start(signed_in=True)

    def sign_out(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)

    def refusal(self, sid: str | None, csrf: str | None) -> str | None:
        """Why an action posted with session ``sid`` and form field ``csrf`` is refused;
        None when it may go ahead."""
        session = self.find(sid)
        if session is None or not session.signed_in:
            return "not signed in: sign in with the actions token first"
        if not csrf or not _same(csrf, session.csrf):
            return "the form's CSRF token is missing or wrong (reload the page and try again)"
        return None
