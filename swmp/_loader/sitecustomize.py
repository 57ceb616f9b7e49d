"""Loaded by every Python interpreter started under ``swmp run``: starts the agent early.

``swmp run`` puts this directory first on ``PYTHONPATH``. Python imports ``sitecustomize``
at start-up, before the application, so the agent starts in the prefork master before it
forks workers. Whatever ``sitecustomize`` the environment had before is still run.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _chain_previous_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_swmp_previous_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(module)
                except Exception as exc:  # their failure is theirs; keep going
                    sys.stderr.write(f"swmp: the previous sitecustomize failed: {exc!r}\n")
            return


def _start_agent() -> None:
    if os.environ.get("SWMP_RUN_ACTIVE") != "1":
        return
    try:
        from swmp.launcher import bootstrap  # noqa: PLC0415  (only under swmp run)
    except Exception as exc:  # e.g. a different interpreter without swmp installed
        if os.environ.get("SWMP_RUN_VERBOSE"):
            sys.stderr.write(f"swmp: agent not loaded in {sys.executable}: {exc!r}\n")
        return
    bootstrap()


_chain_previous_sitecustomize()
_start_agent()
