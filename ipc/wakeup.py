"""Waking a sleeping reader from writers in other processes.

A named FIFO beside the arena file is the doorbell: unrelated processes (uWSGI lazy-apps
workers, a restarted reporter) can all open it by path, which an inherited eventfd would
not allow. Writers ring it only while the reader has said it is asleep, so a busy reader
costs writers nothing; a lost ring (the store/load race between "tail published" and
"reader going to sleep" is not fenced in pure Python) costs only the reader's bounded poll
interval, never data.

The FIFO is created (0600) in the user's private directory next to the arena and opened
without following links; whoever opens it checks that it is a FIFO of ours closed to group
and others, so a regular file, a link or someone else's FIFO at that name is refused (the
writer then does not ring, the reader falls back to polling) instead of used.
"""

from __future__ import annotations

import errno
import os
import select
import time

from ipc.private import UnsafePathError, open_checked


def fifo_path(arena_path: str) -> str:
    return arena_path + ".wake"


def create_fifo(arena_path: str) -> None:
    """Create the doorbell if missing. What is already there is checked when it is opened.

    The umask can only take bits away from 0600: never a chmod by path, which would follow
    a link planted between the two calls.
    """
    try:
        os.mkfifo(fifo_path(arena_path), 0o600)
    except FileExistsError:
        pass


def open_fifo(path: str, flags: int) -> int:
    """Open the doorbell at ``path`` non-blocking; UnsafePathError if it is not a FIFO of ours, 0600."""
    return open_checked(path, flags | os.O_NONBLOCK, "fifo")


class Doorbell:
    """Writer side. Opens the FIFO lazily and never blocks; failures are silent by design."""

    RETRY_OPEN_S = 1.0

    def __init__(self, arena_path: str) -> None:
        self._path = fifo_path(arena_path)
        self._fd = -1
        self._key = (0, 0)  # (st_dev, st_ino) of the FIFO we opened
        self._pid = 0
        self._next_open = 0.0
        self.rings = 0
        self.refused = 0  # opens refused because the doorbell is not a FIFO of ours

    def __call__(self) -> None:
        try:
            self._ring()
        except Exception:  # runs in the application after a write: never raise there
            pass

    def _ring(self) -> None:
        pid = os.getpid()
        if self._pid != pid:  # inherited across fork: open our own
            self.close()
            self._pid = pid
        if self._fd >= 0 and not self._still_ours():
            # The application closed it (a daemon closes every descriptor it did not open)
            # and the number may name one of its files or sockets now: a wake-up byte written
            # there corrupted it. Forgotten, never closed (it is theirs); opened again below.
            self._fd = -1
        if self._fd < 0:
            now = time.monotonic()
            if now < self._next_open:
                return
            try:
                # O_RDWR, not O_WRONLY: this descriptor is itself a reader of the FIFO, so a
                # write never finds the FIFO without one. With O_WRONLY, a reporter that dies
                # leaves writers with EPIPE *and SIGPIPE*, which kills a worker whose server
                # set SIGPIPE to SIG_DFL. Without a reporter the FIFO fills up (64 KiB of
                # pending wake-ups) and further rings are EAGAIN, which is ignored below;
                # the next reporter drains what is pending as one wake-up. (Linux defines
                # O_RDWR on a FIFO: it opens at once, reader or not.)
                self._fd = open_fifo(self._path, os.O_RDWR)
                st = os.fstat(self._fd)
                self._key = (st.st_dev, st.st_ino)
            except UnsafePathError:
                self.refused += 1
                self._next_open = now + self.RETRY_OPEN_S
                return
            except OSError:  # ENOENT: no arena
                self._next_open = now + self.RETRY_OPEN_S
                return
        try:
            os.write(self._fd, b"\x01")
            self.rings += 1
        except BlockingIOError:
            pass  # the FIFO is full: the reader has plenty of wake-ups pending
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # the reader went away; reopen later
                self.close()
                self._next_open = time.monotonic() + self.RETRY_OPEN_S

    def _still_ours(self) -> bool:
        """Does our descriptor still name the FIFO we opened (one ``fstat``: wake-ups are rare)?"""
        try:
            st = os.fstat(self._fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._key

    def close(self) -> None:
        # The process may have closed it already (billiard's close_open_fds in a child, a
        # daemon in this very process) and the number name another file now: never close that.
        if self._fd >= 0 and not self._still_ours():
            self._fd = -1
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            os.close(fd)
        except OSError:
            pass


class DoorbellListener:
    """Reader side: a descriptor to wait on (``select``, ``loop.add_reader``) and drain."""

    def __init__(self, arena_path: str) -> None:
        """Raises ``UnsafePathError`` if the doorbell is not a FIFO of ours (see above)."""
        create_fifo(arena_path)
        # O_RDWR keeps a writer end open ourselves, so the FIFO never reports EOF in a loop.
        self._fd = open_fifo(fifo_path(arena_path), os.O_RDWR)

    def fileno(self) -> int:
        return self._fd

    def wait(self, timeout_s: float) -> bool:
        """Block until a writer rings or ``timeout_s`` passes; True if rung. Drains the FIFO."""
        try:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        except (OSError, ValueError):
            return False
        if ready:
            self.drain()
            return True
        return False

    def drain(self) -> int:
        total = 0
        while True:
            try:
                chunk = os.read(self._fd, 4096)
            except BlockingIOError:
                return total
            except OSError:
                return total
            if not chunk:
                return total
            total += len(chunk)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
