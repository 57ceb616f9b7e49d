"""Log calls of unusual shapes with the log integrations installed: the application's logging
behaves as without the agent, and what can be reported is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swmp.instrument import loguru as sw_loguru

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, tmp_path: Path, agent: bool) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENT": "1" if agent else ""}
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


INSTALL = """
import os
if os.environ["AGENT"]:
    from swmp import _sink
    from swmp.config import load
    from swmp.instrument import log_reporter, loguru as sw_loguru
    _sink.set_sink(_sink.MemorySink())
    cfg = load({}, agent_log_reporter_level="DEBUG")
    log_reporter.install(cfg)
    try:
        sw_loguru.install(cfg)
    except ImportError:
        pass
"""


def test_a_loguru_logger_can_still_be_handed_to_a_spawned_process(tmp_path: Path) -> None:
    """loguru's recipe for ``spawn``: the logger is pickled into the child with its sinks; the
    reporter's sink was a closure, and ``Process.start()`` failed with a pickling error."""
    pytest.importorskip("loguru")
    code = (
        INSTALL
        + """
import multiprocessing as mp
import sys
from loguru import logger

def work(lg):
    lg.info("from the child")

if __name__ == "__main__":
    logger.remove()
    logger.add(sys.stdout, enqueue=True, format="{message}", context="spawn")
    p = mp.get_context("spawn").Process(target=work, args=(logger,))
    p.start()
    p.join()
    logger.info("parent done")
    logger.complete()
    logger.remove()
    print("exit", p.exitcode)
"""
    )
    without = _run(code, tmp_path, agent=False)
    assert without.stdout == "from the child\nparent done\nexit 0\n", without.stderr
    with_agent = _run(code, tmp_path, agent=True)
    assert with_agent.stdout == without.stdout, with_agent.stderr
    assert with_agent.returncode == 0


def test_the_loguru_sink_pickles_to_an_equal_one() -> None:
    import pickle

    sink = pickle.loads(pickle.dumps(sw_loguru._Sink(True)))
    assert isinstance(sink, sw_loguru._Sink) and sink.safe_mode is True
