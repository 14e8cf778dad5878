"""``python -m transports_cli``: the same as the ``transports`` command."""

from __future__ import annotations

from ._app import main

if __name__ == "__main__":
    main()
