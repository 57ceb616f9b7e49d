"""The PVM meters' two sources agree, and the one read from /proc keeps psutil out of the
application's processes (docs/meters.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from swmp.meters import _sources
from swmp.meters._pvm import _Pvm

REPO_ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


@pytest.fixture
def proc() -> _sources.ProcSource:
    source = _sources.proc_source()
    if source is None:
        pytest.skip("/proc cannot be read here")
    return source


@pytest.fixture
def ps() -> _sources.PsutilSource:
    return _sources.PsutilSource(psutil)


def test_machine_cpu_times_agree_with_psutil(proc: _sources.ProcSource, ps: _sources.PsutilSource) -> None:
    busy, total = proc.machine_times()
    ps_busy, ps_total = ps.machine_times()
    # /proc counts ticks, psutil seconds; read a moment apart, on every CPU of the machine.
    slack = 0.5 * (psutil.cpu_count() or 1)
    assert total / TICKS == pytest.approx(ps_total, abs=slack)
    assert busy / TICKS == pytest.approx(ps_busy, abs=slack)
    assert 0 < busy < total


def test_memory_agrees_with_psutil(proc: _sources.ProcSource, ps: _sources.PsutilSource) -> None:
    total, available = proc.memory()
    ps_total, ps_available = ps.memory()
    assert total == ps_total
    assert available == pytest.approx(ps_available, rel=0.05)
    assert proc.rss() == pytest.approx(ps.rss(), rel=0.1)


def test_threads_agree_with_psutil(proc: _sources.ProcSource, ps: _sources.PsutilSource) -> None:
    stop = threading.Event()
    extra = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in extra:
        t.start()
    try:
        assert proc.threads() == ps.threads() >= 4
    finally:
        stop.set()
        for t in extra:
            t.join()


def test_process_cpu_seconds_agree_with_psutil() -> None:
    t = psutil.Process().cpu_times()
    assert _sources.process_cpu_seconds() == pytest.approx(t.user + t.system, abs=0.05)


def test_percentages_are_computed_as_psutil_does(proc: _sources.ProcSource) -> None:
    pvm = _Pvm()
    pvm._source = proc
    assert pvm.total_mem() == pytest.approx(psutil.virtual_memory().percent, abs=2.0)
    rss_percent = 100.0 * psutil.Process().memory_info().rss / psutil.virtual_memory().total
    assert pvm.process_mem() == pytest.approx(rss_percent, rel=0.1)
    assert pvm.process_cpu() == 0.0  # no baseline yet
    deadline = _sources.process_cpu_seconds() + 0.05
    while _sources.process_cpu_seconds() < deadline:  # burn some CPU: the reading cannot be 0
        pass
    assert 0.0 < pvm.process_cpu() <= 100.0 * (psutil.cpu_count() or 1)
    pvm.after_fork()
    assert pvm.process_cpu() == 0.0  # the child's CPU time starts from zero: no baseline


def test_without_proc_the_meters_read_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sources, "proc_source", lambda: None)
    pvm = _Pvm()
    pvm.install()
    try:
        assert isinstance(pvm._source, _sources.PsutilSource)
        pvm.prime()
        assert 0.0 < pvm.total_mem() <= 100.0
        assert pvm.threads() >= 1
    finally:
        pvm.uninstall()


def test_an_unreadable_proc_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_status(self: _sources.ProcSource) -> int:
        raise OSError("no /proc/self/status")

    monkeypatch.setattr(_sources.ProcSource, "threads", no_status)
    assert _sources.proc_source() is None


def test_an_agent_with_pvm_meters_does_not_load_psutil(tmp_path: Path) -> None:
    """The meters run in a prefork master before it forks: what they import, every worker
    carries. The application's process reports every PVM meter without psutil."""
    script = tmp_path / "app.py"
    script.write_text(
        "import sys\n"
        "from swmp.meters._pvm import pvm\n"
        "assert pvm._installed, 'PVM meters are not on'\n"
        "values = {n: m() for n, m in (('cpu', pvm.total_cpu), ('proc_cpu', pvm.process_cpu),\n"
        "          ('mem', pvm.total_mem), ('proc_mem', pvm.process_mem), ('threads', pvm.threads))}\n"
        "print(sorted(values), 'psutil' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "SW_AGENT_COLLECTOR_BACKEND_SERVICES": "127.0.0.1:1",  # nothing answers; not needed
        "SW_AGENT_PVM_METER_REPORTER_ACTIVE": "true",
        "SW_AGENT_ARENA_DIR": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-m", "swmp.cli", "run", "--", sys.executable, str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['cpu', 'mem', 'proc_cpu', 'proc_mem', 'threads'] False", out.stdout
