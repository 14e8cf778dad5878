"""What wakes a claim that waits: a change to the database's files, or a nudge.

On Linux a `Watcher` asks inotify about the database's *directory* and picks out the
events of the database and its ``-wal`` file. It never opens or closes those files:
closing any descriptor of a database file drops every SQLite lock the process holds on
it (POSIX advisory locks belong to the process, not the descriptor). Elsewhere there is
no file event, and the waiting claim falls back on reading the change counter on a
schedule that starts short and grows (see `Backoff`). A pipe lets the transport nudge its
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
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Final, Literal, NamedTuple

__all__ = ["CLAIM", "LOOK", "Backoff", "Watcher", "plan"]

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


class Backoff:
    """Where no file events exist: read the counter again after 1 ms, then ever less
    often, up to a quarter of a second; any change starts the schedule over."""

    FIRST = 0.001
    LAST = 0.25

    def __init__(self) -> None:
        self.delay = self.FIRST

    def next(self) -> float:
        delay = self.delay
        self.delay = min(delay * 2, self.LAST)
        return delay

    def reset(self) -> None:
        self.delay = self.FIRST


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


class WaitState(NamedTuple):
    """What a waiting claim compares between looks: the database's change counter (moved
    by other connections' commits), its own transport's commits (which that counter does
    not count), and when the next lease or park at or above its floor ends (None: none)."""

    version: int
    commits: int
    due: float | None


LOOK: Final = "look"  # the driver answers with a fresh `WaitState`
CLAIM: Final = "claim"  # the driver tries the claim, and answers whether it leased
# Any other step is a float: sleep that long unless woken, and answer whether woken.
Step = Literal["look", "claim"] | float

# Between looks a claim sleeps at most this long, so that a clock moved by a test, or a
# change no watcher saw, is noticed.
LOOK_EVERY: Final = 1.0
# After a file event, how soon to look again while the commit is not yet visible: SQLite
# writes the WAL, flushes it, and only then publishes the commit in the shared-memory
# index, which no file event reports. About 50 ms of looks, closest first.
CONFIRM: Final = (0.0005,) * 10 + (0.001,) * 20 + (0.0025,) * 10
# Wake this long after a lease or park ends, so that it has ended by the clock too.
AFTER_DUE: Final = 0.001


def plan(
    wait: float, sees_files: bool, clock: Callable[[], float], monotonic: Callable[[], float]
) -> Generator[Step, object, None]:
    """The steps of one claim that waits, shared by both twins; they run the steps.

    A claim is tried again only when something may have become deliverable: another
    connection committed, the transport itself committed, or a lease or park ran out.
    Each baseline is looked at before the claim it guards, so that a commit landing
    between the two is seen at the next look. The plan ends when the wait is over (or
    the driver stops it, having leased)."""
    deadline = monotonic() + wait
    backoff = None if sees_files else Backoff()
    seen = yield LOOK
    assert isinstance(seen, WaitState)
    while True:
        # A lease or park already over when looked at, which the claim did not take, is
        # not ours to wait for (below the floor once woken, or taken meanwhile).
        pending = seen.due if seen.due is not None and seen.due > clock() else None
        if (yield CLAIM):
            return
        while True:
            left = deadline - monotonic()
            if left <= 0:
                return
            timeout = min(left, LOOK_EVERY)
            if pending is not None:
                timeout = min(timeout, max(pending - clock(), 0.0) + AFTER_DUE)
            if backoff is not None:
                timeout = min(timeout, backoff.next())
            woke = yield timeout
            state = yield LOOK
            confirms = iter(CONFIRM if woke and sees_files else ())
            while not _worth_a_claim(seen, state, pending, clock()):
                delay = next(confirms, None)
                if delay is None:
                    break
                yield delay
                state = yield LOOK
            else:
                break
        if backoff is not None:
            backoff.reset()
        assert isinstance(state, WaitState)
        seen = state


def _worth_a_claim(seen: object, state: object, pending: float | None, now: float) -> bool:
    assert isinstance(seen, WaitState)
    assert isinstance(state, WaitState)
    changed = state.version != seen.version or state.commits != seen.commits
    return changed or (pending is not None and pending < now)
