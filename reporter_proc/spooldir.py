"""Where the spool lives, and whether that place is safe to use.

The spool is on by default, so its directory must be private without anyone setting it up:
``$XDG_STATE_HOME/swmp/spool`` (``~/.local/state/swmp/spool`` when unset), or
``/var/tmp/swmp-<uid>/spool`` when the home directory cannot be used (service users often
have none). Each service gets its own sub-directory. ``/var/tmp`` is shared: if another user
took the name ``swmp-<uid>`` first (a directory or link of theirs), the spool goes to this
user's randomly named private directory there (``swmp-<uid>.<random>``, as for the arenas),
instead of being turned off by whoever got there first.

"Safe" means another local user can neither read the spooled telemetry nor make this
process write or replay files of their choosing:

* every ancestor of the directory is owned by root or by us, and is not writable by group
  or others unless it has the sticky bit (``/tmp``, ``/var/tmp``); every symbolic link on
  the way to it is root's or ours (another user's says where the spool goes);
* the directory itself is a real directory (not a symlink), owned by us, and not writable
  by anyone else; it is created ``0700``.

An unsafe place is refused (:class:`SpoolUnsafe`): the spool stays off rather than unsafe.
"""

from __future__ import annotations

import os
import stat

from ipc import private


class SpoolUnsafe(Exception):
    """The spool directory (or an ancestor) could be tampered with by another user."""


AUTO = "auto"
OFF_VALUES = frozenset({"", "off", "none", "false", "0"})


SHARED_TMP = "/var/tmp"  # kept across reboots, unlike /tmp: spooled data must outlive one


def default_base(uid: int | None = None, shared_tmp: str | None = None) -> str:
    """The per-user base directory the spool uses when ``SW_AGENT_SPOOL_DIR`` is ``auto``
    (by name; :func:`auto_base` is the one to write to)."""
    uid = os.geteuid() if uid is None else uid
    state = os.environ.get("XDG_STATE_HOME", "")
    if state and os.path.isabs(state):
        return os.path.join(state, "swmp", "spool")
    home = os.path.expanduser("~")
    if home and home != "~" and os.path.isabs(home) and _usable_home(home, uid):
        return os.path.join(home, ".local", "state", "swmp", "spool")
    return os.path.join(shared_tmp or SHARED_TMP, f"swmp-{uid}", "spool")


def auto_base(shared_tmp: str | None = None) -> str:
    """:func:`default_base` for this process, with the shared directory's entry made or
    chosen as the arenas' is: ``swmp-<uid>`` if it is a private directory of ours, else our
    randomly named one (the same for every process of the user, so a restarted reporter
    finds what an earlier one spooled). Raises OSError (:class:`private.UnsafePathError`
    included) when no private directory can be had there."""
    shared_tmp = shared_tmp or SHARED_TMP
    base = default_base(shared_tmp=shared_tmp)
    if os.path.dirname(os.path.dirname(base)) != shared_tmp:
        return base
    return os.path.join(private.private_directory(shared_tmp), "spool")


def _usable_home(home: str, uid: int) -> bool:
    try:
        st = os.stat(home)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and os.access(home, os.W_OK)


def check_ancestors(path: str, uid: int) -> None:
    """Raise :class:`SpoolUnsafe` when an existing ancestor of ``path`` is not trustworthy."""
    problem = private.ancestor_problem(path, uid)
    if problem is not None:
        raise SpoolUnsafe(problem)


def make_private_dir(path: str) -> str:
    """Create (0700) or check ``path`` and every missing parent; returns its real path."""
    uid = os.geteuid()
    path = os.path.abspath(path)
    check_ancestors(path, uid)
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass  # created in between: checked below like any existing one
        check_dir(d, uid)
    check_dir(path, uid)
    return os.path.realpath(path)


def check_dir(path: str, uid: int) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise SpoolUnsafe(f"{path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise SpoolUnsafe(f"{path} is not a directory")
    if st.st_uid != uid:
        raise SpoolUnsafe(f"{path} is owned by uid {st.st_uid}, not by this process (uid {uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SpoolUnsafe(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})")


def own_private_file(st: os.stat_result, uid: int) -> bool:
    """Is this (lstat) a regular file of ours that nobody else can read or write?"""
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077
