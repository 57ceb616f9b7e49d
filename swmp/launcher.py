"""``swmp run -- COMMAND``: start any Python program with the agent loaded first.

The command is executed (``execvp``, same pid) with ``swmp/_loader`` first on
``PYTHONPATH``; its ``sitecustomize`` starts the agent in every Python interpreter the
command starts, however it is wrapped (shell scripts, process supervisors). The variables
the agent reads are plain ``SW_*`` environment variables, so they pass through untouched.

An interpreter that cannot import swmp (another Python, another virtualenv) is left alone:
the loader does nothing there (``SWMP_RUN_VERBOSE=1`` says so on stderr).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys

log = logging.getLogger("swmp.launcher")

LOADER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_loader")


def child_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != LOADER_DIR]
    # Our package must stay importable from the child even when installed in a path the
    # child would not otherwise see (e.g. running from a source checkout).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra = [package_root] if package_root not in paths else []
    env["PYTHONPATH"] = os.pathsep.join([LOADER_DIR, *paths, *extra])
    env["SWMP_RUN_ACTIVE"] = "1"
    return env


def run(argv: list[str]) -> int:
    """Replace this process with ``argv``; returns only on error (exit status)."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: swmp run [--] COMMAND [ARGS...]\n")
        return 2
    program = shutil.which(argv[0])
    if program is None:
        sys.stderr.write(f"swmp run: command not found: {argv[0]}\n")
        return 127
    env = child_environment()
    if os.path.basename(program).startswith("uwsgi"):
        argv = uwsgi_arguments(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, argv, env)
    except OSError as exc:
        sys.stderr.write(f"swmp run: cannot execute {program}: {exc}\n")
        return 126
    return 0  # not reached


def uwsgi_arguments(argv: list[str]) -> list[str]:
    """Flags uWSGI needs for the agent, added unless the user already chose.

    ``--py-call-osafterfork`` makes uWSGI run Python's at-fork hooks in workers, so each
    worker claims its ring slot at fork rather than on its first record.
    """
    args = list(argv)
    joined = " ".join(args)
    if "py-call-osafterfork" not in joined and "py-call-uwsgi-fork-hooks" not in joined:
        args.append("--py-call-osafterfork")
    if "enable-threads" not in joined:
        args.append("--enable-threads")
    return args


def bootstrap() -> None:
    """Called from the loader's sitecustomize: start the agent from the environment."""
    try:
        from swmp import config as config_module
        from swmp.agent import start

        if os.environ.get("SW_AGENT_LOGGING_LEVEL"):
            logging.getLogger("swmp").setLevel(os.environ["SW_AGENT_LOGGING_LEVEL"].upper())
        start(config_module.load())
    except Exception as exc:
        sys.stderr.write(f"swmp: agent bootstrap failed: {exc!r}\n")
