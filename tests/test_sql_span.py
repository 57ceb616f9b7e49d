"""The native ``sql_span`` (swmp/_native/sql.c) makes the span the Python
``swmp.instrument._datastore._py_sql_span`` makes, for every statement, parameter and
setting: each call runs through both, inside the same kind of trace, and the spans' class,
fields and tags are compared."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import _datastore as ds
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, Span, current_span, native_core
from tests.native_forms import recording

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


class Composed:
    """Neither str nor bytes: ``text`` goes through ``str``."""

    def __str__(self) -> str:
        return "SELECT composed"


class Text(str):
    pass


class BadParam:
    def __str__(self) -> str:
        raise ValueError("no text")


def _shape(span: Any) -> Any:
    if span.__class__ is not Span:
        return span.__class__.__name__
    return (span.op, span.peer, span.component, span.layer, span.kind, list(span.tags), span.parent_id)


def _in_trace(make: Callable[[], Any], inside: str) -> Any:
    with new_entry_span("/request"):
        if inside == "exit":  # an exit span inside an exit span: not recorded
            with new_exit_span("outer", "db:1", 1, 1):
                span = make()
        else:
            span = make()
        shape = _shape(span)
        span.__enter__()
        span.__exit__(None, None, None)
    return shape


def _both(*args: Any, inside: str = "entry") -> tuple[Any, Any]:
    native = _in_trace(lambda: native_core.sql_span(*args), inside)
    python = _in_trace(lambda: ds._py_sql_span(*args), inside)
    return native, python


STATEMENTS: list[Any] = [
    "SELECT 1",
    b"SELECT \xff bytes",
    bytearray(b"SELECT 2"),
    Composed(),
    Text("SELECT 3"),
    "S" * 3000,
    "",
]
PARAMS: list[Any] = [None, (1, "a"), [2, None], {"k": 3}, 5, (BadParam(),), [(1, 2), (3, 4)]]


@pytest.mark.parametrize("params_max", [0, 4, 100])
def test_every_statement_and_parameter_gives_the_python_span(sink: _sink.MemorySink, params_max: int) -> None:
    ds.settings.params_max = params_max
    for statement, params, many in itertools.product(STATEMENTS, PARAMS, (False, True)):
        if many and params is not None and not isinstance(params, (list, tuple)):
            continue  # executemany's rows: the wrappers pass a list
        args = ("PostgreSQL/psycopg2/execute", "db:5432", 22, "PostgreSQL", "app", statement, params, many)
        native, python = _both(*args)
        assert native == python, (statement, params, many)
    assert current_span.get() is None


def test_short_arguments_keywords_limits_and_spans_not_recorded(sink: _sink.MemorySink) -> None:
    short = ("Mysql/PyMsql/execute", "db:3306", 5012, "mysql", "i" * 50, "SELECT 1")
    assert _both(*short) == _both(*short)
    native, python = _both(*short)
    assert native == python and native[5][:2] == ["db.type", "mysql"]
    assert _both(*short, None) == _both(*short, None)
    native = _in_trace(lambda: native_core.sql_span(*short[:5], statement="SELECT kw"), "entry")
    python = _in_trace(lambda: ds._py_sql_span(*short[:5], statement="SELECT kw"), "entry")
    assert native == python
    saved = limits.tag_value_max
    limits.tag_value_max = 4  # the statement clipped by Span.tag, not set in one list
    try:
        native, python = _both(*short)
        assert native == python and native[5][-1] != "SELECT 1"
    finally:
        limits.tag_value_max = saved
    native, python = _both(*short, inside="exit")  # inside an exit span: not recorded
    assert native == python and isinstance(native, str)
    # Outside any trace: a trace of its own in both (as new_exit_span makes one).
    native_span, python_span = native_core.sql_span(*short), ds._py_sql_span(*short)
    assert _shape(native_span) == _shape(python_span)
    for span in (native_span, python_span):
        span.__enter__()
        span.__exit__(None, None, None)
    with pytest.raises(TypeError):
        native_core.sql_span("op")  # handed over: the Python function's own error


def test_the_datastore_wrappers_use_it(sink: _sink.MemorySink) -> None:
    assert ds.sql_span is native_core.sql_span


def test_an_error_that_is_not_an_exception_reaches_the_caller(sink: _sink.MemorySink) -> None:
    class Stop(BaseException):
        pass

    class Raising:
        def __str__(self) -> str:
            raise Stop

    ds.settings.params_max = 10
    for fn in (native_core.sql_span, ds._py_sql_span):
        with new_entry_span("/request"), pytest.raises(Stop):
            fn("op", "db:1", 22, "PostgreSQL", "app", "SELECT 1", (Raising(),))
    assert current_span.get() is None
