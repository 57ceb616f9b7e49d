"""How a Celery task run ends without finishing, and so which span records it.

A pool stops a run it terminates (``revoke(terminate=True)``) or times out (a hard time
limit) by raising into it: ``SystemExit`` in a prefork child (billiard turns SIGTERM, SIGHUP,
SIGQUIT and SIGUSR1 into it), ``GreenletExit`` in a gevent or eventlet pool (its
``terminate_job`` kills the run's greenlet, whatever the signal asked for), gevent's
``Timeout`` (its pool's hard time limit). The run's own span then ends with that exception and
is flagged failed, as Celery records the run, though a span flags no other ``BaseException``
that is no ``Exception``; the ``task_revoked`` receiver adds no span of its own for it (two
spans for one run). Only SIGKILL of a prefork child leaves the run's span unfinished: then the
revoked span from the worker's main process is the run's one span.
"""

from __future__ import annotations

import sys
from typing import Any

# Looked up in sys.modules: only a green worker has them loaded.
_GREEN_STOPS = (("greenlet", "GreenletExit"), ("gevent.timeout", "Timeout"))


class _Pool:
    green = False  # the worker's pool runs its tasks on greenlets here (on_worker_ready)


pool = _Pool()


def stopped_by_the_pool(exc: BaseException) -> bool:
    """Whether ``exc``, raised through a task run, is its pool stopping it (see the module)."""
    if isinstance(exc, SystemExit):
        return True
    for module, name in _GREEN_STOPS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` (its sender the worker's consumer): whether its pool runs the tasks in
    this process on greenlets (gevent, eventlet)."""
    try:
        pool.green = getattr(getattr(sender, "pool", None), "is_green", False) is True
    except Exception:
        pool.green = False


def terminated_run_ends_itself(signum: Any) -> bool:
    """Whether a run terminated with ``signum`` finishes its own span: always on greenlets;
    in a prefork child for the signals billiard turns into ``SystemExit``, not SIGKILL."""
    if pool.green:
        return True
    try:
        from billiard import common  # noqa: PLC0415 (Celery's own dependency; only on a terminate)

        name = common.SIGMAP.get(int(signum))
        return name in common.TERMSIGS_DEFAULT and name not in common.TERMSIGS_IGNORE
    except Exception:
        return False
