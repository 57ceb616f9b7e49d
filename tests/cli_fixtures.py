"""Fixtures the CLI tests share: a private arena directory, arenas in it, and the helper
processes of ``tests/test_cli_support.py`` (cleaned up after each test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import test_cli_support as support


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[support.Procs]:
    p = support.Procs(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture
def new_arena(shm: Path) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(**kw: Any) -> Any:
        a = support.make_arena(shm, **kw)
        made.append(a)
        return a

    yield make
    for a in made:
        a.unlink()
        a.close()
