"""``swmp run -- COMMAND``: start any Python program with the agent loaded first.

The command is executed (``execve``, same pid, so signals and exit status are the
command's own) with ``swmp/_loader`` first on ``PYTHONPATH``. Its ``sitecustomize`` starts
the agent in every Python interpreter the command starts, however it is wrapped (shell
scripts, process supervisors), before the application is imported: in a prefork server
that is the master, which creates the arena and forks the reporter before any worker.

What passes to the child through the environment:

* ``PYTHONPATH``: the loader, then what was there, then the directory swmp is imported
  from (so a source checkout works without installation);
* ``SWMP_RUN_ACTIVE=1``: the loader starts the agent only when this is set;
* ``UWSGI_PY_CALL_UWSGI_FORK_HOOKS=1`` (unless the command line or the environment already
  chose): uWSGI reads its options from ``UWSGI_*`` variables too, so this reaches a uWSGI
  started by a wrapper script; it makes uWSGI run Python's at-fork hooks around its forks,
  so workers take their ring slot at fork rather than on their first record. Not
  ``--py-call-osafterfork``: that runs only the child's half (``PyOS_AfterFork_Child``
  without ``PyOS_BeforeFork``), which releases an import lock the parent never took; Python
  3.13 treats that as fatal and every worker aborts at start
  (``_PyRecursiveMutex_Unlock``, measured with uWSGI 2.0.31 and no agent at all). uWSGI
  ignores ``UWSGI_*`` variables it does not know (2.0.31 checked), so a release without
  the option starts as before and the agent falls back to its pid checks;
* every ``SW_*`` setting, untouched.

Interpreter check: when the command is a Python interpreter, or a script whose ``#!``
names one, other than the one running ``swmp``, it must be able to import swmp; if it
cannot, the agent would silently not load, so ``swmp run`` says so on stderr (the command
still runs). ``SWMP_RUN_VERBOSE=1`` makes the loader report the same from inside.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger("swmp.launcher")

LOADER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_loader")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UWSGI_FORK_OPTIONS = ("py-call-osafterfork", "py-call-uwsgi-fork-hooks")


def child_environment(environ: Mapping[str, str] | None = None, argv: Sequence[str] = ()) -> dict[str, str]:
    """The environment ``swmp run`` gives its command."""
    env = dict(os.environ if environ is None else environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != LOADER_DIR]
    extra = [PACKAGE_ROOT] if PACKAGE_ROOT not in paths else []
    env["PYTHONPATH"] = os.pathsep.join([LOADER_DIR, *paths, *extra])
    env["SWMP_RUN_ACTIVE"] = "1"
    chosen = any(opt in arg for arg in argv for opt in UWSGI_FORK_OPTIONS) or any(
        f"UWSGI_{opt.upper().replace('-', '_')}" in env for opt in UWSGI_FORK_OPTIONS
    )
    if not chosen:
        env["UWSGI_PY_CALL_UWSGI_FORK_HOOKS"] = "1"
    return env


def _command(argv: Any) -> list[str]:
    """``swmp.cli`` hands over its parsed namespace (``.command``); others pass a list."""
    command = list(getattr(argv, "command", argv) or [])
    if command and command[0] == "--":
        command = command[1:]
    return [str(a) for a in command]


def run(argv: Any) -> int:
    """Replace this process with the command; returns only on error (an exit status)."""
    command = _command(argv)
    if not command:
        sys.stderr.write("usage: swmp run [--] COMMAND [ARGS...]\n")
        return 2
    program = shutil.which(command[0])
    if program is None:
        sys.stderr.write(f"swmp run: command not found: {command[0]}\n")
        return 127
    env = child_environment(argv=command)
    problem = check_interpreter(program, env)
    if problem:
        sys.stderr.write(f"swmp run: warning: {problem}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, command, env)
    except OSError as exc:
        sys.stderr.write(f"swmp run: cannot execute {program}: {exc}\n")
        return 126
    return 0  # not reached


# -- interpreter check -------------------------------------------------------------------------
def python_interpreter_of(program: str) -> str | None:
    """The Python interpreter ``program`` runs under, when that can be told without
    running it: the program itself, or its ``#!`` line (``env`` resolved on PATH)."""
    if _looks_like_python(os.path.basename(program)):
        return program
    try:
        with open(program, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        if not rest:
            return None
        found = shutil.which(rest[0])
        return found if found and _looks_like_python(os.path.basename(found)) else None
    return words[0] if _looks_like_python(os.path.basename(words[0])) else None


def _looks_like_python(name: str) -> bool:
    return name.startswith(("python", "pypy"))


def _same_interpreter(path: str) -> bool:
    try:
        return os.path.realpath(path) == os.path.realpath(sys.executable)
    except OSError:
        return False


def check_interpreter(program: str, env: Mapping[str, str]) -> str:
    """Empty when the agent will load in ``program``'s interpreter (or it cannot be told);
    otherwise what is wrong, for a warning."""
    interpreter = python_interpreter_of(program)
    if interpreter is None or _same_interpreter(interpreter):
        return ""
    probe_env = dict(env)
    probe_env["SWMP_RUN_ACTIVE"] = "0"  # probe the import, do not start an agent
    try:
        done = subprocess.run(
            [interpreter, "-c", "import swmp.launcher"],
            env=probe_env,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot check the interpreter {interpreter}: {exc}"
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
        return (
            f"{interpreter} cannot import swmp ({last[0]}); the agent will not load in it. "
            f"Install swmp for that interpreter, or run `{interpreter} -m swmp.cli run -- ...`."
        )
    return ""


# -- inside the child --------------------------------------------------------------------------
def bootstrap() -> None:
    """Called from the loader's sitecustomize: start the agent from the environment."""
    try:
        from swmp import config as config_module  # noqa: PLC0415 (the loader imports us lazily)
        from swmp.agent import start  # noqa: PLC0415

        start(config_module.load())
    except Exception as exc:
        sys.stderr.write(f"swmp: agent bootstrap failed: {exc!r}\n")
