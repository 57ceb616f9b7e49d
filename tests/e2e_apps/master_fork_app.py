"""A WSGI module that forks while it is imported, for tests/test_uwsgi_master_forks.py.

uWSGI without ``lazy-apps`` imports it in the master, before it forks its workers. The
import forks twice in Python, as applications do at import time:

* a plain ``os.fork`` whose child records a span (a helper's record is dropped and counted,
  never reported), runs the interpreter's exit functions and ``os._exit``\\ s;
* ``subprocess`` with a ``preexec_fn`` (the child runs Python's at-fork hooks, then execs).

The children's pids and how they ended go to the JSON file named by ``MASTER_FORKS_OUT``.
The WSGI app is tests/e2e_apps/fork_app.py's (``/pid`` answers the worker's pid).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess

from tests.e2e_apps.fork_app import _ended, _helper_span, app

__all__ = ["app"]


def _fork_and_record() -> tuple[int, int]:
    child = os.fork()
    if child == 0:
        code = 1
        try:
            _helper_span("/helper/import-fork")
            atexit._run_exitfuncs()  # what sys.exit in the child would run
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return child, _ended(status)


def _preexec_subprocess() -> tuple[int, int]:
    # The subject: any preexec_fn makes subprocess fork in Python, at-fork hooks included.
    proc = subprocess.Popen(["true"], preexec_fn=os.getpid)  # noqa: PLW1509
    return proc.pid, proc.wait(60)


def _write(out: str, result: dict[str, list[int]]) -> None:
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.rename(out + ".tmp", out)


_out = os.environ.get("MASTER_FORKS_OUT", "")
if _out:
    _write(_out, {"fork": list(_fork_and_record()), "preexec": list(_preexec_subprocess())})
