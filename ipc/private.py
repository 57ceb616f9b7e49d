"""The per-user private directory, and files in it that no other local user can plant.

The arena directory (``/dev/shm`` by default) is shared by every local user, and the arena
name is predictable from ``/proc`` (uid, owner pid, start time). Anything created there by
path could be pre-created by someone else: an arena of theirs (the agent refuses it and runs
disabled), a regular file or a FIFO at the doorbell, a symbolic link where we write. So every
file swmp creates lives in a directory only its user can enter, ``<base>/swmp-<uid>/``,
checked each time it is used: a real directory (not a link), owned by us, mode 0700.

If that name is taken (another user created it first, or it is group/other-accessible) it is
refused with a warning and a private directory with an unguessable name
(``swmp-<uid>.<random>``, made by ``mkdtemp``) is used instead; discovery looks in both. Files
are opened with ``O_NOFOLLOW`` (and created with ``O_EXCL``), and what was opened is checked
by its descriptor (type, owner, no group/other access), so even a file that got there some
other way is refused rather than trusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("ipc")

DIR_MODE = 0o700
FILE_MODE = 0o600

_warned: set[str] = set()
_warned_lock = threading.Lock()


class UnsafePathError(OSError):
    """A path is not what swmp created: wrong type or owner, other users can reach it, or a link."""


def private_directory(base: str, prefix: str = "swmp") -> str:
    """This user's private directory inside ``base``, created (0700) if missing.

    Raises :class:`UnsafePathError` if ``base`` itself lets other users replace entries
    (writable by others without the sticky bit), OSError if it cannot be created.
    """
    _check_base(base)
    canonical = os.path.join(base, f"{prefix}-{os.geteuid()}")
    try:
        os.mkdir(canonical, DIR_MODE)
    except FileExistsError:
        pass
    problem = directory_problem(canonical)
    if problem is None:
        return canonical
    _warn_once(
        canonical,
        "swmp: refusing the private directory %s (%s); using a private directory with a random name",
        canonical,
        problem,
    )
    # Serialized, so processes that get here at once (uWSGI lazy-apps workers) create one
    # directory and all pick it, not one each.
    with _directory_lock(base):
        existing = fallback_directories(base, prefix)
        if existing:
            return existing[0]
        return tempfile.mkdtemp(prefix=f"{prefix}-{os.geteuid()}.", dir=base)


def foreign_link(path: str, uid: int | None = None, max_links: int = 40) -> str | None:
    """What is wrong with resolving ``path``: a symbolic link on the way that is neither
    root's nor ours (or too many links), or None. Where links lead is not enough to check:
    one planted where the path passes through a shared directory picks any directory of
    ours, perhaps one a web server of ours serves, for our files."""
    me = os.geteuid() if uid is None else uid
    todo = [c for c in reversed(os.path.abspath(path).split(os.sep)) if c]
    current = os.sep
    while todo:
        name = todo.pop()
        if name in (".", ".."):
            current = os.path.dirname(current) if name == ".." else current
            continue
        step = os.path.join(current, name)
        try:
            st = os.lstat(step)
        except (FileNotFoundError, NotADirectoryError):
            return None  # the rest is created by us (or fails to be)
        if not stat.S_ISLNK(st.st_mode):
            current = step
            continue
        if st.st_uid not in (0, me):
            return f"{step} is a symbolic link of uid {st.st_uid}, not of root or uid {me}"
        max_links -= 1
        if max_links < 0:
            return f"{path}: too many symbolic links"
        target = os.readlink(step)
        todo.extend(c for c in reversed(target.split(os.sep)) if c)
        if os.path.isabs(target):
            current = os.sep
    return None


def ancestor_problem(path: str, uid: int | None = None) -> str | None:
    """What makes the existing directories above ``path`` untrustworthy for files of ours,
    or None: a symbolic link on the way that is neither root's nor ours
    (:func:`foreign_link`), a directory owned by another user, or one that others may write
    to without the sticky bit (``/tmp`` and ``/var/tmp`` have it): in such a directory
    another user can rename an entry on our path away and put theirs in its place."""
    me = os.geteuid() if uid is None else uid
    problem = foreign_link(path, me)
    if problem is not None:
        return problem
    parent = os.path.dirname(os.path.realpath(path))
    chain = []
    while True:
        chain.append(parent)
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    for p in reversed(chain):  # from "/" down
        try:
            st = os.stat(p)
        except FileNotFoundError:
            return None  # the rest is created by us, 0700
        if st.st_uid not in (0, me):
            return f"{p} is owned by uid {st.st_uid}, not by root or uid {me}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"{p} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)"
    return None


def make_directories(path: str) -> None:
    """Create ``path`` and its missing parents, each 0700 whatever the umask.

    ``os.makedirs(mode=...)`` gives the mode to the last directory only: the parents get
    0777 minus the umask, which under ``umask 000`` lets every user rename and replace them
    (``~/.local`` for one). ``mkdir``'s umask only takes bits away from 0700.
    """
    problem = foreign_link(path)
    if problem is not None:
        raise UnsafePathError(f"refusing {path}: {problem}")
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass  # made in between by another process: used as it is, like an existing one


def private_directories(base: str, prefix: str = "swmp") -> list[str]:
    """Every usable private directory of this user in ``base`` (for discovery and cleanup)."""
    canonical = os.path.join(base, f"{prefix}-{os.geteuid()}")
    found = [canonical] if directory_problem(canonical) is None else []
    return found + fallback_directories(base, prefix)


def refused_directory(base: str, prefix: str = "swmp") -> str | None:
    """Why this user's private directory in ``base`` exists but is not used (None if it is
    fine or absent): for tools that explain where the arenas went."""
    canonical = os.path.join(base, f"{prefix}-{os.geteuid()}")
    if not os.path.lexists(canonical):
        return None
    problem = directory_problem(canonical)
    return None if problem is None else f"{canonical} is refused ({problem})"


def fallback_directories(base: str, prefix: str = "swmp") -> list[str]:
    """The randomly named private directories of this user in ``base`` that pass the checks.

    Sorted by name: every process of the user picks the first.
    """
    pattern = os.path.join(glob.escape(base), f"{prefix}-{os.geteuid()}.*")
    return [p for p in sorted(glob.glob(pattern)) if directory_problem(p) is None]


def directory_problem(path: str) -> str | None:
    """Why ``path`` is not a private directory of ours, or None if it is one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be examined: {exc}"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    return _owner_problem(st)


