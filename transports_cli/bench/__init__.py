"""``transports bench``: the transport-level benchmark against any URL.

The cases it runs are the public module `transports_cli.bench.cases`, which the
repository's SQLite lab (``python -m bench``) imports too, so there is one copy of them.
"""

from __future__ import annotations

from ._command import bench

__all__ = ["bench"]
