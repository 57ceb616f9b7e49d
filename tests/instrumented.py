"""What the tests of instrumented libraries share: a memory sink with every instrumentation
installed, the module's own settings on top of the defaults."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from swmp import _sink, instrument, tracing
from swmp.config import load


@contextlib.contextmanager
def instrumented(**settings: Any) -> Iterator[tuple[_sink.MemorySink, dict[str, str]]]:
    """A memory sink, tracing configured with ``settings`` (the log reporter off) and its
    counters at zero, every instrumentation installed; yields the sink and ``install_all``'s
    status of each. Uninstalled, and no sink, afterwards."""
    memory = _sink.MemorySink()
    _sink.set_sink(memory)
    cfg = load({}, agent_log_reporter_active=False, **settings)
    tracing.configure(cfg)
    tracing.stats.reset()
    status = instrument.install_all(cfg)
    try:
        yield memory, status
    finally:
        instrument.uninstall_all()
        _sink.set_sink(None)
