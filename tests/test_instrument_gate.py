"""``swmp.instrument._gate.gated``: the original outside a trace, the traced code inside one.

Both forms are checked the same way: the native ``swmp._spancore.Gate`` (the normal install
builds it) and the Python function used without it. A gate must behave exactly like the
method it replaces: arguments and keywords passed on untouched, return values and
exceptions the callee's own, bound like a function, with the attributes the patcher and
``inspect`` read.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from swmp.instrument import _gate
from swmp.instrument._patch import ORIGINAL, patch, restore
from swmp.tracing.span import NATIVE, current_span


@pytest.fixture(params=["native", "python"])
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        if not NATIVE:
            pytest.skip("the native core is not built")
        assert _gate.is_native()
    else:
        monkeypatch.setattr(_gate, "_Gate", None)
    return str(request.param)


@pytest.fixture
def in_span() -> Iterator[None]:
    token = current_span.set(object())  # any current span: the gate only asks "none or some"
    try:
        yield
    finally:
        current_span.reset(token)


class Client:
    def call(self, a: Any, b: Any = 2, *rest: Any, **kw: Any) -> tuple[Any, ...]:
        """The original."""
        return ("orig", self, a, b, rest, kw)

    async def acall(self, a: Any) -> tuple[str, Any]:
        return ("orig", a)


def _patched(seen: list[tuple[Any, ...]]) -> None:
    def make(orig: Any) -> Any:
        def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append((self, args, kwargs))
            return ("traced", orig(self, *args, **kwargs))

        return _gate.gated(orig, traced)

    patch(Client, "call", make)


@pytest.fixture
def seen(form: str) -> Iterator[list[tuple[Any, ...]]]:
    calls: list[tuple[Any, ...]] = []
    _patched(calls)
    try:
        yield calls
    finally:
        restore(Client, "call")
    assert "__swmp_original__" not in Client.__dict__["call"].__dict__


def test_outside_a_trace_the_original_gets_the_callers_arguments(seen: list[Any]) -> None:
    c = Client()
    assert c.call(1) == ("orig", c, 1, 2, (), {})
    assert c.call(1, 3, 4, 5, x=6) == ("orig", c, 1, 3, (4, 5), {"x": 6})
    assert c.call(a=1, b=7) == ("orig", c, 1, 7, (), {})
    assert Client.call(c, 1) == ("orig", c, 1, 2, (), {})
    assert seen == []


@pytest.mark.usefixtures("in_span")
def test_inside_a_trace_the_traced_code_gets_the_same_arguments(seen: list[Any]) -> None:
    c = Client()
    assert c.call(1, 3, 4, x=6) == ("traced", ("orig", c, 1, 3, (4,), {"x": 6}))
    assert Client.call(c, a=9) == ("traced", ("orig", c, 9, 2, (), {}))
    assert seen == [(c, (1, 3, 4), {"x": 6}), (c, (), {"a": 9})]


def test_exceptions_reach_the_caller_unchanged(form: str) -> None:
    boom = ValueError("the driver's own")

    def orig(*args: Any) -> Any:
        raise boom

    def traced(*args: Any) -> Any:
        raise boom

    gate = _gate.gated(orig, traced)
    with pytest.raises(ValueError) as outside:
        gate(1)
    token = current_span.set(object())
    try:
        with pytest.raises(ValueError) as inside:
            gate(1)
    finally:
        current_span.reset(token)
    assert outside.value is boom and inside.value is boom
    with pytest.raises(TypeError):  # a wrong call fails as the original's would
        _gate.gated(Client.call, Client.call)(Client())


def test_it_binds_and_reads_like_the_function_it_replaces(seen: list[Any]) -> None:
    original = Client.__dict__["call"].__wrapped__
    gate = Client.__dict__["call"]
    c = Client()
    assert Client.call is gate  # from the class: itself, as a function is
    assert c.call.__self__ is c and c.call.__func__ is gate  # from an instance: a bound method
    assert getattr(gate, ORIGINAL) is original
    assert gate.__name__ == "call" and gate.__qualname__ == "Client.call"
    assert gate.__doc__ == "The original." and gate.__module__ == __name__
    assert inspect.signature(gate) == inspect.signature(original)
    assert callable(gate)


def test_an_async_original_gives_its_own_coroutine_outside_a_trace(form: str) -> None:
    async def traced(self: Any, a: Any) -> Any:
        return ("traced", a)

    gate = _gate.gated(Client.acall, traced)
    c = Client()
    coro = gate(c, 1)
    assert inspect.iscoroutine(coro) and coro.cr_code is Client.acall.__code__
    assert asyncio.run(coro) == ("orig", 1)

    async def inside() -> Any:
        token = current_span.set(object())
        try:
            return await gate(c, 2)
        finally:
            current_span.reset(token)

    assert asyncio.run(inside()) == ("traced", 2)


def test_a_native_gate_adds_no_python_frame_outside_a_trace(seen: list[Any], form: str) -> None:
    """What makes it cheap: outside a trace the only Python frame is the original's."""
    frames: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            frames.append(frame.f_code.co_name)

    c = Client()
    sys.setprofile(profile)
    try:
        c.call(1, x=2)
    finally:
        sys.setprofile(None)
    expected = ["call"] if form == "native" else ["gate", "call"]
    assert frames == expected


