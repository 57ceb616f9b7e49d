"""The static table of instrumentations (``swmp.instrument.PLUGINS``): it says what each
module declares, and it lets a process import only the instrumentations of libraries it
uses."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from swmp import instrument

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("plugin", instrument.PLUGINS, ids=lambda p: p.name)
def test_the_table_says_what_the_module_declares(plugin: instrument.Plugin) -> None:
    mod = importlib.import_module(plugin.module)
    assert plugin.name == mod.NAME
    assert plugin.peer_names == tuple(getattr(mod, "PEER_NAMES", ()))
    assert plugin.trigger == getattr(mod, "TRIGGER", None)


def test_every_instrumentation_module_is_in_the_table() -> None:
    on_disk = {
        f"swmp.instrument.{p.stem}"
        for p in (ROOT / "swmp" / "instrument").glob("*.py")
        if not p.stem.startswith("_") and p.stem not in ("wsgi", "asgi")  # middlewares, not plugins
    }
    assert on_disk == set(instrument.MODULES)


def test_instrumentations_are_imported_only_with_their_library() -> None:
    code = (
        "import sys\n"
        "from swmp import instrument\n"
        "from swmp.config import load\n"
        "status = instrument.install_all(load({}, agent_log_reporter_active=False))\n"
        "assert 'redis' not in sys.modules and status['redis'] == 'deferred', status['redis']\n"
        "assert 'swmp.instrument.redis' not in sys.modules\n"
        "assert 'swmp.instrument.flask' not in sys.modules\n"
        "import redis\n"
        "assert 'swmp.instrument.redis' in sys.modules\n"
        "assert instrument.statuses()['redis'] == 'installed'\n"
        "loaded = [p.module for p in instrument.PLUGINS if p.module in sys.modules]\n"
        "print(len(loaded), len(instrument.PLUGINS))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, total = map(int, out.stdout.split())
    assert loaded < total / 2  # the rest stay unimported until their library is
