"""The commands that read and repair a queue through `transports_core.TransportAdmin`:
``inspect``, ``dead`` and ``purge``, and what they share (`_access`)."""

from __future__ import annotations

from ._access import refuse_busy
from ._dead import dead
from ._inspect import inspect
from ._purge import purge

__all__ = ["dead", "inspect", "purge", "refuse_busy"]
