"""Profile tasks: poll the OAP for them, post them on the arena's board, report them finished.

The reporter alone talks to the OAP. Every ``profile_task_interval_s`` it asks
``getProfileTaskCommands`` once for each live worker instance (each worker is an instance
of its own; the OAP logs "notified" per instance) with the newest ``CreateTime`` that
instance has heard (``lastCommandTime``: the OAP answers only newer tasks). Per instance,
not one for the reporter: the OAP refreshes its task cache on its own schedule, so in one
round the first workers may ask before a new task is cached and the others after; with one
shared time, those first workers would never hear of it (nor would an instance that
appears later, or one a failed round skipped), and the OAP would never list them as
notified nor expect their "finished" report. The tasks that are not over
go onto the board (``reporter_proc.taskboard``), which every worker reads when its
generation changes: no pipe or socket per worker, and the same code in process and thread
mode (in thread mode the board is that of the process's private arena).

When a task's time is over (plus a short grace for snapshots still in the rings), the
poller sends ``reportTaskFinish`` for every instance it notified and takes the task off
the board. The snapshots themselves are ordinary ring records (``PROFILE_SNAPSHOT``),
shipped by delivery with ``collectSnapshot``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ipc import Board
from reporter_proc import records as R
from reporter_proc import taskboard
from reporter_proc.journal import Journal
from reporter_proc.lifecycle import StopState
from reporter_proc.senders.base import Sender, SendError
from reporter_proc.taskboard import BoardTask
from reporter_proc.ticks import until_next_tick

log = logging.getLogger("swmp.reporter")

COMMAND_NAME = "ProfileTaskQuery"
# Snapshots dumped in a task's last moments are still in rings or batches at its end.
FINISH_GRACE_S = 2.0

# What a task's numbers may be; a command with any other is refused. A number past 64 bits
# once reached the board's encoder, which raised, and killed the reporter; the restarted one
# heard the same command again (it asks from 0), so the reporter crashed in a loop. The
# bounds are those of SkyWalking itself: the OAP creates no task of less than 1 or more than
# 15 minutes (ProfileConstants, as the Java agent checks it too: taskboard.MIN_DURATION_MIN,
# MAX_DURATION_MIN), and keeps the threshold, the dump period and the sampling count as Java
# ints. Times are milliseconds since the epoch, at most the end of year 9999.
MIN_DURATION_MIN = taskboard.MIN_DURATION_MIN
MAX_DURATION_MIN = taskboard.MAX_DURATION_MIN
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
MAX_JAVA_INT = 2**31 - 1


@dataclass
class KnownTask:
    task: BoardTask
    create_ms: int
    notified: set[tuple[str, str]] = field(default_factory=set)  # (service, instance)
    finished: bool = False


@dataclass(frozen=True)
class Refused:
    """A ``ProfileTaskQuery`` the reporter does not run: a field missing, not a number, or
    out of range."""

    reason: str
    create_ms: int  # its CreateTime when that one is valid (else 0): heard, not asked again


def _number(cmd: dict[str, str], key: str, low: int, high: int, default: int | None = None) -> int:
    raw = cmd.get(key)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{key} is missing")
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{key} {str(raw)[:40]!r} is not a number") from None
    if not low <= value <= high:
        raise ValueError(f"{key} {value} is not in {low}..{high}")
    return value


def read_command(cmd: dict[str, str]) -> tuple[BoardTask, int] | Refused | None:
    """A ``ProfileTaskQuery`` command as ``(task, create_time_ms)``, or why it is refused;
    None for any other command."""
    if cmd.get("command") != COMMAND_NAME:
        return None
    try:
        create = _number(cmd, "CreateTime", 0, MAX_TIME_MS, 0)
    except ValueError as exc:
        return Refused(str(exc), 0)
    try:
        start = _number(cmd, "StartTime", 0, MAX_TIME_MS)
        task = BoardTask(
            task_id=str(cmd.get("TaskId") or ""),
            endpoint=str(cmd.get("EndpointName") or ""),
            start_ms=start,
            end_ms=start + _number(cmd, "Duration", MIN_DURATION_MIN, MAX_DURATION_MIN) * 60_000,
            min_duration_ms=_number(cmd, "MinDurationThreshold", 0, MAX_JAVA_INT, 0),
            # Below the OAP's 10 ms: sampled at 10 ms (see taskboard), as before.
            dump_period_ms=max(taskboard.MIN_DUMP_PERIOD_MS, _number(cmd, "DumpPeriod", 0, MAX_JAVA_INT)),
            max_sampling_count=_number(cmd, "MaxSamplingCount", 0, MAX_JAVA_INT, 0),
        )
    except ValueError as exc:
        return Refused(str(exc), create)
    if not task.task_id or not task.endpoint:
        return Refused("TaskId or EndpointName is empty", create)
    return task, create


def parse_command(cmd: dict[str, str]) -> tuple[BoardTask, int] | None:
    """A ``ProfileTaskQuery`` command as ``(task, create_time_ms)``; None for anything else,
    a refused command included."""
    got = read_command(cmd)
    return None if isinstance(got, Refused) else got


class ProfileTaskPoller:
    def __init__(
        self,
        board: Board,
        journal: Journal,
        sender: Sender,
        stop: StopState,
        instances: Callable[[], Iterable[tuple[str, str]]],
        *,
        interval_s: float,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.board = board
        self.journal = journal
        self.sender = sender
        self.stop = stop
        self.instances = instances  # (service, instance) of every live worker
        self.interval_s = max(0.05, interval_s)
        self.clock_ms = clock_ms
        self.last_command_time: dict[tuple[str, str], int] = {}  # per (service, instance)
        self.tasks: dict[str, KnownTask] = {}
        self.posted: list[BoardTask] | None = None
        self.polls = 0
        self.finishes_sent = 0

    @property
    def refused(self) -> int:
        """ProfileTaskQuery commands not run (out of range, incomplete): the status document's
        ``profile.commands_refused``, which ``swmp status`` shows."""
        return self.journal.counters.profile_commands_refused

    async def run(self) -> None:
        next_poll = 0.0
        tick = min(1.0, self.interval_s)
        while not self.stop.stopping:
            now = time.monotonic()
            if now >= next_poll:
                await self.poll()
                next_poll = now + self.interval_s
            await self.finish_due()
            await until_next_tick(tick)

    async def poll(self) -> None:
        """One round of ``getProfileTaskCommands``; errors are logged once and retried next round."""
        heard = self.last_command_time
        live = list(self.instances())
        now = self.clock_ms()
        for key in live:
            service, instance = key
            newest = heard.get(key, 0)
            try:
                commands = await self.sender.fetch_profile_commands(service, instance, newest)
            except SendError as exc:
                self.journal.log_once(
                    "profile-poll",
                    logging.WARNING,
                    "cannot fetch profile tasks (retrying every %.0f s): %s",
                    self.interval_s,
                    exc,
                )
                break
            for cmd in commands:
                parsed = read_command(cmd)
                if parsed is None:
                    continue
                if isinstance(parsed, Refused):
                    self._refuse(cmd, parsed)
                    # Heard all the same (as the Java agent does): not asked for again.
                    newest = max(newest, parsed.create_ms)
                    continue
                task, create = parsed
                newest = max(newest, create)
                if task.end_ms <= now:
                    continue  # over already (a restarted reporter hears every cached task again)
                known = self.tasks.get(task.task_id)
                if known is None:
                    known = self.tasks[task.task_id] = KnownTask(task, create)
                    log.info(
                        "profile task %s: endpoint %r, %d min from %d, dump every %d ms, at least %d ms, "
                        "at most %d segments per instance",
                        task.task_id,
                        task.endpoint,
                        (task.end_ms - task.start_ms) // 60_000,
                        task.start_ms,
                        task.dump_period_ms,
                        task.min_duration_ms,
                        task.max_sampling_count,
                    )
                known.notified.add(key)
            heard[key] = newest
        self.polls += 1
        # Forget the instances no longer live. A name that comes back (a recycled worker's
        # slot name) asks from 0 again: the OAP answers its running tasks again, harmless.
        for key in heard.keys() - set(live):
            del heard[key]
        self.post()

    def _refuse(self, cmd: dict[str, str], refused: Refused) -> None:
        self.journal.counters.profile_commands_refused += 1
        self.journal.log_once(
            "profile-command",
            logging.WARNING,
            "refusing profile task %r: %s; further refusals are only counted",
            str(cmd.get("TaskId", ""))[:100],
            refused.reason,
        )

    def post(self) -> None:
        """Put the tasks that are not over on the board (only when the set changed)."""
        tasks = [k.task for k in self.tasks.values() if not k.finished]
        if tasks == self.posted:
            return
        try:
            self.board.publish(taskboard.encode(tasks))
        except Exception as exc:  # BoardTooLarge (hundreds of tasks), anything orjson cannot encode
            self.journal.log_once("profile-board", logging.ERROR, "cannot post profile tasks: %s", exc)
            return
        self.posted = tasks

    async def finish_due(self) -> None:
        """Report the tasks whose time (plus the grace) is over, then forget them."""
        now = self.clock_ms()
        changed = False
        for task_id, known in list(self.tasks.items()):
            if now < known.task.end_ms + FINISH_GRACE_S * 1000:
                continue
            if not known.finished:
                known.finished = True
                changed = True
            for service, instance in sorted(known.notified):
                try:
                    await self.sender.report_finish(R.profile_finish(service, instance, task_id))
                except SendError as exc:
                    self.journal.log_once(
                        "profile-finish",
                        logging.WARNING,
                        "cannot report profile task %s finished: %s",
                        task_id,
                        exc,
                    )
                    continue  # try again on the next tick
                known.notified.discard((service, instance))
                self.finishes_sent += 1
            if not known.notified:
                del self.tasks[task_id]
        if changed:
            self.post()


def profiling_unavailable(journal: Journal, sender: Sender) -> str:
    """Why this reporter polls no profile tasks ("" when it does); said once, at start."""
    s = journal.settings
    if "profile" not in sender.supports:
        return f"the {s.protocol} protocol cannot carry profiling: profile tasks are not polled"
    if not s.profile_enabled:
        return "profiling is off (SW_AGENT_PROFILE_ACTIVE=false): profile tasks are not polled"
    return ""
