"""What the tests of the optional C modules share: is there a compiler, and is the module in
use built from the current source (an in-place build left from an older checkout would
test old code)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

HAVE_CC = shutil.which(os.environ.get("CC", "cc")) is not None or shutil.which("gcc") is not None


def assert_current(module_file: str | None, source: Path) -> None:
    """``module_file`` (a built extension) is not older than ``source`` when it was built in
    place next to it (the build copies the file with whole seconds: one second of slack)."""
    assert module_file is not None
    built = Path(module_file)
    if built.parent == source.parent.parent:
        assert built.stat().st_mtime + 1 >= source.stat().st_mtime, "stale build: run pip install -e ."
