"""The documentation's promises, checked.

* Code blocks marked for execution (a fence opened with ```` ```bash run ```` or
  ```` ```python run ````) in ``docs/*.md`` and README.md are run, from the repository root,
  with this checkout first on PYTHONPATH and the interpreter's scripts directory first on
  PATH (so ``swmp`` is this checkout's). A block that fails fails the test.
* Every warning or error the agent logs (``swmp/``, ``ipc/``, ``reporter_proc/``; the
  development tools ``swmp.collector`` and ``swmp.demo`` included) is explained in
  docs/troubleshooting.md: the longest literal fragment of each message must appear there.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_FENCE = re.compile(r"^```(bash|python) run[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def _blocks() -> list[tuple[str, str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return out


BLOCKS = _blocks()


def test_docs_have_runnable_examples() -> None:
    names = {b[0].split(":")[0] for b in BLOCKS}
    assert {"docs/quickstart.md", "docs/collector.md"} <= names


@pytest.mark.parametrize(("where", "lang", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_marked_example_runs(where: str, lang: str, code: str, tmp_path: Path) -> None:
    scripts = sysconfig.get_path("scripts")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_"))}
    env.update(
        PATH=os.pathsep.join([scripts, str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        TMPDIR=str(tmp_path),  # mktemp in the examples: leftovers are visible and cleaned here
        SW_AGENT_ARENA_DIR=str(tmp_path / "shm"),  # the examples' agents, apart from others
        NO_COLOR="1",
    )
    (tmp_path / "shm").mkdir()
    argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        _stop_strays(proc, tmp_path)
    assert proc.returncode == 0, f"{where} failed:\n{out}"


def _stop_strays(proc: subprocess.Popen[str], tmp_path: Path) -> None:
    """Kill the example's processes that are still there (by pid), also on failure. A
    reporter outlives its server by its flush deadline: wait for it a little first."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    mark = str(tmp_path)

    def ours() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if mark in " ".join(p.cmdline()) and p.pid != os.getpid():
                    found.append(p)
        return found

    _, alive = psutil.wait_procs(ours(), timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


# ------------------------------------------------------------------------ warnings documented
_LOG_METHODS = {"warning", "error", "exception", "critical"}
_PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgix]|\{[^}]*\}")


def _message(node: ast.Call) -> ast.expr | None:
    """The message argument of a logging call (or of a log-once helper), if any."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in _LOG_METHODS and isinstance(func, ast.Attribute) and node.args:
        owner = ast.unparse(func.value)
        if "log" in owner.lower() or owner == "logging":
            return node.args[0]
    if name in ("_log_once", "_warn_once"):
        # (key, msg, *args), (key, level, msg, *args) in the reporter, (message) in the ring
        args = node.args[1:] if len(node.args) > 1 else node.args  # the first of several is a key
        literal = [a for a in args if isinstance(a, (ast.Constant, ast.JoinedStr)) and not _is_level(a)]
        return literal[0] if literal else None
    return None


def _is_level(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, str)


def _fragment(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts = _PLACEHOLDER.split(node.value)
    elif isinstance(node, ast.JoinedStr):
        parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    elif isinstance(node, ast.BinOp):  # "..." + "...": its left side
        return _fragment(node.left)
    else:
        return None  # a variable: the helper's callers carry the text, and are found themselves
    best = max((p.strip().removeprefix("swmp: ").strip(" .;:()") for p in parts), key=len, default="")
    return best if len(best) >= 12 else None


def _logged_messages() -> list[tuple[str, str]]:
    found = []
    for package in ("swmp", "ipc", "reporter_proc"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "generated" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and (msg := _message(node)) is not None:
                    frag = _fragment(msg)
                    if frag:
                        found.append((f"{path.relative_to(ROOT)}:{node.lineno}", frag))
    return found


def test_every_logged_warning_is_in_troubleshooting() -> None:
    doc = " ".join((ROOT / "docs" / "troubleshooting.md").read_text().split())
    messages = _logged_messages()
    assert len(messages) > 60  # the scan finds the agent's messages at all
    missing = [f"{where}: {frag!r}" for where, frag in messages if " ".join(frag.split()) not in doc]
    assert not missing, "not in docs/troubleshooting.md:\n" + "\n".join(missing)
