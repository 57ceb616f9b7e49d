"""``swmp run`` and the sitecustomize loader, and the agent in a single-process program.

The programs run in child processes (the agent patches libraries process-wide) and report
to the in-process test collector over gRPC.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from reporter_proc import exit_threads
from swmp import _own_logging, launcher
from swmp.config import Config
from tests.collector import Collector

REPO = Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent(
    """
    import os, sys
    if os.environ.get("EXPLICIT_START"):
        import swmp
        swmp.start()
    import swmp
    from swmp import agent
    mode = agent.current().mode if agent.running() else "-"
    print("agent running:", agent.running(), "mode:", mode, flush=True)
    for i in range(int(os.environ.get("SPANS", "25"))):
        with swmp.entry_span(f"/job/{i}"):
            with swmp.local_span("step"):
                pass
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


def base_env(tmp_path: Path, collector: Collector, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_", "UWSGI_"))}
    (tmp_path / "shm").mkdir(exist_ok=True)
    env.update(
        {
            "SW_AGENT_NAME": "prog",
            "SW_AGENT_INSTANCE_NAME": "prog",
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": collector.grpc_address,
            "SW_AGENT_ARENA_DIR": str(tmp_path / "shm"),
            "SW_AGENT_REPORTER_FLUSH_INTERVAL": "0.05",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_PROFILE_ACTIVE": "false",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def swmp_run(*command: str) -> list[str]:
    return [sys.executable, "-m", "swmp.cli", "run", "--", *command]


def delivered(collector: Collector, n: int) -> list[str]:
    assert collector.wait_for(lambda: len(collector.segments) >= n, 20)
    return [s.serviceInstance for s in collector.segments]


# -- a single-process program, every start path, both reporter modes ------------------------------
@pytest.mark.parametrize("reporter_process", ["true", "false"])
@pytest.mark.parametrize("how", ["swmp-run", "wrapped", "explicit"])
def test_a_program_reports_every_span(
    tmp_path: Path, collector: Collector, how: str, reporter_process: str
) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    env = base_env(tmp_path, collector, SW_AGENT_REPORTER_PROCESS=reporter_process)
    if how == "swmp-run":
        argv = swmp_run(sys.executable, str(prog))
    elif how == "wrapped":  # a shell script starts Python: the loader still gets there
        wrapper = tmp_path / "start.sh"
        wrapper.write_text(f'#!/bin/sh\necho "wrapper pid $$"\n"{sys.executable}" "{prog}"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        argv = swmp_run(str(wrapper))
    else:
        env["EXPLICIT_START"] = "1"
        argv = [sys.executable, str(prog)]
    done = run(argv, env, tmp_path)
    assert done.returncode == 0, done.stderr
    mode = "process" if reporter_process == "true" else "thread"
    assert f"agent running: True mode: {mode}" in done.stdout
    if "the reporter thread cannot start its grpc sender" in done.stderr:
        # Only where exit_threads.py says: the program ends within ~0.1 s of its first record,
        # and these releases refuse the thread its sender would start at exit.
        assert mode == "thread" and sys.version_info[:3] in exit_threads.REFUSING_RELEASES
        return
    instances = delivered(collector, 25)
    assert len(collector.segments) == 25
    assert set(instances) == {"prog-w0"}
    assert sorted(s.spans[-1].operationName for s in collector.segments) == sorted(
        f"/job/{i}" for i in range(25)
    )
    # Whoever was last out removed the arena files.
    assert collector.wait_for(lambda: not list((tmp_path / "shm").glob("*/*.arena")), 15)


def test_the_loader_does_nothing_outside_swmp_run(tmp_path: Path, collector: Collector) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    env = base_env(tmp_path, collector, SPANS="1")
    env["PYTHONPATH"] = os.pathsep.join([launcher.LOADER_DIR, str(REPO)])  # loader on the path, no flag
    done = run([sys.executable, str(prog)], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "agent running: False" in done.stdout


def test_a_previous_sitecustomize_still_runs(tmp_path: Path, collector: Collector) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import builtins, swmp.agent\nprint(getattr(builtins, 'THEIRS_RAN', False), swmp.agent.running())\n"
    )
    env = base_env(tmp_path, collector)
    env["PYTHONPATH"] = os.pathsep.join([str(theirs), str(REPO)])
    done = run(swmp_run(sys.executable, str(prog)), env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_exit_status_and_signals_are_the_commands_own(tmp_path: Path, collector: Collector) -> None:
    env = base_env(tmp_path, collector)
    done = run(
        swmp_run(sys.executable, "-c", "import os, sys; print(os.getpid()); sys.exit(7)"), env, tmp_path
    )
    assert done.returncode == 7
    assert run(swmp_run("no-such-command-swmp"), env, tmp_path).returncode == 127
    assert run([sys.executable, "-m", "swmp.cli", "run"], env, tmp_path).returncode != 0


# -- SW_AGENT_LOGGING_LEVEL, whatever starts the agent ------------------------------------------
LEVELS_PROGRAM = textwrap.dedent(
    """
    import logging, os
    import swmp
    from swmp import agent
    if os.environ.get("EXPLICIT_START"):
        kw = {"agent_logging_level": os.environ["KW_LEVEL"]} if os.environ.get("KW_LEVEL") else {}
        swmp.start(**kw)
    levels = [logging.getLevelName(logging.getLogger(n).level) for n in ("swmp", "ipc")]
    print("agent running:", agent.running(), "levels:", *levels, flush=True)
    """
)


@pytest.mark.parametrize(
    "case",
    [
        ("swmp-run", "LOUD", "", "INFO"),  # refused, the default used, the agent still starts
        ("swmp-run", "debug", "", "DEBUG"),
        ("explicit", "LOUD", "", "INFO"),
        ("explicit", "DEBUG", "", "DEBUG"),  # the environment, under a plain swmp.start()
        ("explicit", "", "DEBUG", "DEBUG"),  # swmp.start(agent_logging_level="DEBUG")
        ("explicit", "DEBUG", "ERROR", "ERROR"),  # the keyword wins
        ("explicit", "", "", "INFO"),  # the documented default is applied too
    ],
)
def test_the_agent_logging_level_is_applied_to_its_loggers(
    tmp_path: Path, collector: Collector, case: tuple[str, str, str, str]
) -> None:
    how, env_level, kw_level, expected = case
    prog = tmp_path / "prog.py"
    prog.write_text(LEVELS_PROGRAM)
    env = base_env(tmp_path, collector, KW_LEVEL=kw_level)
    if env_level:
        env["SW_AGENT_LOGGING_LEVEL"] = env_level
    if how == "swmp-run":
        argv = swmp_run(sys.executable, str(prog))
    else:
        env["EXPLICIT_START"] = "1"
        argv = [sys.executable, str(prog)]
    done = run(argv, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"agent running: True levels: {expected} {expected}" in done.stdout, done.stdout + done.stderr
    assert "bootstrap failed" not in done.stderr
    refused = "SW_AGENT_LOGGING_LEVEL='LOUD' is invalid"
    assert (refused in done.stderr) == (env_level == "LOUD"), done.stderr


def test_a_bad_level_in_a_hand_built_config_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    before = [logging.getLogger(n).level for n in _own_logging.AGENT_LOGGERS]
    with caplog.at_level(logging.WARNING, logger="swmp.agent"):
        _own_logging.apply(Config(agent_logging_level="LOUD"))
    try:
        assert [logging.getLogger(n).level for n in _own_logging.AGENT_LOGGERS] == [logging.INFO] * 2
        assert any("'LOUD' is invalid" in r.getMessage() for r in caplog.records)
        _own_logging.apply(Config(agent_logging_level="warn"))
        assert logging.getLogger("ipc").level == logging.WARNING
    finally:
        _own_logging.restore()
    assert [logging.getLogger(n).level for n in _own_logging.AGENT_LOGGERS] == before


# -- the launcher's pieces ---------------------------------------------------------------------
def test_child_environment() -> None:
    env = launcher.child_environment({"PYTHONPATH": "/a:/b", "SW_AGENT_NAME": "x"}, ["gunicorn", "app:app"])
    assert env["PYTHONPATH"].split(os.pathsep) == [launcher.LOADER_DIR, "/a", "/b", launcher.PACKAGE_ROOT]
    assert env["SWMP_RUN_ACTIVE"] == "1"
    assert env["SW_AGENT_NAME"] == "x"
    assert env["UWSGI_PY_CALL_UWSGI_FORK_HOOKS"] == "1"
    assert "UWSGI_PY_CALL_OSAFTERFORK" not in env  # fatal in uWSGI's workers on Python 3.13
    # Running it twice (swmp run inside swmp run) does not stack the loader.
    again = launcher.child_environment(env)
    assert again["PYTHONPATH"].split(os.pathsep).count(launcher.LOADER_DIR) == 1
    # The user's own choice about uWSGI's fork hooks wins.
    assert "UWSGI_PY_CALL_UWSGI_FORK_HOOKS" not in launcher.child_environment(
        {}, ["uwsgi", "--py-call-osafterfork"]
    )
    chosen = launcher.child_environment({"UWSGI_PY_CALL_OSAFTERFORK": "0"})
    assert chosen["UWSGI_PY_CALL_OSAFTERFORK"] == "0" and "UWSGI_PY_CALL_UWSGI_FORK_HOOKS" not in chosen


def test_python_interpreter_of(tmp_path: Path) -> None:
    def script(name: str, first_line: str) -> str:
        path = tmp_path / name
        path.write_text(first_line + "\nprint('hi')\n")
        return str(path)

    assert launcher.python_interpreter_of("/usr/bin/python3.11") == "/usr/bin/python3.11"
    assert launcher.python_interpreter_of(script("a", "#!/opt/py/bin/python3")) == "/opt/py/bin/python3"
    assert launcher.python_interpreter_of(script("b", "#!/bin/sh")) is None
    assert launcher.python_interpreter_of(script("c", "echo no shebang")) is None
    via_env = launcher.python_interpreter_of(script("d", f"#!/usr/bin/env -S {Path(sys.executable).name}"))
    assert via_env is None or Path(via_env).name.startswith("python")


def test_an_interpreter_that_cannot_import_swmp_is_reported(tmp_path: Path) -> None:
    broken = tmp_path / "python-elsewhere"
    broken.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'swmp'\" >&2\nexit 1\n")
    broken.chmod(0o755)
    problem = launcher.check_interpreter(str(broken), {"PATH": os.environ["PATH"]})
    assert "cannot import swmp" in problem and "No module named 'swmp'" in problem
    assert launcher.check_interpreter(sys.executable, {}) == ""  # ours: nothing to check
    assert launcher.check_interpreter("/bin/sh", {}) == ""  # not Python: nothing to tell
