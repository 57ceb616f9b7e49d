"""The response iterable a traced WSGI application's result is wrapped in behaves as before.

With the native span core it is ``swmp._spancore.wsgi_body`` (swmp/_native/body.c), else
``wsgi._Body``. Checked here, both side by side: the chunks the server gets, the result's
own ``close`` called once, the span finished on ``close`` whatever the result's ``close``
does, an error while iterating (or from ``iter()`` itself) marking the span and reaching the
server unchanged, a result without ``close``, iterating again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from swmp import _sink, tracing
from swmp.config import load
from swmp.instrument import wsgi
from swmp.tracing import Component, Layer
from swmp.tracing import span as span_module
from swmp.tracing.context import new_entry_span


class Result:
    """A response iterable: ``fail_at`` raises while iterating, ``close_error`` from close()."""

    def __init__(self, fail_at: int = -1, close_error: bool = False, closable: bool = True) -> None:
        self.fail_at = fail_at
        self.close_error = close_error
        self.closed = 0
        if not closable:
            self.close = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[bytes]:
        for i in range(3):
            if i == self.fail_at:
                raise ValueError(f"chunk {i}")
            yield b"chunk%d" % i

    def close(self) -> None:
        self.closed += 1
        if self.close_error:
            raise OSError("close failed")


class NotIterable:
    def close(self) -> None:
        pass


def _serve(make: Any, result: Any, twice: bool = False) -> tuple[Any, ...]:
    """What a server sees and what the span says, for one wrapper."""
    span = new_entry_span("/x", None, Component.PYTHON, Layer.HTTP)
    body = make(result, span)
    chunks: list[bytes] = []
    raised: Any = None
    try:
        for _ in range(2 if twice else 1):
            chunks.extend(body)
    except Exception as e:
        raised = (type(e), str(e))
    finished_before_close = bool(span.end)
    closed: Any = None
    try:
        body.close()
    except Exception as e:
        closed = (type(e), str(e))
    logs = [dict(zip(entry[1][::2], entry[1][1::2], strict=True)) for entry in span.logs]
    kinds = [log.get("error.kind") for log in logs]
    return (
        chunks,
        raised,
        closed,
        finished_before_close,
        bool(span.end),
        span.is_error,
        kinds,
        getattr(result, "closed", None),
    )


CASES = {
    "whole": Result,
    "fails": lambda: Result(fail_at=1),
    "close fails": lambda: Result(close_error=True),
    "no close": lambda: Result(closable=False),
    "not iterable": NotIterable,
    "generator": lambda: (b"g%d" % i for i in range(2)),
}


@pytest.mark.skipif(not span_module.NATIVE, reason="the native span core is not built")
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("twice", [False, True])
def test_native_and_python_bodies_agree(case: str, twice: bool) -> None:
    sink = _sink.MemorySink()
    _sink.set_sink(sink)
    tracing.configure(load({}))
    try:
        native = _serve(span_module.native_core.wsgi_body, CASES[case](), twice)
        python = _serve(wsgi._Body, CASES[case](), twice)
        assert native == python
        assert native[4]  # the span finished on close
        assert len(sink.records) == 2
    finally:
        _sink.set_sink(None)


def test_the_body_in_use_is_the_native_one_when_built() -> None:
    expected = span_module.native_core.wsgi_body if span_module.NATIVE else wsgi._Body
    assert wsgi._make_body is expected
