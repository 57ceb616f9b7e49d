"""swmp: an Apache SkyWalking agent for prefork Python servers.

The public API is what ``__all__`` lists (kept small on purpose and enforced by a test);
everything else lives in submodules and may change.
"""

from swmp.api import (
    capture,
    current_span,
    entry_span,
    error,
    exit_span,
    extract,
    get_correlation,
    inject,
    local_span,
    log,
    set_correlation,
    start,
    stop,
    tag,
    trace,
    trace_id,
)
from swmp.config import Config
from swmp.meters import Counter, CounterMode, Gauge, Histogram
from swmp.tracing.constants import Component, Layer

__all__ = [
    "Component",
    "Config",
    "Counter",
    "CounterMode",
    "Gauge",
    "Histogram",
    "Layer",
    "capture",
    "current_span",
    "entry_span",
    "error",
    "exit_span",
    "extract",
    "get_correlation",
    "inject",
    "local_span",
    "log",
    "set_correlation",
    "start",
    "stop",
    "tag",
    "trace",
    "trace_id",
]
