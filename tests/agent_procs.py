"""The agent's own processes of an application (its reporter and the reporter's supervisor),
found through the application's arena, as ``swmp status`` finds them: never through the
process tree.

The agent starts the supervisor detached (double fork, own session: a program that reaps
every child until ECHILD would otherwise wait for it for good), so neither the supervisor
nor the reporter it forks descends from the application's master. The arena names both:
its reporter lock holds the reporter's pid (``Arena.reporter_pid``), and the status
document the reporter publishes names its supervisor (``{"supervisor": {"pid",
"start_ticks", "replaced"}}``, what ``swmp health`` checks). Tests and benchmarks that count
the application's processes (CPU, memory, a secret in a command line, a reporter to kill)
take them from here, so that the reporter's cost is never silently left out.

    arena = owner_arena(server.pid, arena_dir)
    pids = wait_agent_pids(arena, 30)          # AgentPids(reporter=..., supervisor=...)
    procs = application_processes(server.pid, arena)  # master, workers, supervisor, reporter
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass

import psutil

import ipc

__all__ = [
    "AgentPids",
    "agent_pids",
    "agent_processes",
    "application_processes",
    "owner_arena",
    "wait_agent_pids",
]


@dataclass(frozen=True)
class AgentPids:
    reporter: int | None  # the process holding the arena's reporter lock
    supervisor: int | None  # the live supervisor the reporter's status document names

    def pids(self) -> list[int]:
        return [pid for pid in (self.reporter, self.supervisor) if pid]


def owner_arena(owner_pid: int, arena_dir: str | os.PathLike[str]) -> str:
    """The arena of the application whose master (the agent's owner) is ``owner_pid``.

    Its name carries the owner's start time: call this while the owner is alive."""
    return ipc.arena_path(owner_pid, str(arena_dir))


def _supervisor(document: bytes) -> int | None:
    try:
        sup = json.loads(document).get("supervisor") if document else None
    except (ValueError, AttributeError):
        return None
    if not isinstance(sup, dict):
        return None
    pid, ticks = sup.get("pid"), sup.get("start_ticks")
    if not isinstance(pid, int) or pid <= 0:
        return None
    # A supervisor that is gone (its pid maybe reused) is no process of the application.
    return pid if ipc.process_alive(pid, ticks if isinstance(ticks, int) else 0) else None


def agent_pids(arena_path: str | os.PathLike[str]) -> AgentPids:
    """The reporter and supervisor the arena names now (``None`` for either not known yet:
    no reporter holds the lock, or it has not published its first status document)."""
    try:
        with ipc.Arena.open(str(arena_path), wait_s=0) as arena:
            reporter = arena.reporter_pid()
            snap = arena.status.snapshot()
    except (OSError, ipc.ArenaError):
        return AgentPids(None, None)
    # The document is the reporter's only when the lock holder wrote it (not a predecessor's).
    document = snap.document if reporter is not None and snap.reporter_pid == reporter else b""
    return AgentPids(reporter, _supervisor(document))


def wait_agent_pids(
    arena_path: str | os.PathLike[str], timeout: float, *, supervised: bool = True
) -> AgentPids:
    """Wait until the arena names a reporter (and, with ``supervised``, its supervisor)."""
    deadline = time.monotonic() + timeout
    while True:
        found = agent_pids(arena_path)
        if found.reporter and (found.supervisor or not supervised):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for the reporter in {arena_path}: {found}"
            )
        time.sleep(0.05)


def agent_processes(arena_path: str | os.PathLike[str]) -> list[psutil.Process]:
    """The live reporter and supervisor of the arena at ``arena_path`` (either may be missing)."""
    out = []
    for pid in agent_pids(arena_path).pids():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def application_processes(owner_pid: int, arena_path: str | os.PathLike[str]) -> list[psutil.Process]:
    """Every live process of the application: the owner (master) and its tree (workers, their
    children) and, through the arena, the reporter and its supervisor. The cost of the
    agent is the CPU and memory of all of these together."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(owner_pid)
        found = {p.pid: p for p in [root, *root.children(recursive=True)]}
    for p in agent_processes(arena_path):
        found.setdefault(p.pid, p)  # thread mode: the reporter is a process of the tree
    out = []
    for p in found.values():
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out
