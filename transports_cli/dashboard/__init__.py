"""``transports dashboard``: a small web page over a queue's admin interface.

This package's ``__init__`` imports only click: the web stack (Starlette, uvicorn,
Jinja2) is the optional ``dashboard`` extra, imported when the command runs, so that
``transports --help`` works without it and its absence is an error naming the extra.
"""

from __future__ import annotations

from ._command import TOKEN_VARIABLE, dashboard

__all__ = ["TOKEN_VARIABLE", "dashboard"]