def _owner_problem(st: os.stat_result) -> str | None:
    me = os.geteuid()
    if st.st_uid != me:
        return f"it belongs to uid {st.st_uid}, not to uid {me}"
    if st.st_mode & 0o077:
        return f"other users can reach it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check_base(base: str) -> None:
    problem = foreign_link(base)  # /dev/shm may be a link, but root's
    if problem is not None:
        raise UnsafePathError(f"refusing {base}: {problem}; choose another SW_AGENT_ARENA_DIR")
    st = os.stat(base)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"refusing {base}: it is not a directory")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        # Without the sticky bit anyone may rename our private directory away and put
        # their own in its place between our check and our use.
        raise UnsafePathError(
            f"refusing {base}: every user may write there and it lacks the sticky bit "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); choose another SW_AGENT_ARENA_DIR"
        )


def open_checked(path: str, flags: int, kind: str, mode: int = FILE_MODE) -> int:
    """``os.open`` that never follows a link, then checks what it opened.

    ``kind`` is ``"regular"`` or ``"fifo"``. The file must be of that type, ours, and
    closed to group and others; otherwise the descriptor is closed and
    :class:`UnsafePathError` raised. Other errors are raised as ``os.open`` raises them.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"refusing {path}: it is a symbolic link") from None
        raise
    try:
        check_descriptor(fd, path, kind)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_descriptor(fd: int, path: str, kind: str) -> None:
    """Raise :class:`UnsafePathError` unless ``fd`` is a ``kind`` file of ours, 0600 or tighter."""
    st = os.fstat(fd)
    is_kind = stat.S_ISFIFO(st.st_mode) if kind == "fifo" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        raise UnsafePathError(f"refusing {path}: it is not a {kind} file")
    problem = _owner_problem(st)
    if problem is not None:
        raise UnsafePathError(f"refusing {path}: {problem}")


def write_file(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, 0600, through an unguessable temporary.

    The temporary is created with ``O_EXCL | O_NOFOLLOW`` beside ``path`` and renamed over
    it: nothing planted at either name is ever written through.
    """
    for _ in range(3):
        tmp = f"{path}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return
    raise FileExistsError(errno.EEXIST, "no free temporary name", path)


def read_file(path: str) -> bytes:
    """The content of a regular file of ours at ``path`` (raises UnsafePathError otherwise)."""
    fd = open_checked(path, os.O_RDONLY | os.O_NONBLOCK, "regular")
    with os.fdopen(fd, "rb") as f:
        return f.read()


@contextlib.contextmanager
def _directory_lock(path: str, timeout_s: float = 2.0) -> Iterator[None]:
    """An exclusive ``flock`` on the directory ``path`` itself, for up to ``timeout_s``.

    Anyone who can read the directory can take the same lock, so a lock held for longer
    (someone else holding it on purpose) is waited for no more than ``timeout_s``; then we
    go on without it, which is only the race the lock avoids.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


def _warn_once(key: str, message: str, *args: object) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message, *args)