@pytest.mark.skipif(not NATIVE, reason="the native core is not built")
def test_native_gate_checks_what_it_is_given_and_is_collected() -> None:
    from swmp import _spancore

    with pytest.raises(TypeError):
        _spancore.Gate(object(), print, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _spancore.Gate(current_span, 1, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _spancore.Gate(current_span, print)  # type: ignore[call-arg]
    gate: Any = _spancore.Gate(current_span, len, print)
    assert "swmp gate of <built-in function len>" in repr(gate)
    assert gate.orig is len and gate.traced is print
    assert gate("abc") == 3

    class Payload:
        pass

    payload = Payload()
    gone = weakref.finalize(payload, lambda: None)
    gate.payload = payload
    gate.self = gate  # a cycle through the gate's __dict__
    del gate, payload
    gc.collect()
    assert not gone.alive


def test_a_gate_is_named_like_its_original(form: str) -> None:
    def orig(x: int) -> int:
        """Doubles."""
        return 2 * x

    gate = _gate.gated(orig, orig)
    assert gate.__wrapped__ is orig and gate.__doc__ == "Doubles." and gate(4) == 8  # type: ignore[attr-defined]
    assert gate.__name__ == "orig" and gate.__qualname__ == orig.__qualname__
    functools.update_wrapper(gate, Client.call)  # the patcher does it again: allowed
    assert gate.__name__ == "call"
    c_method = _gate.gated(dict.get, dict.get)  # a C method descriptor as the original
    assert c_method.__name__ == "get" and c_method({"a": 1}, "a") == 1


def test_passes_sends_the_call_to_the_original_inside_a_trace(form: str, in_span: None) -> None:
    """``passes`` is asked only while a span is current, with the call's own arguments; true
    (or an error of its own) means the original, false the traced code."""
    asked: list[tuple[Any, ...]] = []
    answers: list[Any] = []

    def passes(*args: Any, **kwargs: Any) -> Any:
        asked.append((args, kwargs))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def orig(a: Any, *, k: Any = None) -> tuple[str, Any, Any]:
        return ("orig", a, k)

    def traced(a: Any, *, k: Any = None) -> tuple[str, Any, Any]:
        return ("traced", a, k)

    gate = _gate.gated(orig, traced, passes)
    answers[:] = [True, False, 0, "yes", ValueError("undecided")]
    assert gate(1, k=2) == ("orig", 1, 2)
    assert gate(3) == ("traced", 3, None)
    assert gate(4) == ("traced", 4, None)
    assert gate(5, k=6) == ("orig", 5, 6)
    assert gate(7) == ("orig", 7, None)  # the predicate's error is not the caller's
    assert asked == [((1,), {"k": 2}), ((3,), {}), ((4,), {}), ((5,), {"k": 6}), ((7,), {})]
    assert sys.exc_info() == (None, None, None)


def test_passes_is_not_asked_outside_a_trace(form: str) -> None:
    def passes(*args: Any) -> bool:
        raise AssertionError("asked outside a trace")

    gate = _gate.gated(lambda x: ("orig", x), lambda x: ("traced", x), passes)
    assert gate(1) == ("orig", 1)


@pytest.mark.skipif(not NATIVE, reason="the native core is not built")
def test_native_gate_refuses_a_passes_that_cannot_be_called() -> None:
    from swmp import _spancore

    with pytest.raises(TypeError):
        _spancore.Gate(current_span, print, print, 3)  # type: ignore[call-arg]
    gate: Any = _spancore.Gate(current_span, len, print, None)  # None: no predicate
    assert gate("ab") == 2


def test_a_keyboard_interrupt_in_passes_reaches_the_caller(form: str, in_span: None) -> None:
    """Only the predicate's own errors are taken as "undecided"; a KeyboardInterrupt or
    SystemExit arriving in it is the process's, raised in both forms."""

    def passes(*args: Any) -> bool:
        raise KeyboardInterrupt

    gate = _gate.gated(lambda x: ("orig", x), lambda x: ("traced", x), passes)
    with pytest.raises(KeyboardInterrupt):
        gate(1)


def test_a_gate_of_an_async_original_answers_as_one(form: str) -> None:
    """What decides sync or async behaviour elsewhere (asyncio.iscoroutinefunction, and with
    the native gate inspect's checks, its signature, mock.create_autospec) sees a gate of a
    coroutine or async generator function as the original."""
    from unittest import mock

    class Client:
        async def send(self, topic: str, value: Any = None, *, key: Any = None) -> str:
            return topic

        async def stream(self, query: str) -> Any:
            yield query

        def plain(self, x: int) -> int:
            return x

    for name in ("send", "stream", "plain"):
        orig = Client.__dict__[name]
        setattr(Client, name, _gate.gated(orig, orig))
    assert asyncio.iscoroutinefunction(Client.send) and asyncio.iscoroutinefunction(Client().send)
    assert not asyncio.iscoroutinefunction(Client.plain)
    if form == "native":
        assert inspect.iscoroutinefunction(Client.send) and inspect.iscoroutinefunction(Client().send)
        assert inspect.isasyncgenfunction(Client.stream) and not inspect.iscoroutinefunction(Client.stream)
        unbound = inspect.signature(Client.__dict__["send"].__wrapped__)
        assert inspect.signature(Client.send) == unbound
        assert list(inspect.signature(Client().send).parameters) == ["topic", "value", "key"]
        assert isinstance(mock.create_autospec(Client, instance=True).send, mock.AsyncMock)
    assert asyncio.run(Client().send("t")) == "t"  # and it still runs as itself
