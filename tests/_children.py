"""Worker processes that run until told to stop, for the crash and restart tests, and
the wrapper that lets one worker loop drive either twin."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def until_stopped(
    target: Callable[[str, str, str, str], None], url: str, directory: Path, count: int
) -> Iterator[list[Path]]:
    """``count`` spawned processes, each running ``target(url, name, journal, stop)``
    until the file ``stop`` exists; yields their journals. On leaving, the stop file is
    made and every child must end cleanly; a child still running after an error is killed."""
    stop = directory / "stop"
    journals = [directory / f"w{i}.journal" for i in range(count)]
    spawn = multiprocessing.get_context("spawn")
    children = [
        spawn.Process(target=target, args=(url, f"w{i}", str(journal), str(stop)))
        for i, journal in enumerate(journals)
    ]
    for child in children:
        child.start()
    try:
        yield journals
        stop.touch()
        for child in children:
            child.join(120)
        codes = [child.exitcode for child in children]
        assert codes == [0] * count, f"worker exit codes {codes}"
    finally:
        stop.touch()
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()


class Awaited:
    """An async transport driven from sync code: each method call runs to completion on
    ``loop``, so that one worker loop serves both twins."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Any) -> None:
        self._loop, self._transport = loop, transport

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._transport, name)
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))
