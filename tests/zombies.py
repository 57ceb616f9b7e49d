"""Reaping the orphans that pytest adopts.

``tests.test_reporter_helpers.Owner`` makes the pytest process a child subreaper
(``PR_SET_CHILD_SUBREAPER``), so that a killed owner's supervisor and reporter are re-parented
to pytest, which its cleanup then reaps. The setting lasts for the rest of the session: from
then on every orphaned descendant (a Gunicorn worker whose master was killed, a reporter
outliving its supervisor, a replacement supervisor...) becomes a child of pytest, a zombie
once it exits until pytest waits for it.

``tests/conftest.py`` calls :func:`reap_adopted` after each test's teardown, and fails the
session if adopted zombies are left at its end that cannot be reaped. It reaps only zombies
that no live ``subprocess.Popen`` (or ``multiprocessing`` process) owns: one of those is its
owner's to ``wait()`` for, and reaping it would give the owner a made-up exit status. Between
two tests, a zombie forked by ``os.fork()`` directly is taken for an orphan: the test that
forked it is over (no module- or session-scoped fixture forks without ``subprocess`` or
``multiprocessing``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import subprocess
import sys

_owned_before: frozenset[int] = frozenset()  # zombies found owned by the last pass


def zombie_children() -> list[int]:
    """The pids of this process's children that have exited and not been waited for."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] == b"Z" and int(fields[1]) == me:
            found.append(int(name))
    return found


def owned_pids() -> set[int]:
    """Pids of the children a live ``Popen`` object has not waited for yet (found by the
    garbage collector's list of objects: also the ones no test holds any more)."""
    kinds: list[type] = [subprocess.Popen]
    popen_fork = sys.modules.get("multiprocessing.popen_fork")
    if popen_fork is not None:
        kinds.append(popen_fork.Popen)
    classes = tuple(kinds)
    owned: set[int] = set()
    for o in gc.get_objects():
        # type(), not isinstance(): isinstance reads ``__class__``, which a lazy proxy
        # (Django's settings, werkzeug's LocalProxy) forwards to an object it may fail to make.
        if issubclass(type(o), classes) and getattr(o, "returncode", 0) is None:
            pid = getattr(o, "pid", None)
            if isinstance(pid, int):
                owned.add(pid)
    return owned


def is_subreaper() -> bool:
    """Whether orphaned descendants are re-parented to this process (until then there is
    nothing to look for)."""
    flag = ctypes.c_int(0)
    with contextlib.suppress(OSError, AttributeError):
        # 37 = PR_GET_CHILD_SUBREAPER
        if ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(flag), 0, 0, 0) == 0:
            return flag.value != 0
    return True  # cannot tell: look


def adopted_zombies() -> list[int]:
    """The zombie children that no ``Popen`` object owns."""
    global _owned_before
    if not is_subreaper():
        return []
    zombies = zombie_children()
    if not zombies or set(zombies) <= _owned_before:  # nothing new: spare the object scan
        return []
    owned = owned_pids()
    _owned_before = frozenset(z for z in zombies if z in owned)
    return [z for z in zombies if z not in owned]


def reap_adopted() -> list[int]:
    """Wait for each adopted zombie (by pid, never ``-1``); the pids reaped."""
    reaped = []
    for pid in adopted_zombies():
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def unreaped_after(passes: int = 3) -> list[int]:
    """Reap until no adopted zombie is left (a process orphaned meanwhile can turn into one
    between two passes); the ones still there after ``passes`` passes: reaping them failed."""
    left = adopted_zombies()
    for _ in range(passes):
        if not left:
            break
        reap_adopted()
        left = adopted_zombies()
    return left
