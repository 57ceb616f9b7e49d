"""A Flask app whose request code forks helpers, for tests/test_fork_children.py.

Each route forks one kind of helper, lets it record a span (a helper must stay inert: the
span is dropped and counted, never reported), and answers JSON with the helpers' pids and
how they ended (``0``: exited 0; ``-N``: killed by signal N), so a crash in a child shows.

* ``/fork``     plain ``os.fork``; the child runs the interpreter's exit functions (as a
  child leaving by ``sys.exit`` would), then ``os._exit``;
* ``/pool``     a ``multiprocessing`` fork-context pool of 2 running 4 tasks;
* ``/preexec``  ``subprocess`` with a ``preexec_fn`` (which runs the at-fork hooks);
* ``/pid``      no helper: the worker's pid.
"""

from __future__ import annotations

import atexit
import contextvars
import multiprocessing
import os
import subprocess

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue

import swmp

app = Flask(__name__)


def _span(name: str) -> None:
    with swmp.local_span(name):
        pass


def _helper_span(name: str) -> int:
    # In a fresh context: the forking thread's request span is still open in the child's
    # copy, and a span under it would never finish there (no record to drop and count).
    contextvars.Context().run(_span, name)
    return os.getpid()


def _ended(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


@app.route("/pid")
def pid() -> ResponseReturnValue:
    return jsonify(worker=os.getpid())


@app.route("/fork")
def fork() -> ResponseReturnValue:
    child = os.fork()
    if child == 0:
        code = 1
        try:
            _helper_span("/helper/fork")
            atexit._run_exitfuncs()  # what sys.exit in the child would run
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return jsonify(worker=os.getpid(), children=[child], ended=[_ended(status)])


@app.route("/pool")
def pool() -> ResponseReturnValue:
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as p:
        pids = p.map_async(_helper_span, ["/helper/pool"] * 4).get(timeout=60)
        workers = list(p._pool)  # type: ignore[attr-defined]
        p.close()
        p.join()
    ended = [w.exitcode for w in workers]
    return jsonify(worker=os.getpid(), children=sorted(set(pids)), ended=ended)


def _preexec() -> None:
    os.environ.get("HOME")  # any preexec_fn makes subprocess fork in Python, hooks included


@app.route("/preexec")
def preexec() -> ResponseReturnValue:
    done = subprocess.run(["true"], preexec_fn=_preexec, check=False, timeout=60)
    return jsonify(worker=os.getpid(), children=[], ended=[done.returncode])
