"""A single-process application that starts the agent itself and forks, for the tests of
records that no ring takes (tests/test_no_ring_counts.py).

    python tests/e2e_apps/exit_app.py helpers|late|owner-late

``helpers``: forks a *worker* before it reports anything itself (a process of its own, which
reports: not a helper), waits until that worker reported, reports, then forks a *helper*
(forked by a process that reports) that logs two WARNING lines, which must be dropped and
counted, and exits. Prints ``READY <worker pid>`` and waits for SIGTERM, which ends the
worker too; both leave through the normal interpreter exit (atexit).

``late``: an application atexit handler that runs after the agent's goodbye (registered
before the agent started: atexit runs the last registered first; in thread mode the agent
moves its own hook last anyway) logs a WARNING line in a worker. The parent (the
application's owner, which reports nothing itself) forks the worker, waits for it to exit
and prints ``RESULT <json>``: the slot claims of the shared arena, its counts of records no
ring took, and the private arenas (thread mode) the worker left behind.

``owner-late``: the same handler in the application's owner itself, which reports (a
single-process application) and logs twice after its goodbye, then exits. In thread mode the
owner removed the name registry at its goodbye: nothing can count those records any more,
and the agent says how many it dropped at the very end of the exit.

The agent's settings come from the environment (``tests.servers.agent_env``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
from typing import Any

import swmp
from ipc.private import private_directory
from swmp import agent

log = logging.getLogger("exit_app")
HELPER_LINES = 2


def _exit_on_term() -> None:
    def leave(*_: Any) -> None:
        sys.exit(0)  # SystemExit: the interpreter exits normally and runs atexit

    signal.signal(signal.SIGTERM, leave)


def _wait_for_term() -> None:
    while True:
        signal.pause()


def helpers() -> None:
    swmp.start()
    _exit_on_term()
    ready_r, ready_w = os.pipe()
    worker = os.fork()
    if worker == 0:
        os.close(ready_r)
        log.warning("the worker reports")
        os.write(ready_w, b"1")
        _wait_for_term()
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    try:
        log.warning("the parent reports")
        helper = os.fork()
        if helper == 0:
            for i in range(HELPER_LINES):
                log.warning("a helper's line %d", i)
            os._exit(0)
        _, status = os.waitpid(helper, 0)
        assert status == 0, status
        print(f"READY {worker}", flush=True)
        _wait_for_term()
    finally:
        os.kill(worker, signal.SIGTERM)
        os.waitpid(worker, 0)


def late() -> None:
    parent = os.getpid()

    def after_goodbye() -> None:
        if os.getpid() != parent:
            log.warning("the worker logs after the agent's goodbye")

    atexit.register(after_goodbye)
    swmp.start()
    worker = os.fork()
    if worker == 0:
        log.warning("the worker reports")
        sys.exit(0)
    _, status = os.waitpid(worker, 0)
    run = agent.current()
    assert run is not None and run.arena is not None
    arena = run.arena  # process mode: the drained arena; thread mode: the name registry
    lost = arena.lost_counts()
    left = sorted(os.listdir(private_directory(os.environ["SW_AGENT_ARENA_DIR"])))
    result = {
        "status": status,
        "claims": sum(arena.slot_identity(s)[1] for s in range(arena.slots)),
        "late": getattr(lost, "late_records", None),
        "no_slot": lost.no_slot_records,
        "private": [name for name in left if f"-{worker}-t" in name],
    }
    print("RESULT " + json.dumps(result), flush=True)


OWNER_LATE_LINES = 2


def owner_late() -> None:
    def after_goodbye() -> None:
        for i in range(OWNER_LATE_LINES):
            log.warning("the owner logs after the agent's goodbye (%d)", i)

    atexit.register(after_goodbye)
    swmp.start()
    log.warning("the owner reports")
    print(f"READY {os.getpid()}", flush=True)


if __name__ == "__main__":
    {"helpers": helpers, "late": late, "owner-late": owner_late}[sys.argv[1]]()
