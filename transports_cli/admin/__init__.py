"""The commands that read and repair a queue through `transports_core.TransportAdmin`:
``inspect``, ``dead`` and ``purge``, and what they share (`_access`)."""

from __future__ import annotations

from ._access import plural, refuse_busy, refuse_private
from ._dead import dead
from ._inspect import inspect
from ._purge import purge

__all__ = ["dead", "inspect", "plural", "purge", "refuse_busy", "refuse_private"]
