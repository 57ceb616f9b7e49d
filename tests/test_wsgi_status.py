"""The ``start_response`` a traced WSGI application gets (and the ``send`` of an ASGI one)
records the status as before.

With the native span core it is ``swmp._spancore.status_recorder`` (swmp/_native/status.c):
the common status lines are tagged in C, anything else by the Python code. Checked here: for
ordinary and odd status lines, ``exc_info`` given or not, by position or keyword, and a tag
length limit below the status text, the native recorder and the Python one leave the same
tags and error flag on the span and hand the server the same arguments. The same for the ASGI
``send`` (``status_sender``) on start, body and malformed messages.
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


class _Dict(dict):  # type: ignore[type-arg]
    pass


MESSAGES: list[Any] = [
    {"type": "http.response.start", "status": 200, "headers": []},
    {"type": "http.response.start", "status": 404},
    {"type": "http.response.start", "status": 503},
    {"type": "http.response.start", "status": "201"},
    {"type": "http.response.start", "status": 99},
    {"type": "http.response.start", "status": 600},
    {"type": "http.response.start", "status": True},
    {"type": "http.response.start", "status": 2**70},
    {"type": "http.response.start"},
    {"type": "http.response.body", "body": b"x"},
    {"type": b"http.response.start", "status": 200},
    {"status": 200},
    _Dict(type="http.response.start", status=202),
    ["not", "a", "dict"],
]


def _send_run(sender: Any, message: Any, call: str) -> tuple[Any, Any, Any]:
    got: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def server(*args: Any, **kwargs: Any) -> str:
        got.append((args, kwargs))
        return "awaitable"

    with new_entry_span("/x", None, Component.PYTHON, Layer.HTTP) as span:
        span.tags = ["http.method", "GET"]
        send = sender(span, server)
        if call == "plain":
            assert send(message) == "awaitable"
        elif call == "keyword":
            send(message=message)
        else:
            with pytest.raises(TypeError):
                send()
        return list(span.tags), span.is_error, got


@pytest.mark.skipif(not span_module.NATIVE, reason="the native span core is not built")
@pytest.mark.parametrize("limit", [2048, 2])
def test_native_and_python_asgi_senders_agree(limit: int) -> None:
    from swmp import _spancore
    from swmp.instrument import asgi

    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}, agent_tag_value_max_length=limit))
    try:
        for message in MESSAGES:
            for call in ("plain", "keyword", "wrong"):
                native = _send_run(_spancore.status_sender, message, call)
                python = _send_run(asgi._py_status_sender, message, call)
                assert native == python, (message, call)
        tags, error, _ = _send_run(_spancore.status_sender, MESSAGES[2], "plain")
        assert error and tags[-1] == ("503" if limit > 3 else "50")
        server = object()
        from swmp.tracing.span import NOOP

        assert _spancore.status_sender(NOOP, server) is server  # nothing recorded: the server's own
        assert asgi._status_sender is _spancore.status_sender
    finally:
        tracing.configure(load({}))
        _sink.set_sink(None)
