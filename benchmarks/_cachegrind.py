"""Instructions per operation under Valgrind's cachegrind: the runner the ``*_cachegrind``
benchmarks (and ``grpc_client_cost.py``) share.

A benchmark re-runs its own script as the measured child (with ``--child ...`` arguments it
parses) under ``valgrind --tool=cachegrind --cache-sim=no``, twice, with N and 3N operations
after the same warm-up: ``(I(3N) - I(N)) / 2N`` is the count per operation, start-up and
warm-up cancelled. Address randomisation is off (``setarch -R``) and ``PYTHONHASHSEED`` is
fixed, so a rerun of the same code gives the same count within a few instructions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def events(
    python: str,
    script: str,
    child_args: Sequence[str],
    seed: int,
    options: Sequence[str] = ("--cache-sim=no",),
) -> dict[str, int]:
    """The events (``Ir``; with a cache simulation in ``options`` its misses too) of one run
    of ``python script *child_args`` under cachegrind."""
    with tempfile.TemporaryDirectory(prefix="swmp-cg-") as tmp:
        out = Path(tmp) / "cg.out"
        argv = ["valgrind", "--tool=cachegrind", *options, f"--cachegrind-out-file={out}"]
        argv += [python, script, *child_args]
        if shutil.which("setarch"):
            argv = ["setarch", os.uname().machine, "-R", *argv]
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        names: list[str] = []
        for line in out.read_text().splitlines():
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith("summary:"):
                return dict(zip(names, map(int, line.split()[1:]), strict=True))
    raise RuntimeError("no summary line in the cachegrind output")


def instructions(python: str, script: str, child_args: Sequence[str], seed: int) -> int:
    """Instructions of one run of ``python script *child_args`` under cachegrind."""
    return events(python, script, child_args, seed)["Ir"]


def per_op(python: str, script: str, child_args: Callable[[int], Sequence[str]], n: int, seed: int) -> float:
    """Instructions per operation: ``child_args(k)`` are the child's arguments for k operations."""
    once, thrice = (instructions(python, script, child_args(k * n), seed) for k in (1, 3))
    return (thrice - once) / (2 * n)


def compare(
    cases: Sequence[str],
    modes: tuple[str, str],
    measure: Callable[[str, str, int], float],
    seeds: Sequence[int],
) -> dict[str, dict[str, float]]:
    """For each case, ``measure(case, mode, seed)`` of both modes (mean over ``seeds``) and
    the second minus the first, printed as a table row as it comes; the rows, by case."""
    base, other = modes
    print(f"{'':<24}{base:>12}{other:>12}{'added':>10}")
    rows: dict[str, dict[str, float]] = {}
    for case in cases:
        got = {m: sum(measure(case, m, s) for s in seeds) / len(seeds) for m in modes}
        added = got[other] - got[base]
        rows[case] = {**got, "added": added}
        print(f"{case:<24}{got[base]:>12,.0f}{got[other]:>12,.0f}{added:>10,.0f}", flush=True)
    return rows


def compare_to_json(
    cases: Sequence[str],
    modes: tuple[str, str],
    measure: Callable[[str, str, int], float],
    seeds: Sequence[int],
    *,
    json_path: str | None,
    meta: dict[str, object],
) -> dict[str, dict[str, float]]:
    """:func:`compare`, then the rows (with ``meta``) written to ``json_path`` if given."""
    rows = compare(cases, modes, measure, seeds)
    if json_path:
        Path(json_path).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    return rows
