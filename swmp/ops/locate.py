"""Finding the agents the CLI should look at.

Arenas are the agents' discovery mechanism: one file per application in the user's private
directory inside the arena directory (``<dir>/swmp-<uid>/``, see ``ipc.private``), named
``swmp-<uid>-<owner pid>-<start ticks>.arena`` and readable only by that uid. The CLI
narrows them down by service, by pid (the owner, the reporter or any worker) or by path.

Two rules shape this module:

* Another user's arena is refused *before* it is opened, with a message that says whose it
  is. Even root does not read it: the CLI never needs privileges, and a probe that quietly
  reads someone else's shared memory is not one anybody asked for.
* An arena left behind by a dead application (owner gone, no reporter, no worker) is not an
  agent: it is skipped during discovery, so a stale file cannot make a probe pass.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ipc import Arena, ArenaError, ArenaInfo, discover, private
from ipc.arena import DEFAULT_DIRECTORY, DEFAULT_PREFIX
from swmp.ops.mask import mask

ENV_DIRECTORY = "SW_AGENT_ARENA_DIR"
# In thread mode the application's shared arena only names the processes (its slot locks);
# each process reports from an arena of its own, on a thread. No reporter ever holds the
# shared one, so it is not an agent to look at: discovery leaves it out by this name. Its
# header counts what no process's ring took (helpers, the master...): each process's arena
# names it in its meta (``registry``), and one of them shows those counts (``Target.registry``).
REGISTRY_SUFFIX = "-names.arena"


def registry_path(arena_path: str) -> str:
    """The thread-mode name registry that stands where the application's arena would."""
    return arena_path.removesuffix(".arena") + REGISTRY_SUFFIX


# swmp-<uid>-<owner pid>.arena, or swmp-<uid>-<pid>-<tag>.arena for a thread-mode agent
_NAME = re.compile(rf"^{DEFAULT_PREFIX}-(\d+)-.*\.arena$")


class Refused(Exception):
    """The arena belongs to another user: the CLI will not read it."""


def arena_directory(option: str | None = None) -> str:
    """``--dir`` wins over ``SW_AGENT_ARENA_DIR``, which wins over ``/dev/shm``."""
    return option or os.environ.get(ENV_DIRECTORY) or DEFAULT_DIRECTORY


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def refuse_foreign(path: str) -> None:
    """Raise :class:`Refused` unless ``path`` belongs to the user running the CLI."""
    st = os.stat(path)
    me = os.getuid()
    if st.st_uid != me:
        raise Refused(
            f"refusing to read {path}: it belongs to user {user_name(st.st_uid)} (uid {st.st_uid}), "
            f"and swmp runs as {user_name(me)} (uid {me}); run swmp as that user"
        )


def parse_meta(raw: bytes) -> dict[str, Any]:
    """The agent's JSON header meta, masked; ``{}`` when absent or unreadable."""
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return mask(value) if isinstance(value, dict) else {}


@dataclass
class Target:
    """One open arena the CLI reports on. Close it (or use :func:`close_all`) when done."""

    path: str
    arena: Arena
    info: ArenaInfo
    meta: dict[str, Any]
    # Thread mode: the application's name registry, whose header counts are the application's
    # (not this process's); set on one process's target per application (see select).
    registry: Arena | None = None

    @property
    def service(self) -> str | None:
        value = self.meta.get("service")
        return value if isinstance(value, str) else None

    def pids(self) -> set[int]:
        """Every pid that identifies this agent: owner, reporter, workers."""
        out = {self.info.owner_pid}
        reporter = self.arena.reporter_pid()
        if reporter:
            out.add(reporter)
        snap = self.arena.status.snapshot()
        if snap.reporter_pid:
            out.add(int(snap.reporter_pid))
        out.update(self.arena.live_slots().values())
        meta_pid = self.meta.get("pid")
        if isinstance(meta_pid, int):
            out.add(meta_pid)
        return out

    def is_stale(self) -> bool:
        """Owner dead, no reporter, no worker: a file left behind, not a running agent."""
        if self.info.owner_alive or self.arena.reporter_pid() is not None:
            return False
        return not self.arena.live_slots()

    def close(self) -> None:
        self.arena.close()
        if self.registry is not None:
            self.registry.close()
            self.registry = None


@dataclass
class Selection:
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # arenas skipped and why
    error: str = ""  # set when nothing was selected: why


def open_target(path: str) -> Target:
    """Open one arena for reading; raises Refused, FileNotFoundError or ArenaError."""
    refuse_foreign(path)
    try:
        arena = Arena.open(path, wait_s=0.5)
    except PermissionError as exc:
        raise Refused(f"refusing to read {path}: {exc.strerror}") from exc
    except ArenaError as exc:
        if "belongs to uid" in str(exc):  # the file changed hands after our check
            raise Refused(f"refusing to read {path}: {exc}") from exc
        raise
    info = arena.info()
    meta = parse_meta(info.meta)
    return Target(path=path, arena=arena, info=info, meta=meta, registry=_open_registry(path, meta))


