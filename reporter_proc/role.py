"""Which part of the reporter machinery this process is, if any.

Two flags, in a module with no imports so the application side can ask cheaply
(``swmp.lifecycle``) without loading the reporter: "the reporter is being forked right
now" (the application's at-fork hooks then run in a child that is no worker) and "this
process is the reporter or its supervisor" (the agent must not trace here).
"""

from __future__ import annotations

_forking = False
_in_reporter = False


def forking_reporter() -> bool:
    """True while ``spawn_reporter`` forks: the application's at-fork hooks run in the new
    child before it gets control, and should not treat it as a worker (claim a ring slot...)."""
    return _forking


def in_reporter_process() -> bool:
    """True in the supervisor and reporter processes (the agent must not trace there)."""
    return _in_reporter


def set_forking(value: bool) -> None:
    global _forking
    _forking = value


def mark_reporter_process() -> None:
    global _in_reporter
    _in_reporter = True
