"""Worker processes that run until told to stop, for the crash and restart tests."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


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
