"""Helpers for tests that need root: running code as the unprivileged user `nobody` in a
forked child, a directory that user can reach, and a small file system that fills up.

Each skips the test, saying why, where it cannot run (not root, no mount rights).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from transports_core import register_backend
from transports_sqlite import backend as sqlite_backend

NOBODY = 65534


def as_nobody(action: Callable[[], object]) -> object:
    """Run ``action`` in a forked child that has dropped to uid/gid 65534; return what it
    returned (JSON-able), or ``["error", type, message]``.

    Forked, not exec'd: the interpreter and the modules already loaded need not be
    readable by that user. The entry points are read from the installation, which may sit
    in a directory private to root (a clone in root's home), so the child registers the
    SQLite backend in-process instead.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            register_backend("sqlite", sqlite_backend)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result: object = action()
        except Exception as exc:
            result = ["error", type(exc).__name__, str(exc)]
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@contextmanager
def shared_directory() -> Iterator[Path]:
    """A new directory `nobody` can reach (pytest's tmp_path is private to root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to drop to another user")
    path = Path(tempfile.mkdtemp(prefix="transports-ro-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        path.chmod(0o755)
        shutil.rmtree(path)


@contextmanager
def small_disk(where: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where``/mnt for the test (needs mount rights)."""
    mnt = where / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(directory: Path) -> Path:
    """Write a file until the file system is full; return it."""
    filler = directory / "filler"
    # Unbuffered, so that the write that fails is the last one: nothing is left for
    # close() to flush into a full file system.
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler
