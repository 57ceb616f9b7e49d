"""Application logs to SkyWalking: every stdlib ``logging`` record of the reporter's level.

Where it hooks, and why: not a handler on the root logger, which the application's own
logging set-up removes (``dictConfig`` configuring the root logger, ``basicConfig(force=True)``,
a handler reset) and which never sees loggers with ``propagate=False`` (``gunicorn.error``).
Instead ``Logger.callHandlers`` is wrapped on the class: every record that a logger lets
through (its level, its filters) passes there exactly once, whatever handlers exist, and no
logging configuration replaces a class method. With ``SW_AGENT_LOG_REPORTER_IGNORE_FILTER=true``
``Logger.handle`` is wrapped instead: before the logger's filters.

The same wrapper puts the trace id on every record as ``record.tid`` (``"N/A"`` outside a
trace), so the application's own formatters can print ``%(tid)s`` (the name the SkyWalking
Python agent documents); a ``tid`` the application set itself is left alone. That part stays
when reporting is off (``SW_AGENT_LOG_REPORTER_ACTIVE=false``), so such formatters keep working.

Each reported record carries the trace context of the code that logged it (trace id,
segment id, span id, endpoint), so the OAP links logs to traces. A record created in another
process (``record.process``: the logging cookbook's listener handling records it received) is
that process's to report: it is neither reported here nor given this process's trace id.
Nothing here raises or blocks: a record the ring cannot take is dropped and counted; a
record the layout cannot format is sent with the default layout. The agent's own loggers
(``swmp``, ``ipc``) are never reported, so a failing sink cannot feed itself. loguru and
structlog reuse :func:`write_log` (``swmp.instrument.loguru``, ``swmp.instrument.structlog``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ipc
from reporter_proc.records import LOG
from swmp import _sink
from swmp.instrument._incoming import reporter_is_calling
from swmp.instrument._patch import patch, restore
from swmp.tracing.context import trace_position
from swmp.tracing.identity import identity
from swmp.tracing.limits import limits
from swmp.tracing.span import Span, current_span
from swmp.tracing.utf8 import dumps_escaping

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "logging"
PACKAGE = None
SUPPORTED = ("", "")

DEFAULT_LAYOUT = "%(asctime)s [%(threadName)s] %(levelname)s %(name)s - %(message)s"
NO_TRACE = "N/A"  # record.tid outside a trace
_get_current = current_span.get

# The agent's own records are not reported (a report of a failure to report would feed
# itself). Its loggers are "swmp" and "swmp.*", and "ipc" for the shared-memory package, a
# name an application may use for a logger of its own: "ipc" counts as ours only for calls
# made from that package's files.
_IPC_DIR = os.path.dirname(ipc.__file__) + os.sep
_CREDENTIALS = re.compile(r"(://)[^/\s:@]+:[^/\s@]+@")

log = logging.getLogger("swmp.logs")


class _Pid:
    """This process's pid, kept current across ``fork`` (a record's ``process`` is compared
    with it on every reported record: no system call for it)."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def refresh(self) -> None:
        self.pid = os.getpid()


_own = _Pid()
os.register_at_fork(after_in_child=_own.refresh)


def made_elsewhere(record: logging.LogRecord) -> bool:
    """Whether ``record`` was created in another process: one this process received and
    handles for it (the logging cookbook's listener: a ``QueueListener``, a socket receiver
    calling ``logging.getLogger(record.name).handle(record)``). That process reported it if
    it runs the agent, with its own trace context; this one must not report it again, nor
    attach its own context to it. A record without a pid (``logging.logProcesses`` off)
    counts as this process's."""
    pid = record.process
    return pid is not None and pid != _own.pid


class LogStats:
    __slots__ = ("dropped", "errors", "layout_fallbacks", "written")

    def __init__(self) -> None:
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self.layout_fallbacks = 0  # records the configured layout could not format


stats = LogStats()
_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


# -- the trace id on records ---------------------------------------------------------------
def current_tid() -> str:
    pos = trace_position()
    return pos[0] if pos is not None else NO_TRACE


# While a record is being reported and handed to the application's handlers, a second
# integration seeing the same message (a handler forwarding stdlib records to loguru) must
# not report it again, nor a logger the same record object is handed to again (a handler
# calling ``other_logger.handle(record)``). Another stdlib record made meanwhile (a handler
# whose own code logs, a signal handler or finalizer run inside a handler) is reported.
_busy = threading.local()  # .records: the records this thread is handing to handlers


def _handling() -> list[logging.LogRecord]:
    records: list[logging.LogRecord] | None = getattr(_busy, "records", None)
    if records is None:
        records = _busy.records = []
    return records


def reporting() -> bool:
    return bool(getattr(_busy, "records", None))


def build_failed(e: BaseException) -> None:
    """A record that an integration could not turn into a report: counted (here and where
    ``swmp status`` shows it), said once."""
    stats.errors += 1
    _sink.count_unbuilt()
    _warn_once("build", "swmp: cannot build a log record: %r (only counted from now on)", e)


