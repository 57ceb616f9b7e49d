"""The reporter's event loop in an application's process (thread mode): its descriptors may be
closed under it.

A program that closes every descriptor it did not open (python-daemon's ``DaemonContext``
without detaching, ``os.closerange(3, ...)``) and then opens files of its own hands the numbers
of the loop's epoll and self-pipe sockets to those files. The loop's next wait then fails
(EBADF, or EINVAL on a regular file), and ``loop.close()`` used to close the numbers it
remembered: one of the program's files by then. So the loop is made with
:class:`GuardedSelector`, which checks before every wait and every registration that the
loop's self-pipe socket is still its own (one ``fstat``) and raises :class:`DescriptorsLost`
if not (``Reporter.run`` then skips its teardown, which would close its other stale numbers),
a stop from another thread writes its wake-up byte only into the loop's own socket, and
:func:`release` closes only what still names the loop's own objects: a socket that does not
is detached, an epoll that does not is parked (never closed, never polled). An epoll cannot
be recognized by ``fstat`` (every epoll shares one anonymous inode); it is ours when
``/proc/self/fdinfo`` lists our self-pipe socket among its targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import selectors
import socket
from typing import Any

_parked: list[object] = []  # what must never be closed nor collected (see _keep_forever)


def _keep_forever(obj: object) -> None:
    """Never free ``obj``, not even when the interpreter finalizes (it clears the modules, and
    freeing would close the epoll's number, or close the loop and run the reporter's
    teardown, whatever names those numbers by then)."""
    _parked.append(obj)
    with contextlib.suppress(Exception):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class DescriptorsLost(OSError):
    """The loop's descriptors were closed under it (by the application)."""


def _key(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class _Inert:
    """Stands in for an epoll whose number is not ours any more: nothing reaches that number."""

    def register(self, fd: int, eventmask: int = 0) -> None:
        raise DescriptorsLost(errno.EBADF, "the event loop's epoll descriptor was closed")

    modify = register

    def unregister(self, fd: int) -> None:
        pass

    def poll(self, timeout: float | None = None, maxevents: int = -1) -> list[tuple[int, int]]:
        raise DescriptorsLost(errno.EBADF, "the event loop's epoll descriptor was closed")

    def close(self) -> None:
        pass

    def fileno(self) -> int:
        return -1


class GuardedSelector(selectors.EpollSelector):
    """An epoll selector that never waits on a number that is not its own any more."""

    def __init__(self) -> None:
        super().__init__()
        self.owned: dict[int, tuple[int, int]] = {}  # the self-pipe: fd -> (st_dev, st_ino)
        self._canary = -1  # the self-pipe's reading end, registered in the epoll

    def watch(self, reading: socket.socket, writing: socket.socket) -> None:
        for sock in (reading, writing):
            key = _key(sock.fileno())
            if key is not None:
                self.owned[sock.fileno()] = key
        self._canary = reading.fileno()

    def names_own(self, fd: int) -> bool:
        return fd in self.owned and _key(fd) == self.owned[fd]

    def _check(self) -> None:
        if self._canary >= 0 and not self.names_own(self._canary):
            # closerange() closed everything: the self-pipe tells us first, and cheaply.
            self.abandon()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._check()
        return super().select(timeout)

    # A registration (add_reader) raises DescriptorsLost too, not EINVAL from the program's
    # file: the reporter then skips its teardown, which would close its other stale numbers.
    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self._check()
        return super().register(fileobj, events, data)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self._check()
        return super().modify(fileobj, events, data)

    def owns_epoll(self) -> bool:
        """Does our epoll's number still name our epoll (listing our self-pipe as a target)?"""
        fd = getattr(self, "_selector", _Inert()).fileno()
        if fd < 0 or not self.names_own(self._canary):
            return False
        try:
            with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return False
        ino = b"ino:%x" % self.owned[self._canary][1]
        for line in lines:  # "tfd:        4 events:       19 data: ...  pos:0 ino:3280a0 sdev:9"
            words = line.split()
            if words[:2] == [b"tfd:", b"%d" % self._canary] and ino in words:
                return True
        return False

    def abandon(self) -> None:
        """Never touch the epoll's number again; the object is kept, so it is never closed."""
        epoll = getattr(self, "_selector", None)
        if epoll is None or isinstance(epoll, _Inert):
            return
        _keep_forever(epoll)
        self._selector = _Inert()


class _GuardedLoop(asyncio.SelectorEventLoop):
    def _write_to_self(self) -> None:
        """The wake-up byte of ``call_soon_threadsafe`` (a stop from another thread): never
        into a number that is not the loop's own socket any more (one of the program's)."""
        selector, csock = getattr(self, "_selector", None), getattr(self, "_csock", None)
        if not isinstance(selector, GuardedSelector) or not isinstance(csock, socket.socket):
            pass
        elif not selector.names_own(csock.fileno()):  # -1 once detached: not ours either
            return
        super()._write_to_self()  # type: ignore[misc]


def new_loop() -> asyncio.AbstractEventLoop:
    """A plain selector loop on a :class:`GuardedSelector` (whatever policy the application set)."""
    selector = GuardedSelector()
    loop = _GuardedLoop(selector)
    reading, writing = getattr(loop, "_ssock", None), getattr(loop, "_csock", None)
    if isinstance(reading, socket.socket) and isinstance(writing, socket.socket):
        selector.watch(reading, writing)
    return loop


def release(loop: asyncio.AbstractEventLoop) -> bool:
    """Before ``loop.close()``: True when the loop's descriptors all still are its own (close
    it then). Otherwise never close it: the foreign numbers are let go of (sockets detached,
    the epoll parked), and the loop and its tasks are kept for good: collected, they would
    close the loop and run the reporter's teardown at some random moment, whose channel close
    would close numbers gRPC remembers."""
    selector: Any = getattr(loop, "_selector", None)
    if not isinstance(selector, GuardedSelector):
        return True
    socks: list[socket.socket] = []
    for name in ("_ssock", "_csock"):
        sock = getattr(loop, name, None)
        if isinstance(sock, socket.socket) and sock.fileno() >= 0:
            socks.append(sock)
    if selector.owns_epoll() and all(selector.names_own(s.fileno()) for s in socks):
        return True
    selector.abandon()
    for sock in socks:
        if not selector.names_own(sock.fileno()):
            sock.detach()
    _keep_forever((loop, asyncio.all_tasks(loop)))
    return False
