"""Profiling through the OAP's profile tasks, in every worker of a prefork server.

The reporter polls the tasks and posts them on the arena's board
(``reporter_proc.profile_tasks``); in each worker, :mod:`swmp.profiling.gate` checks every
new segment against them and :mod:`swmp.profiling.sampler` dumps the matching requests'
stacks as ``PROFILE_SNAPSHOT`` records into the worker's ring. docs/profiling.md says
what is sampled and what it costs.

:func:`install` wires it to the process's life (``swmp.lifecycle``): the board of the
arena this process reports through is attached when the sink binds a worker, dropped on
fork (the child binds its own) and when the process leaves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from swmp import _sink, lifecycle
from swmp.profiling.gate import gate
from swmp.profiling.sampler import stats

if TYPE_CHECKING:
    from swmp.config import Config

log = logging.getLogger("swmp.profiling")

__all__ = ["gate", "install", "stats", "uninstall"]


def _attach_board(role: str) -> None:
    if role != lifecycle.WORKER:
        gate.attach(None)
        return
    report_arena = getattr(_sink.get_sink(), "report_arena", None)
    arena = report_arena() if report_arena is not None else None
    gate.attach(arena.board if arena is not None else None)


def _detach() -> None:
    gate.attach(None)


def install(config: Config) -> None:
    """Profile in this process and the workers it forks (SW_AGENT_PROFILE_ACTIVE)."""
    if not config.agent_profile_active or config.agent_protocol in ("http", "kafka"):
        return  # the reporter says once why (it alone knows the sender)
    gate.configure(
        max_parallel=config.agent_profile_max_parallel,
        depth=config.agent_profile_dump_max_stack_depth,
        duration_min=config.agent_profile_duration,
    )
    lifecycle.on_fork(gate.reset_after_fork)
    lifecycle.on_bound(_attach_board)
    lifecycle.on_leave(_detach)
    if lifecycle.role():  # already bound here (a single-process application)
        _attach_board(lifecycle.role())


def uninstall() -> None:
    lifecycle.unsubscribe(gate.reset_after_fork)
    lifecycle.unsubscribe(_attach_board)
    lifecycle.unsubscribe(_detach)
    gate.attach(None)
