"""Celery worker processes: pool children report from their start and leave cleanly.

Celery's prefork pool (billiard) forks its children with ``os.fork``, so the agent's at-fork
hook and the per-record pid check already give every child its own ring; what they cannot
know is which forks are pool children (a task may fork too, and such a fork must stay inert
until it writes). Celery says so itself, in the child, with two signals:

* ``worker_process_init``: this is a pool child: take the ring slot and instance name now
  (``<base>-w<slot>``), not on the first finished task, so the instance is announced as soon
  as the child exists;
* ``worker_process_shutdown``: the child is about to leave (``--max-tasks-per-child``,
  ``--max-memory-per-child``, warm shutdown, pool shrink). billiard ends children with
  ``os._exit``, which skips ``atexit``: without this the slot would still be freed by the
  kernel, but there would be no goodbye record, and in thread mode the child's reporter
  thread would die with records still in its ring.

``celery worker -B`` runs beat in another child of the worker's main process (a billiard
``Process``, not a pool child), which says so with ``beat_embedded_init``: it takes its ring
slot and name then, like a pool child, and leaves in billiard's exit finalizers (that process
too ends with ``os._exit``; SIGTERM from the worker's shutdown raises ``SystemExit`` in it,
which ends its service loop and runs them).

Connected when ``celery`` is imported (or at once if it already is); independent of the
Celery instrumentation, so ``SW_AGENT_DISABLE_PLUGINS=celery`` keeps the worker's processes
named and flushed. The solo, threads, gevent and eventlet pools run tasks in the worker's
main process: nothing to do there, it reports like any single-process application.
"""

from __future__ import annotations

import logging
from typing import Any

from swmp import lifecycle

log = logging.getLogger("swmp.agent")

_UID = "swmp-worker-process"


def on_process_init(**_: Any) -> None:
    from swmp import agent  # noqa: PLC0415 (agent imports this module)

    run = agent.current()
    if run is None:
        return
    try:
        # Forked by the worker's main process, which may report itself: without this the
        # child would be taken for a helper of it (swmp.lifecycle) and stay inert.
        lifecycle.declare_server_worker()
        run.sink.rebind()
    except Exception:
        log.debug("swmp: celery pool child could not take its ring", exc_info=True)


def on_beat_embedded_init(**_: Any) -> None:
    from swmp import agent  # noqa: PLC0415

    if agent.current() is None:
        return
    on_process_init()
    try:
        from multiprocessing.util import Finalize  # noqa: PLC0415 (billiard's exit runs these)

        Finalize(None, on_process_shutdown, exitpriority=0)
    except Exception:
        log.debug("swmp: celery beat process cannot leave cleanly", exc_info=True)


def on_process_shutdown(**_: Any) -> None:
    from swmp import agent  # noqa: PLC0415

    if agent.current() is None:
        return
    try:
        agent._at_exit()  # what atexit would have run: last meter report, goodbye, free the slot
    except Exception:
        log.debug("swmp: celery pool child could not leave cleanly", exc_info=True)


def connect() -> None:
    """Connect the receivers (idempotent: Celery keys them by ``dispatch_uid``)."""
    from celery import signals  # noqa: PLC0415

    signals.worker_process_init.connect(on_process_init, weak=False, dispatch_uid=_UID + "-init")
    signals.worker_process_shutdown.connect(on_process_shutdown, weak=False, dispatch_uid=_UID + "-shutdown")
    signals.beat_embedded_init.connect(on_beat_embedded_init, weak=False, dispatch_uid=_UID + "-beat")
