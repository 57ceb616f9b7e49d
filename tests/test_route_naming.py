"""``name_request``: the native rename (swmp/_native/route.c) does what the Python one
(``swmp.instrument._route._py_name_request``) does, in every state the request can be in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from swmp import tracing
from swmp.instrument import _route
from swmp.tracing import Component, Layer
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.span import NATIVE, native_core

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")

FORMS: dict[str, Callable[[Any], None]] = {}
if NATIVE:
    FORMS = {"native": native_core.name_request, "python": _route._py_name_request}


def _entry() -> Any:
    return new_entry_span("/users/7", None, Component.PYTHON, Layer.HTTP)


def _scenario(name: Callable[[Any], None], case: str) -> Any:
    """The span names and cached-header state after ``name`` ran in the state ``case``."""
    entry = _entry()
    with entry:
        if case == "current":
            name("/users/{id}")
        elif case == "injected":  # sw8 already sent: its cached endpoint must go
            entry.inject()
            assert entry.segment.encoded is not None
            name("/users/{id}")
        elif case == "below an exit span":
            with new_exit_span("SELECT", "db:5432", Component.PYTHON, Layer.DATABASE):
                name("/users/{id}")
        elif case == "empty":
            name("")
        elif case == "not text":
            name(None)
        elif case == "twice":
            name("/a")
            name("/b")
        after = (entry.op, entry.segment.encoded is None, entry.inject()["sw8"].split("-")[6])
    return after


CASES = ["current", "injected", "below an exit span", "empty", "not text", "twice"]


@pytest.mark.parametrize("case", CASES)
def test_native_and_python_rename_alike(trace_sink: Any, case: str) -> None:
    native = _scenario(FORMS["native"], case)
    python = _scenario(FORMS["python"], case)
    assert native == python
    if case in ("current", "injected", "below an exit span"):
        assert native[0] == "/users/{id}"


def test_outside_a_request_and_after_it_ended(trace_sink: Any) -> None:
    for name in FORMS.values():
        name("/nowhere")  # nothing current: nothing to do, nothing raised
        entry = _entry()
        with entry:
            pass
        token = tracing.span.current_span.set(entry)  # an ended span still current (a late hook)
        try:
            name("/late")
        finally:
            tracing.span.current_span.reset(token)
        assert entry.op == "/users/7"


def test_a_profiling_task_waiting_for_the_endpoint_is_asked(
    trace_sink: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swmp.tracing import context

    asked: dict[str, list[str]] = {}
    for form, name in FORMS.items():
        seen: list[str] = asked.setdefault(form, [])
        monkeypatch.setattr(context._gate, "by_endpoint", {"/users/{id}": object()})
        monkeypatch.setattr(context._gate, "consider", lambda span, seen=seen: seen.append(span.op))
        with _entry():
            name("/users/{id}")
        monkeypatch.setattr(context._gate, "consider", lambda span: 1 / 0)  # its failure is not the app's
        with _entry():
            if form == "native":
                name("/users/{id}")
        monkeypatch.undo()
    assert asked == {"native": ["/users/{id}"], "python": ["/users/{id}"]}
