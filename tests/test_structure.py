"""The shape the project keeps (issue 9): small modules, classes with one job, and
dependencies that point one way (``swmp`` -> ``ipc``, ``reporter_proc`` -> ``ipc``; ``ipc``
knows nothing of the other two)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("swmp", "ipc", "reporter_proc")
MAX_MODULE_LINES = 500
MAX_CLASS_METHODS = 25
SKIP = ("protocol/generated",)  # protobuf code generated from the SkyWalking .proto files


def _modules() -> list[Path]:
    return [
        p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if not any(s in p.as_posix() for s in SKIP)
    ]


def test_the_packages_have_modules() -> None:
    assert len(_modules()) > 50


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_size_and_class_methods(path: Path) -> None:
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{lines} lines: split it along its jobs"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) for x in node.body)
            assert methods <= MAX_CLASS_METHODS, f"class {node.name} has {methods} methods"


def _imported(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_ipc_imports_neither_swmp_nor_reporter_proc() -> None:
    offenders = {
        p.relative_to(ROOT).as_posix(): sorted(_imported(p) & {"swmp", "reporter_proc"})
        for p in (ROOT / "ipc").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
