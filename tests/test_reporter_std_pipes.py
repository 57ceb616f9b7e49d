"""A caller that captures a program's output gets it back when the program exits, not when
its reporter has drained.

The reporter process and its supervisor are forked from the application and inherit its
standard output and error. A caller reading those to their end (``subprocess.run(...,
capture_output=True)``, a shell's ``$(...)``, cron) used to wait for the reporter too: up to
the shutdown deadline after the program exited, with a backend that never answers. Once the
owner has exited, both let go of inherited pipes; while it lives, the reporter's log lines go
to stderr as the application's do. The program runs under ``swmp run`` or calls
``swmp.start()`` itself; the backend accepts connections and never answers; the drain
deadline (120 s) is far beyond the bound the test puts on the capture (a failure, never a
timing of the success path).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.servers import SWMP_RUN, belongs, is_swmp, wait_until

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parent.parent
DRAIN_DEADLINE_S = 120  # the reporter's: a black-holed backend keeps it draining that long
CAPTURE_BOUND_S = 45  # far more than a prompt return, far less than the deadline

PROGRAM = textwrap.dedent(
    """
    import logging, os, sys
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(process)d %(name)s %(levelname)s %(message)s"
    )
    import swmp
    swmp.start()  # under swmp run the agent started already: a no-op
    with swmp.entry_span("/job"):
        pass
    print("started", os.getpid(), flush=True)
    sys.stdin.read()  # the test closes our stdin: exit
    print("done", flush=True)
    print("program exits", file=sys.stderr, flush=True)
    """
)


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A backend address whose kernel accepts connections that nobody ever answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def program_env(tmp_path: Path, backend: str, *, reporter_process: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_", "UWSGI_"))}
    (tmp_path / "shm").mkdir(exist_ok=True)
    env.update(
        {
            "SW_AGENT_NAME": "piped",
            "SW_AGENT_INSTANCE_NAME": "piped",
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": backend,
            "SW_AGENT_ARENA_DIR": str(tmp_path / "shm"),
            "SW_AGENT_REPORTER_PROCESS": "true" if reporter_process else "false",
            "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT": str(DRAIN_DEADLINE_S),
            "SW_AGENT_SPOOL_DIR": "off",  # spooling would end the drain before the deadline
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_PROFILE_ACTIVE": "false",
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class Captured:
    """The program with its three standard streams on pipes; each output read to its end on a
    thread of its own, as ``communicate`` does."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.marker = env["SW_AGENT_ARENA_DIR"]
        self.proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        assert stream is not None
        for raw in stream:  # type: ignore[attr-defined]
            lines.append(raw.decode(errors="replace"))

    def stderr(self) -> str:
        return "".join(self.err)

    def exit_and_read_to_end(self) -> None:
        """Close the program's stdin (it exits), then read both outputs to their end."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(60) == 0, self.stderr()
        for t in self._readers:
            t.join(CAPTURE_BOUND_S)
        if any(t.is_alive() for t in self._readers):
            held = [f"{p.pid} {p.name()}" for p in self.ours()]
            pytest.fail(
                f"the program exited, but its output was still open {CAPTURE_BOUND_S} s later "
                f"(held by {held}); stderr so far:\n{self.stderr()}"
            )

    def ours(self) -> list[psutil.Process]:
        """The agent's processes of this program (its environment names our arena directory)."""
        return [p for p in psutil.process_iter() if p.pid != os.getpid() and belongs(p, self.marker)]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)
        procs = self.ours()
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(procs, timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def captured(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[Captured]:
    run = Captured(argv, env, cwd)
    try:
        yield run
    finally:
        run.stop()


def _reporter_lines(text: str, program_pid: int) -> list[str]:
    """Log lines of the swmp.reporter logger written by another process than the program."""
    return [
        line
        for line in text.splitlines()
        if (m := re.match(r"(\d+) swmp\.reporter ", line)) and int(m.group(1)) != program_pid
    ]


@pytest.mark.parametrize("how", ["swmp-run", "start-in-script"])
def test_capture_ends_when_the_program_exits(tmp_path: Path, black_hole: str, how: str) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    argv = [sys.executable, str(script)]
    if how == "swmp-run":
        argv = [*SWMP_RUN, *argv]
    with captured(argv, program_env(tmp_path, black_hole), tmp_path) as run:
        wait_until(lambda: any(line.startswith("started") for line in run.out), 60, "the program")
        program_pid = int(run.out[0].split()[1])
        wait_until(lambda: any(is_swmp(p, "swmp-reporter") for p in run.ours()), 30, "the reporter")
        # The program's stdin is its own: the processes forked to report never read it, and
        # held it would keep the writer from seeing the program's exit.
        agents = [p for p in run.ours() if is_swmp(p)]  # the supervisor and the reporter
        stdin = {p.pid: os.readlink(f"/proc/{p.pid}/fd/0") for p in agents}
        assert stdin == {p.pid: os.devnull for p in agents}
        if how == "start-in-script":
            # Started after the program set up logging: the reporter's lines reach its stderr
            # while the program lives.
            wait_until(lambda: bool(_reporter_lines(run.stderr(), program_pid)), 30, "a reporter line")

        run.exit_and_read_to_end()

        assert "".join(run.out).splitlines()[-1] == "done"
        assert "program exits" in run.stderr()
        # The reporter is still draining (its deadline is far off): it let go of the pipes.
        assert [p for p in run.ours() if is_swmp(p, "swmp-reporter")]
        if how == "start-in-script":
            said = _reporter_lines(run.stderr(), program_pid)
            assert any("no longer writing to stdout and stderr" in line for line in said), said


def test_thread_mode_keeps_the_programs_streams(tmp_path: Path, black_hole: str) -> None:
    """No reporter process: the program drains on its own exit, and its streams are its own to
    the end (the agent never points them elsewhere)."""
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = program_env(tmp_path, black_hole, reporter_process=False)
    env["SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT"] = "1"  # the program itself waits for its drain
    with captured([sys.executable, str(script)], env, tmp_path) as run:
        wait_until(lambda: any(line.startswith("started") for line in run.out), 60, "the program")
        program_pid = int(run.out[0].split()[1])
        assert not [p for p in run.ours() if is_swmp(p)]  # no reporter process, no supervisor
        run.exit_and_read_to_end()
        assert "".join(run.out).splitlines()[-1] == "done"
        text = run.stderr()
        assert "program exits" in text
        # The reporter thread's lines, its exit summary (written after the program's last line)
        # included, reach the program's stderr.
        exiting = re.compile(rf"{program_pid} swmp\.reporter .*exiting")
        summary = [line for line in text.splitlines() if exiting.match(line)]
        assert summary, text


def test_only_the_reporters_processes_let_go_of_their_pipes() -> None:
    """A process that runs a supervisor or a reporter loop without being one (thread mode, a
    test) keeps its streams; the supervisor and the reporter point their pipes at /dev/null."""
    from reporter_proc import role
    from reporter_proc.plumbing import release_std_pipes

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.close(r)
            os.close(w)
            kept = release_std_pipes(os.getppid(), announce=False) == ()
            role.mark_reporter_process()
            let_go = release_std_pipes(os.getppid(), announce=False) == ("stdout", "stderr")
            os.write(1, b"lost")  # /dev/null now
            code = 0 if kept and let_go else 2
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        written = f.read()  # to the end: the child exited
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert written == b""