# -- one LOG record --------------------------------------------------------------------------
def write_log(ts_ms: int, body: str, tags: list[str], safe_mode: bool = False) -> None:
    """Write one LOG record with this context's trace position. Never raises."""
    try:
        if safe_mode:
            body = _CREDENTIALS.sub(r"\1***:***@", body)
        lim = limits.log_value_max
        if len(body) > lim:
            body = body[:lim]
        for i, tag in enumerate(tags):  # (argument.N and exception values are unbounded)
            if len(tag) > lim:
                tags[i] = tag[:lim]
        pos = trace_position()
        trace_id, seg_id, span_id, endpoint = pos if pos is not None else ("", "", -1, "")
        # Text that is not valid UTF-8 (lone surrogates, from bytes decoded with
        # "surrogateescape": file names, sys.argv, os.environ) is sent escaped, not lost.
        record = [ts_ms, identity.service, identity.instance, endpoint, "text", body]
        payload = dumps_escaping([*record, trace_id, seg_id, span_id, tags, ""])
    except Exception as e:
        stats.errors += 1
        _sink.count_unbuilt()
        _warn_once("encode", "swmp: cannot encode a log record: %r (only counted from now on)", e)
        return
    if _sink.get_sink().write(LOG, payload):
        stats.written += 1
    else:
        stats.dropped += 1


def level_number(name: str | int) -> int:
    if isinstance(name, int):
        return name
    n = logging.getLevelName(name.upper())
    return n if isinstance(n, int) else logging.WARNING


def checked_formatter(layout: str | None) -> logging.Formatter:
    """A formatter for ``layout``; the default one (reported once) if ``layout`` cannot format
    an ordinary record (a syntax error, a field that records do not have)."""
    if not layout:
        return logging.Formatter("%(message)s")
    try:
        fmt = logging.Formatter(layout, validate=True)
        sample = logging.LogRecord("swmp.check", logging.WARNING, __file__, 1, "check %s", ("x",), None)
        sample.tid = NO_TRACE
        fmt.format(sample)
        return fmt
    except Exception as e:
        log.warning(
            "swmp: SW_AGENT_LOG_REPORTER_LAYOUT=%r cannot format log records (%r); using the default %r",
            layout,
            e,
            DEFAULT_LAYOUT,
        )
        return logging.Formatter(DEFAULT_LAYOUT)


_ABSENT: Any = object()  # (an attribute the record did not have)


def _text(value: object) -> str:
    """``str(value)``, or its ``repr`` when ``__str__`` raises: a message or argument object
    that cannot be printed still leaves a reported record (logging itself prints "--- Logging
    error ---" for it and goes on; the record was dropped and a warning added to that)."""
    try:
        return str(value)
    except Exception:
        try:
            return repr(value)
        except Exception:
            return f"<unprintable {type(value).__name__} object>"


class LogReporter:
    """Turns stdlib log records into LOG records (see ``reporter_proc.records``)."""

    def __init__(
        self,
        level: int | str = logging.WARNING,
        layout: str | None = DEFAULT_LAYOUT,
        formatted: bool = True,
        safe_mode: bool = False,
    ) -> None:
        self.level = level_number(level)
        self.formatted = formatted
        self.safe_mode = safe_mode
        self.formatter = checked_formatter(layout)
        self._fallback = logging.Formatter(DEFAULT_LAYOUT)

    def report(self, record: logging.LogRecord) -> None:
        """Report ``record`` unless it comes from the agent itself or from another process
        (:func:`made_elsewhere`). Never raises."""
        if made_elsewhere(record):
            return
        # The reporter's own records (its thread in thread mode, its process): the transport
        # libraries' (aiokafka's "Unable connect to ...", asyncio's) were reported as the
        # application's, one more record to send for every failure to send.
        if reporter_is_calling():
            return
        name = record.name
        if name.startswith("swmp") and (len(name) == 4 or name[4] == "."):
            return
        if name == "ipc" and str(record.pathname).startswith(_IPC_DIR):
            return
        try:
            body, tags = self.body_and_tags(record)
            ts = int(record.created * 1000) if record.created else time.time_ns() // 1_000_000
        except Exception as e:
            build_failed(e)
            return
        write_log(ts, body, tags, self.safe_mode)

    def body_and_tags(self, record: logging.LogRecord) -> tuple[str, list[str]]:
        tags = ["level", record.levelname, "logger", record.name, "thread", record.threadName or ""]
        if "tid" not in record.__dict__:
            record.tid = current_tid()  # made here: report() leaves the others alone
        if self.formatted:
            return self._format(record), tags
        body = _text(record.msg)
        args = record.args
        if isinstance(args, tuple):
            for i, a in enumerate(args):
                tags += [f"argument.{i}", _text(a)]
        elif isinstance(args, Mapping):
            # log.info("%(a)s", {"a": 1}): the record's args are that dict. The SkyWalking
            # Python agent enumerates it as it does a tuple, so its keys are the arguments:
            # the same tags here, for the queries and alarms written against its logs.
            for i, a in enumerate(args):
                tags += [f"argument.{i}", _text(a)]
        ei = record.exc_info
        # exc_info=True outside an exception gives (None, None, None): no exception, no tag
        # (formatException would make it the text "NoneType: None").
        if ei and not (ei.__class__ is tuple and len(ei) == 3 and ei[0] is None and ei[1] is None):
            tags += ["exception", self.formatter.formatException(ei)]
        return body, tags

    def _format(self, record: logging.LogRecord) -> str:
        # Formatter.format writes onto the record (``message``, ``asctime``, and the traceback
        # text every later handler reuses): the reporter runs before the application's own
        # handlers, which must see the record as the application made it (their own
        # formatException, a filter that drops exc_info).
        d = record.__dict__
        kept = (d.get("exc_text"), d.get("message", _ABSENT), d.get("asctime", _ABSENT))
        try:
            return self.formatter.format(record)
        except Exception:
            stats.layout_fallbacks += 1
            try:
                return self._fallback.format(record)
            except Exception:  # the message itself cannot be formatted (bad args)
                return _text(record.msg)
        finally:
            d["exc_text"] = kept[0]
            for name, old in (("message", kept[1]), ("asctime", kept[2])):
                if old is _ABSENT:
                    d.pop(name, None)
                else:
                    d[name] = old


