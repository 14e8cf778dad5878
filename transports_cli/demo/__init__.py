"""``transports demo``: worker processes drain the events of many executions under a live
view, then their journals are checked for order, exclusivity and nothing lost."""

from __future__ import annotations

from ._command import demo

__all__ = ["demo"]
