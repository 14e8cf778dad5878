"""What wakes a claim that waits: a change to the database's files, or a nudge.

On Linux a `Watcher` asks inotify about the database's *directory* and picks out the
events of the database and its ``-wal`` file. It never opens or closes those files:
closing any descriptor of a database file drops every SQLite lock the process holds on
it (POSIX advisory locks belong to the process, not the descriptor). Elsewhere there is
no file event, and the waiting claim falls back on reading the change counter on a
schedule that starts short and grows (core's `Backoff`). A pipe lets the transport nudge its
waiters: on `close`, and on its own commits to an in-memory database, which has no files.

Imports no driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import sys
from pathlib import Path
from typing import Final

__all__ = ["Watcher"]

_IN_MODIFY = 0x00000002
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()

# After a file event, how soon to look again while the commit is not yet visible: SQLite
# writes the WAL, flushes it, and only then publishes the commit in the shared-memory
# index, which no file event reports. About 50 ms of looks, closest first.
CONFIRM: Final = (0.0005,) * 10 + (0.001,) * 20 + (0.0025,) * 10


class Watcher:
    """One waiting claim's view of the database's files, plus a pipe to nudge it."""

    def __init__(self, path: str | None) -> None:
        self._names: frozenset[bytes] = frozenset()
        self._inotify = -1
        self._nudge_r, self._nudge_w = os.pipe()
        for fd in (self._nudge_r, self._nudge_w):
            os.set_blocking(fd, False)
        if path is not None and _LIBC is not None:
            target = Path(path).absolute()
            fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                mask = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
                if _LIBC.inotify_add_watch(fd, os.fsencode(target.parent), mask) >= 0:
                    self._inotify = fd
                    name = os.fsencode(target.name)
                    self._names = frozenset({name, name + b"-wal"})
                else:
                    os.close(fd)

    @property
    def sees_files(self) -> bool:
        """Whether changes to the files wake it (else the caller polls, see `Backoff`)."""
        return self._inotify >= 0

    @property
    def confirm(self) -> tuple[float, ...]:
        """The delays of the looks that confirm a wake-up (`CONFIRM` if it sees files)."""
        return CONFIRM if self._inotify >= 0 else ()

    def fds(self) -> tuple[int, ...]:
        """The descriptors that become readable when it should wake."""
        return (self._nudge_r,) if self._inotify < 0 else (self._nudge_r, self._inotify)

    def nudge(self) -> None:
        """Wake it from any thread (a full pipe is already a pending wake)."""
        with contextlib.suppress(OSError):  # BlockingIOError included
            os.write(self._nudge_w, b"\0")

    def wait(self, timeout: float) -> bool:
        """Sleep until woken or ``timeout`` seconds pass; True when something happened."""
        ready, _, _ = select.select(self.fds(), [], [], timeout)
        return bool(ready) and self.drain()

    def drain(self) -> bool:
        """Read what woke it; True for a nudge or an event on the database's files."""
        woke = False
        try:
            while os.read(self._nudge_r, 4096):
                woke = True
        except BlockingIOError:
            pass
        if self._inotify >= 0:
            try:
                while data := os.read(self._inotify, 16384):
                    woke = self._ours(data) or woke
            except BlockingIOError:
                pass
        return woke

    def _ours(self, data: bytes) -> bool:
        offset, size, ours = 0, _EVENT.size, False
        while offset + size <= len(data):
            _, _, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + size : offset + size + length].rstrip(b"\0")
            ours = ours or name in self._names
            offset += size + length
        return ours

    def close(self) -> None:
        for fd in (self._inotify, self._nudge_r, self._nudge_w):
            if fd >= 0:
                os.close(fd)
        self._inotify = self._nudge_r = self._nudge_w = -1