class SkyWalkingLogHandler(logging.Handler):
    """The reporter as a ``logging.Handler``, for attaching by hand to chosen loggers (the
    agent itself does not use it: it hooks every logger, see the module docstring)."""

    def __init__(
        self,
        level: int | str = logging.WARNING,
        layout: str | None = None,
        formatted: bool = True,
        safe_mode: bool = False,
    ) -> None:
        super().__init__(level_number(level))
        self.reporter = LogReporter(level, layout, formatted, safe_mode)

    def emit(self, record: logging.LogRecord) -> None:
        self.reporter.report(record)


# -- the hook --------------------------------------------------------------------------------
_reporter: LogReporter | None = None
_hooked = ""  # "callHandlers" | "handle"
_HOOK_FILE = os.path.join(getattr(logging, "__path__", [""])[0], "<swmp.instrument.log_reporter hook>")


def _make_hook(reporter: LogReporter | None, check_disabled: bool) -> Any:
    # Without a reporter (SW_AGENT_LOG_REPORTER_ACTIVE=false) the hook only sets record.tid:
    # formatters written for it must not start failing when reporting is switched off.
    level = reporter.level if reporter is not None else 1 << 30
    report = reporter.report if reporter is not None else None

    def make(orig: Any) -> Any:
        def hook(self: logging.Logger, record: logging.LogRecord) -> Any:
            d = record.__dict__
            if "tid" not in d:
                cur = _get_current()  # the common cases inline: no span, an open recorded span
                if cur is None:
                    d["tid"] = NO_TRACE
                elif record.process != _own.pid and record.process is not None:  # made_elsewhere()
                    d["tid"] = NO_TRACE  # another process's record: not this one's trace
                elif cur.__class__ is Span and not cur.end:
                    d["tid"] = cur.segment.trace_id
                else:
                    d["tid"] = current_tid()
            if record.levelno < level or (check_disabled and self.disabled):
                return orig(self, record)
            handling = _handling()
            if handling and any(r is record for r in handling):
                return orig(self, record)
            report(record)  # type: ignore[misc]  # (level is out of reach without a reporter)
            handling.append(record)
            try:
                return orig(self, record)
            finally:
                handling.pop()

        # A handler that fails calls Handler.handleError, which prints the application's call
        # stack from the first frame outside the logging package: the hook's frame stopped
        # that walk, and every "--- Logging error ---" then showed logging's own frames and
        # ours as the caller. Filed under logging's directory, the hook is walked past as
        # logging's own frames are (the name says whose frame it is in any other traceback).
        hook.__code__ = hook.__code__.replace(co_filename=_HOOK_FILE)
        return hook

    return make


def install(config: Config) -> None:
    global _reporter, _hooked
    if _hooked:
        return
    reporter = None
    if config.agent_log_reporter_active:
        reporter = LogReporter(
            config.agent_log_reporter_level,
            config.agent_log_reporter_layout,
            config.agent_log_reporter_formatted,
            config.agent_log_reporter_safe_mode,
        )
    # callHandlers runs after the logger's own level, disabled flag and filters; handle runs
    # before the filters (but a disabled logger still reports nothing).
    _hooked = "handle" if config.agent_log_reporter_ignore_filter else "callHandlers"
    patch(logging.Logger, _hooked, _make_hook(reporter, _hooked == "handle"))
    _reporter = reporter


def uninstall() -> None:
    global _reporter, _hooked
    if _hooked:
        restore(logging.Logger, _hooked)
    _reporter = None
    _hooked = ""


def active_reporter() -> LogReporter | None:
    return _reporter
