"""The commands that read and repair a queue through `transports_core.TransportAdmin`:
``inspect``, ``dead``, ``purge``, ``group`` and ``cancel``, and what they share
(`_access`)."""

from __future__ import annotations

from ._access import plural, refuse_busy, refuse_private
from ._cancel import cancel
from ._dead import dead
from ._group import group
from ._inspect import inspect
from ._purge import purge

__all__ = [
    "cancel",
    "dead",
    "group",
    "inspect",
    "plural",
    "purge",
    "refuse_busy",
    "refuse_private",
]
