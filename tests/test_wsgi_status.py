"""The ``start_response`` a traced WSGI application gets records the status as before.

With the native span core it is ``swmp._spancore.status_recorder`` (swmp/_native/status.c):
the common status lines are tagged in C, anything else by the Python code. Checked here: for
ordinary and odd status lines, ``exc_info`` given or not, by position or keyword, and a tag
length limit below the status text, the native recorder and the Python one leave the same
tags and error flag on the span and hand the server the same arguments.
"""

from __future__ import annotations

from typing import Any

import pytest

from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import wsgi
from swmp.tracing import Component, Layer
from swmp.tracing import span as span_module
from swmp.tracing.context import new_entry_span

STATUSES = [
    "200 OK",
    "201 Created",
    "301 Moved",
    "404 Not Found",
    "500 Internal Server Error",
    "599 Last",
    "600 Beyond",
    "099 Below",
    "200",
    "20",
    "",
    "abc Nope",
    "\uff12\uff10\uff10 OK",  # digits, not ASCII ones (fullwidth)
    " 200 OK",
]
EXC_INFO = (ValueError, ValueError("x"), None)


def _run(recorder: Any, status: Any, call: str) -> tuple[Any, Any, Any]:
    """Tags, error flag and what the server's start_response got, for one call form."""
    got: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def server(*args: Any, **kwargs: Any) -> str:
        got.append((args, kwargs))
        return "write"

    with new_entry_span("/x", None, Component.PYTHON, Layer.HTTP) as span:
        span.tags = ["http.method", "GET"]
        start = recorder(span, server)
        if call == "plain":
            assert start(status, [("a", "b")]) == "write"
        elif call == "none":
            start(status, [], None)
        elif call == "exc":
            start(status, [], EXC_INFO)
        elif call == "keyword":
            start(status, [], exc_info=EXC_INFO)
        elif call == "all keywords":
            start(headers=[], status=status)
        else:  # a wrong call: the same TypeError, nothing tagged
            with pytest.raises(TypeError):
                start(status)
        return list(span.tags), span.is_error, got


@pytest.mark.skipif(not span_module.NATIVE, reason="the native span core is not built")
@pytest.mark.parametrize("limit", [2048, 2])
def test_native_and_python_recorders_agree(limit: int) -> None:
    from swmp import _spancore

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}, agent_tag_value_max_length=limit))
    try:
        for status in [*STATUSES, None, 200]:
            for call in ("plain", "none", "exc", "keyword", "all keywords", "wrong"):
                native = _run(_spancore.status_recorder, status, call)
                python = _run(wsgi._py_status_recorder, status, call)
                assert native == python, (status, call)
        tags, error, got = _run(_spancore.status_recorder, "503 Busy", "none")
        assert tags[-2:] == (["http.status_code", "503"] if limit > 3 else ["http.status_code", "50"])
        assert error and got == [(("503 Busy", []), {})]
    finally:
        tracing.configure(load({}))
        _sink.set_sink(None)


def test_the_recorder_in_use_is_the_native_one_when_built() -> None:
    expected = span_module.native_core.status_recorder if span_module.NATIVE else wsgi._py_status_recorder
    assert wsgi._status_recorder is expected