def _open_registry(path: str, meta: dict[str, Any]) -> Arena | None:
    """The thread-mode name registry that ``meta`` names, beside ``path``; None if none.

    Only a bare file name of the registry's form is taken, in the same directory: the meta
    cannot point the CLI anywhere else. Counts that cannot be read are no reason to skip the
    process's own figures.
    """
    name = meta.get("registry")
    if meta.get("mode") != "thread" or not isinstance(name, str):
        return None
    if os.path.basename(name) != name or not name.endswith(REGISTRY_SUFFIX) or not _NAME.match(name):
        return None
    registry = os.path.join(os.path.dirname(path), name)
    try:
        refuse_foreign(registry)
        return Arena.open(registry, wait_s=0)
    except (Refused, ArenaError, OSError):
        return None


def _one_registry_each(targets: list[Target]) -> None:
    """Keep each registry on one target (the application's oldest arena) so that the
    application's counts are shown, and added up, once."""
    keeper: dict[str, Target] = {}
    for t in sorted(targets, key=lambda t: (t.info.created_ns, t.path)):
        if t.registry is None:
            continue
        key = t.registry.path
        if key in keeper:
            t.registry.close()
            t.registry = None
        else:
            keeper[key] = t


def close_all(targets: Iterable[Target]) -> None:
    for t in targets:
        t.close()


def _foreign_arenas(directory: str) -> dict[int, int]:
    """``{uid: arenas}`` of other users' arena files in ``directory`` (named, not opened)."""
    me = os.getuid()
    out: dict[int, int] = {}
    # Arenas live in per-user private directories (ipc.private), unreadable by other users
    # (root excepted): one we cannot list counts once. Files at the top are older versions'.
    top = glob.escape(directory)
    for d in glob.glob(os.path.join(top, f"{DEFAULT_PREFIX}-*")):
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid != me and not os.access(d, os.R_OK | os.X_OK):
            out[st.st_uid] = out.get(st.st_uid, 0) + 1
    paths = glob.glob(os.path.join(top, f"{DEFAULT_PREFIX}-*-*.arena"))
    paths += glob.glob(os.path.join(top, f"{DEFAULT_PREFIX}-*", f"{DEFAULT_PREFIX}-*-*.arena"))
    for path in paths:
        m = _NAME.match(os.path.basename(path))
        try:
            uid = os.stat(path).st_uid
        except OSError:
            continue
        # A file named for us but owned by someone else is already refused (and noted) by
        # discovery itself; count only the ones discovery never looks at.
        if uid != me and (m is None or int(m.group(1)) != me):
            out[uid] = out.get(uid, 0) + 1
    return out


def select(
    directory: str,
    arena_path: str | None = None,
    service: str | None = None,
    pid: int | None = None,
) -> Selection:
    """Open the arenas matching the filters. Never raises for a bad or foreign file."""
    sel = Selection()
    if arena_path:
        try:
            sel.targets.append(open_target(arena_path))
        except Refused as exc:
            sel.error = str(exc)
        except FileNotFoundError:
            sel.error = f"no arena at {arena_path}"
        except (ArenaError, OSError) as exc:
            sel.error = f"cannot read {arena_path}: {exc}"
        return _filter(sel, service, pid, f"arena {arena_path}")

    if not os.path.isdir(directory):
        # (a file there is not "missing": the user would look for it and find it)
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        sel.error = f"no agent found: arena directory {directory} {what}"
        return sel
    refused = private.refused_directory(directory)
    if refused:
        sel.notes.append(f"{refused}: the agents use a private directory with a random name beside it")
    stale = 0
    for path in discover(directory):
        if path.endswith(REGISTRY_SUFFIX):
            continue
        try:
            target = open_target(path)
        except Refused as exc:
            sel.notes.append(str(exc))
            continue
        except FileNotFoundError:
            continue  # removed while we looked: the application just stopped
        except (ArenaError, OSError) as exc:
            sel.notes.append(f"skipped {path}: {exc}")
            continue
        if target.is_stale():
            stale += 1
            target.close()
            continue
        sel.targets.append(target)
    if stale:
        sel.notes.append(f"ignored {stale} stale arena(s) of applications that are gone")
    me = os.getuid()
    for uid, n in sorted(_foreign_arenas(directory).items()):
        sel.notes.append(
            f"{n} arena(s) in {directory} belong to user {user_name(uid)} (uid {uid}), "
            f"not to {user_name(me)} (uid {me}): run swmp as that user to see them"
        )
    if not sel.targets:
        sel.error = f"no agent found in {directory} for user {user_name(me)} (uid {me})"
        return sel
    return _filter(sel, service, pid, f"in {directory}")


def _filter(sel: Selection, service: str | None, pid: int | None, where: str) -> Selection:
    if not sel.targets or (service is None and pid is None):
        _one_registry_each(sel.targets)
        return sel
    kept: list[Target] = []
    for t in sel.targets:
        if (service is None or t.service == service) and (pid is None or pid in t.pids()):
            kept.append(t)
        else:
            t.close()
    if not kept:
        wanted = " and ".join(
            part
            for part in (
                f"service {service!r}" if service is not None else "",
                f"pid {pid}" if pid is not None else "",
            )
            if part
        )
        found = sorted({t.service or "?" for t in sel.targets})
        sel.error = f"no agent with {wanted} {where} (found: {', '.join(found)})"
    sel.targets = kept
    _one_registry_each(kept)
    return sel
