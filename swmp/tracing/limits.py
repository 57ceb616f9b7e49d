"""Run-time knobs of the tracing core and the counters it keeps.

Both are plain objects with ``__slots__`` read on the hot path; ``swmp.tracing.configure``
fills :data:`limits` from the Config. Counters are approximate under threads (``+=`` is
not atomic) and exact in the single-threaded case; they are for "how much did we drop",
not accounting.
"""

from __future__ import annotations

import traceback
from types import TracebackType


class Limits:
    __slots__ = (
        "correlation_max_elements",
        "correlation_max_value_length",
        "exception_depth",
        "log_value_max",
        "span_limit",
        "tag_value_max",
    )

    def __init__(self) -> None:
        self.span_limit = 300
        self.tag_value_max = 1024
        self.log_value_max = 8192
        self.exception_depth = 10
        self.correlation_max_elements = 3
        self.correlation_max_value_length = 128


class Stats:
    """What the tracing core dropped, truncated or skipped since start (or since reset)."""

    __slots__ = (
        "ignored",
        "sampled_out",
        "segments_dropped",
        "segments_written",
        "serialize_errors",
        "spans_lost",
        "spans_over_limit",
        "values_truncated",
    )

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.segments_written = 0
        self.segments_dropped = 0  # the sink (ring) refused the record: full or oversize
        self.serialize_errors = 0
        self.spans_over_limit = 0
        self.spans_lost = 0  # finished after their segment was emitted (a cross-thread race)
        self.values_truncated = 0
        self.sampled_out = 0
        self.ignored = 0

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


limits = Limits()
stats = Stats()


def format_stack(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str:
    """The exception as text with the innermost ``exception_depth`` frames of its stack.

    Innermost, not outermost (``traceback``'s positive ``limit``): the outer frames of a
    request are the server's and the framework's, the same every time (under FastAPI the
    handler is some twenty frames deep), while the inner ones say where it was raised.
    """
    depth = limits.exception_depth
    return "".join(traceback.format_exception(kind, exc, tb, limit=-depth if depth > 0 else 0))
