"""The lazy awaitable of swmp/_native/within.c, made by the async data-store calls
(``SqlCall`` and ``CacheCall`` with ``awaiting``) and by ``AwaitingCall`` (aiormq's consumer
callbacks), behaves as the Python ``async def`` wrappers it replaces:
the same calls reach the client, in the same span, the same results and exceptions reach
the caller, the same segments are recorded. And as coroutines do: nothing happens until the
call is awaited, a call never awaited makes no span, a task made of it can be cancelled
before it starts or while it waits, ``throw()`` and ``close()`` reach the client's
coroutine.

Each case runs through the wrapper the instrumentation installs (native) and the one it
installs without the native core (Python), on clients shaped like redis.asyncio's and
aiomysql's that record what they are given, and aiormq-shaped channels and messages. The real
clients against the real servers: test_instrument_cache.py, test_instrument_mysql.py and
test_instrument_mq.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from swmp import _sink
from swmp.instrument import _cache_span
from swmp.instrument import _datastore as ds
from swmp.instrument import aiomysql as aiomysql_instr
from swmp.instrument import aiormq as aiormq_instr
from swmp.instrument import psycopg as psycopg_instr
from swmp.instrument import redis as redis_instr
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.limits import limits
from swmp.tracing.span import NATIVE, current_span
from tests.native_forms import acall_in, compare_forms, in_place, producer_sw8, recording, segments

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def sink() -> Iterator[_sink.MemorySink]:
    with recording() as memory:
        yield memory


def _seen() -> Any:
    span = current_span.get()
    return None if span is None else span.op


async def _reply(outcome: str, value: Any) -> Any:
    """The client's round trip: it waits once, then answers as asked."""
    await asyncio.sleep(0)
    if outcome == "FAIL":
        raise ValueError("server says no")
    if outcome == "INTERRUPT":
        raise KeyboardInterrupt
    if outcome == "SLOW":
        await asyncio.sleep(10)
    return value


class Pool:
    def __init__(self) -> None:
        self.connection_kwargs = {"host": "cache.local", "port": 6380, "db": 2}


class AsyncRedis:
    """redis.asyncio's shape: ``async def execute_command(*args, **options)``."""

    def __init__(self) -> None:
        self.connection_pool = Pool()
        self.calls: list[Any] = []

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.calls.append((args, options, _seen()))
        return await _reply(str(args[0]) if args else "", ("reply", args))


class Connection:
    """aiomysql's shape: ``db`` a property, the address as attributes."""

    host = "db.local"
    port = 3306
    unix_socket = None

    def __init__(self, db: Any = "shop") -> None:
        self._db = db

    @property
    def db(self) -> Any:
        return self._db


class AsyncCursor:
    """aiomysql's shape: ``connection`` a property over ``_connection``."""

    def __init__(self, conn: Any) -> None:
        self._connection = conn
        self.calls: list[Any] = []

    @property
    def connection(self) -> Any:
        return self._connection

    async def execute(self, query: Any, args: Any = None) -> Any:
        self.calls.append((query, args, _seen()))
        return await _reply(query if isinstance(query, str) else "", ("rows", query))


class PgConnection:
    """psycopg's shape as its ``_where`` reads it: ``pgconn`` and ``info``."""

    def __init__(self) -> None:
        self.pgconn = object()
        self.info = SimpleNamespace(host="pg.local", port=5432, dbname="shop")


class PgAsyncCursor:
    """psycopg's ``AsyncCursor`` shape: ``execute(query, params=None, *, prepare=None, binary=None)``."""

    def __init__(self) -> None:
        self._conn = PgConnection()
        self.calls: list[Any] = []

    async def execute(
        self, query: Any, params: Any = None, *, prepare: Any = None, binary: Any = None
    ) -> Any:
        self.calls.append((query, params, prepare, binary, _seen()))
        return await _reply(query if isinstance(query, str) else "", self)


def _forms(make: Callable[[], Any]) -> tuple[Any, Any]:
    """(native, Python) wrappers, the Python one made as without the native core."""
    native = make()
    saved = _cache_span._CacheCall, ds._SqlCall
    _cache_span._CacheCall = ds._SqlCall = None
    try:
        python = make()
    finally:
        _cache_span._CacheCall, ds._SqlCall = saved
    return native, python


def _redis_forms() -> tuple[Any, Any]:
    return _forms(lambda: redis_instr._acommand(AsyncRedis.execute_command))


def _mysql_forms() -> tuple[Any, Any]:
    return _forms(lambda: aiomysql_instr.method("execute")(AsyncCursor.execute))


REDIS_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("GET", "user:1"), {"keys": ["user:1"]}),
    (("SET", "user:1", "v"), {}),
    (("PING",), {}),
    (("GET", b"bytes-key"), {}),
    (("GET", "k" * 3000), {}),
    (("FAIL", "k"), {}),
    (("INTERRUPT",), {}),
    ((), {}),
]
MYSQL_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("SELECT 1",), {}),
    (("SELECT %s", (1,)), {}),
    (("SELECT 1", ()), {}),
    (("SELECT %s",), {"args": (3,)}),
    ((b"SELECT bytes",), {}),
    (("FAIL", (1,)), {}),
    (("INTERRUPT",), {}),
    (("x" * 5000,), {}),
]


@pytest.mark.parametrize("collect_keys", [True, False])
@pytest.mark.parametrize("tag_limit", [2048, 4])
def test_redis_asyncio_command_matches_the_python_form(
    sink: _sink.MemorySink, collect_keys: bool, tag_limit: int
) -> None:
    ds.settings.collect_keys = collect_keys
    limits.tag_value_max = tag_limit
    native, python = _redis_forms()
    compare_forms(native, python, AsyncRedis, REDIS_CALLS, sink, acall_in)


PSYCOPG_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("SELECT 1",), {}),
    (("SELECT %s", (1,)), {}),
    (("SELECT %s", (1,)), {"prepare": True}),  # AsyncConnection.execute's call: native
    (("SELECT %s",), {"params": (2,)}),
    (("SELECT 1", None), {"binary": True}),
    ((b"SELECT bytes",), {}),
    (("FAIL", (1,)), {}),
    (("INTERRUPT",), {}),
]


@pytest.mark.parametrize("params_max", [0, 8])
def test_psycopg_async_execute_matches_the_python_form(sink: _sink.MemorySink, params_max: int) -> None:
    ds.settings.params_max = params_max
    native, python = _forms(lambda: psycopg_instr._aexecute(PgAsyncCursor.execute))
    # The cursor itself is what execute returns: compared by the calls it saw.
    compare_forms(native, python, PgAsyncCursor, PSYCOPG_CALLS, sink, _run_calls)


def test_psycopg_async_execute_runs_in_c(sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch) -> None:
    spans: list[Any] = []
    real = psycopg_instr._span
    monkeypatch.setattr(psycopg_instr, "_span", lambda *a, **k: spans.append(a) or real(*a, **k))
    native, _ = _forms(lambda: psycopg_instr._aexecute(PgAsyncCursor.execute))
    cur = PgAsyncCursor()

    async def main() -> None:
        with new_entry_span("/request"):
            await native(cur, "SELECT 1")
            await native(cur, "SELECT %s", (1,), prepare=None)  # AsyncConnection.execute's call
            await native(cur, "SELECT %s", params=(1,))  # the parameters by keyword: Python's

    asyncio.run(main())
    assert len(spans) == 1  # only the last call went through the Python form
    assert [c[4] for c in cur.calls] == ["PostgreSQL/Psycopg/execute"] * 3
    (segment,) = segments(sink.records)
    assert segment[3][1][9][:4] == ["db.type", "PostgreSQL", "db.instance", "shop"]


def _run_calls(  # noqa: PLR0917
    fn: Any, obj: Any, args: tuple[Any, ...], kw: dict[str, Any], sink: _sink.MemorySink, inside: str
) -> Any:
    outcome, calls, records = acall_in(fn, obj, args, kw, sink, inside)
    return (outcome if outcome[0] == "raised" else ("returned", outcome[1] is obj)), calls, records


@pytest.mark.parametrize("params_max", [0, 8])
def test_aiomysql_execute_matches_the_python_form(sink: _sink.MemorySink, params_max: int) -> None:
    ds.settings.params_max = params_max
    native, python = _mysql_forms()
    compare_forms(native, python, lambda: AsyncCursor(Connection()), MYSQL_CALLS, sink, acall_in)


def test_aiomysql_a_changed_database_goes_through_the_python_form(
    sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheres: list[Any] = []
    real = aiomysql_instr.where
    monkeypatch.setattr(aiomysql_instr, "where", lambda cur: wheres.append(cur) or real(cur))
    native, _ = _mysql_forms()
    conn = Connection("first")
    cur = AsyncCursor(conn)

    async def main() -> Any:
        with new_entry_span("/request"):
            await native(cur, "SELECT 1")  # the Python form makes the memo
            await native(cur, "SELECT 1")  # C takes it
            # What aiomysql's connect(db=...) keeps changes: the memo is out of date, the
            # Python form makes it again. (A call made before the change and awaited after
            # it names the new one: its span opens when it is awaited.)
            conn._db = "second"
            await native(cur, "SELECT 2")

    asyncio.run(main())
    assert len(wheres) == 2  # the Python form's: the first query and the one after the change
    (segment,) = segments(sink.records)
    assert [(s[2], s[9][3]) for s in segment[3][:-1]] == [
        ("Mysql/AioMysql/execute", "first"),
        ("Mysql/AioMysql/execute", "first"),
        ("Mysql/AioMysql/execute", "second"),
    ]


def test_the_native_call_is_lazy_and_c_made(sink: _sink.MemorySink) -> None:
    native, _ = _redis_forms()
    client = AsyncRedis()

    async def main() -> Any:
        with new_entry_span("/request"):
            await native(client, "GET", "a")  # the memos
            call = native(client, "GET", "b")
            assert type(call).__name__ == "Within" and asyncio.iscoroutine(call)
            assert client.calls[-1][0] == ("GET", "a")  # nothing sent before it is awaited
            return await call

    assert asyncio.run(main()) == ("reply", ("GET", "b"))
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]] == ["Redis/GET", "Redis/GET", "/request"]
    assert client.calls[-1] == (("GET", "b"), {}, "Redis/GET")


@pytest.mark.parametrize("form", ["native", "python"])
def test_a_call_never_awaited_makes_no_span(sink: _sink.MemorySink, form: str) -> None:
    native, python = _redis_forms()
    fn = native if form == "native" else python
    client = AsyncRedis()

    async def main() -> None:
        with new_entry_span("/request"):
            await fn(client, "GET", "a")
            call = fn(client, "GET", "never")
            call.close()  # what the collector does to a coroutine never awaited, without the warning

    asyncio.run(main())
    (segment,) = segments(sink.records)  # the request's segment was not held open
    assert [s[2] for s in segment[3]] == ["Redis/GET", "/request"]
    assert [c[0] for c in client.calls] == [("GET", "a")]


def _task_story(fn: Any, client: Any, story: str) -> Any:
    """A task made of the call (``create_task``), cancelled before it starts, cancelled
    while the client waits, or awaited: what the request saw."""

    async def main() -> Any:
        with new_entry_span("/request"):
            await fn(client, "GET", "memo")
            task = asyncio.get_running_loop().create_task(
                fn(client, "SLOW" if story != "done" else "GET", "k")
            )
            if story == "cancel-before":
                task.cancel()
            elif story == "cancel-during":
                while not any(c[0][0] == "SLOW" for c in client.calls):
                    await asyncio.sleep(0)
                task.cancel()
            try:
                return ("returned", await task)
            except asyncio.CancelledError:
                return ("cancelled",)

    return asyncio.run(main())


@pytest.mark.parametrize("story", ["done", "cancel-before", "cancel-during"])
def test_tasks_and_cancellation_as_the_python_form(sink: _sink.MemorySink, story: str) -> None:
    native, python = _redis_forms()
    got = []
    for fn in (native, python):
        client = AsyncRedis()
        got.append((_task_story(fn, client, story), client.calls, segments(sink.records)))
        sink.clear()
    assert got[0] == got[1]
    outcome, calls, records = got[0]
    assert outcome[0] == ("returned" if story == "done" else "cancelled")
    spans = records[0][3]
    # A task cancelled before it started sent nothing and made no span.
    assert len(spans) == (2 if story == "cancel-before" else 3)
    if story == "cancel-during":
        assert calls[-1][2] == "Redis/SLOW"  # the client waited inside the command's span
        # The span ended with the cancellation: logged, not flagged (tests/test_cancelled_not_error.py).
        assert spans[1][7] is False  # is_error
        assert [dict(zip(f[::2], f[1::2], strict=True))["event"] for (f,) in spans[1][10]] == ["interrupted"]


@pytest.mark.parametrize("form", ["native", "python"])
def test_throw_before_the_first_send_raises_what_is_thrown(sink: _sink.MemorySink, form: str) -> None:
    native, python = _redis_forms()
    fn = native if form == "native" else python
    client = AsyncRedis()
    with new_entry_span("/request"):
        call = fn(client, "GET", "a")
        with pytest.raises(LookupError, match="thrown"):
            call.throw(LookupError("thrown"))
        with pytest.raises(RuntimeError):
            call.send(None)  # a coroutine that ended cannot be resumed
    assert client.calls == []
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]] == ["/request"]


def test_a_wrong_throw_is_refused_as_a_coroutine_refuses_it(sink: _sink.MemorySink) -> None:
    native, python = _redis_forms()
    with new_entry_span("/request"):
        for fn in (native, python):
            call = fn(AsyncRedis(), "GET", "a")
            with pytest.raises(TypeError):
                call.throw(42)
            with pytest.raises(TypeError):
                call.send("not None")  # refused before anything starts
            call.close()


# -- aiormq's consumer callback (AwaitingCall) ---------------------------------------------------

SW8 = producer_sw8()


def _channel(url: Any) -> Any:
    return SimpleNamespace(connection=SimpleNamespace(url=url))


def _delivery(headers: Any) -> Any:
    ns = SimpleNamespace
    return ns(delivery=ns(exchange="ex", routing_key="q"), header=ns(properties=ns(headers=headers)))


def _aiormq_cases() -> dict[str, tuple[Any, Any]]:
    from yarl import URL

    url = URL("amqp://guest:guest@mq:5672/")
    return {
        "sw8": (_channel(url), _delivery({"sw8": SW8})),
        "no sw8": (_channel(url), _delivery({})),
        "no headers": (_channel(url), _delivery(None)),
        # No ``delivery``: the consuming step raises, the callback runs without a span.
        "no delivery": (_channel(url), SimpleNamespace(header=None)),
    }


def _consume(wrap: Callable[[Any, Any], Any], case: str, outcome: str, place: str, sink: Any) -> Any:
    """aiormq's way: the wrapped callback's call made a task, awaited (or cancelled while the
    callback waits); what the callback saw, what came out, the segments."""
    channel, message = _aiormq_cases()[case]
    seen: list[Any] = []

    async def callback(msg: Any) -> Any:
        cur = current_span.get()
        seen.append(None if cur is None else (cur.op, list(cur.tags)))
        await asyncio.sleep(0)
        if outcome == "error":
            raise ValueError("callback failed")
        if outcome == "cancel":
            await asyncio.sleep(10)
        return ("acked", msg is message)

    async def deliver() -> Any:
        task = asyncio.get_running_loop().create_task(wrap(channel, callback)(message))
        if outcome == "cancel":
            while not seen:
                await asyncio.sleep(0)
            task.cancel()
        return await task

    try:
        result: Any = ("returned", asyncio.run(in_place(place, deliver)))
    except (Exception, asyncio.CancelledError) as e:
        result = ("raised", type(e).__name__, str(e))
    records = segments(sink.records)
    sink.clear()
    return seen, result, records


@pytest.mark.parametrize("place", ["entry", "none"])
@pytest.mark.parametrize("outcome", ["return", "error", "cancel"])
@pytest.mark.parametrize("case", list(_aiormq_cases()))
def test_aiormq_callback_matches_the_python_form(
    sink: _sink.MemorySink, place: str, outcome: str, case: str
) -> None:
    aiormq_instr._last_peer = (None, "")
    mine = _consume(aiormq_instr._on_message, case, outcome, place, sink)
    assert mine == _consume(aiormq_instr._py_on_message, case, outcome, place, sink)
    seen, _, records = mine
    if case == "no delivery":
        assert seen == [None if place == "none" else ("/request", [])]
    else:
        assert seen[0][0] == "RabbitMQ/Topic/ex/Queue/q/Consumer"
        consumer = next(seg for seg in records if seg[3][0][2] == "RabbitMQ/Topic/ex/Queue/q/Consumer")
        # is_error: a callback's exception flags the span, its cancellation only logs it.
        assert consumer[3][0][7] is (outcome == "error")
        assert bool(consumer[3][0][11]) is (case == "sw8")  # refs: the producer's trace continued


def test_aiormq_callback_is_the_native_wrapper_and_a_coroutine_function() -> None:
    import inspect

    from aiormq.tools import awaitable

    wrapped = aiormq_instr._on_message(object(), print)
    assert type(wrapped).__name__ == "AwaitingCall" and wrapped.__wrapped__ is print
    # aiormq keeps it as it is (no coroutine of its own around it), as asyncio would.
    assert inspect.iscoroutinefunction(wrapped) and asyncio.iscoroutinefunction(wrapped)
    assert awaitable(wrapped) is wrapped


def test_awaiting_call_passes_every_argument_and_declines_on_an_exception(sink: _sink.MemorySink) -> None:
    from swmp.tracing.span import native_core

    opened: list[Any] = []

    def open_span(owner: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append((owner, args, kwargs))
        if args[0] == "decline":
            raise ValueError("cannot read the message")
        if args[0] == "interrupt":
            raise KeyboardInterrupt
        return new_exit_span("Awaited/op", "peer:1", 1, 1)

    async def orig(*args: Any, **kwargs: Any) -> Any:
        return ("orig", args, kwargs, _seen())

    async def fallback(*args: Any, **kwargs: Any) -> Any:
        return ("fallback", args, kwargs, _seen())

    call = native_core.AwaitingCall(open_span, "owner", orig, fallback)
    many = tuple(range(12))  # more than the opener's stack buffer holds

    async def main() -> Any:
        with new_entry_span("/request"):
            got = [
                await call("run", *many, key="v"),
                await call("decline", 1),
                await asyncio.get_running_loop().create_task(call("run")),
            ]
            with pytest.raises(KeyboardInterrupt):
                await call("interrupt")
            return got

    got = asyncio.run(main())
    assert got == [
        ("orig", ("run", *many), {"key": "v"}, "Awaited/op"),
        ("fallback", ("decline", 1), {}, "/request"),
        ("orig", ("run",), {}, "Awaited/op"),
    ]
    assert opened[0] == ("owner", ("run", *many), {"key": "v"})
    (segment,) = segments(sink.records)
    assert [s[2] for s in segment[3]] == ["Awaited/op", "Awaited/op", "/request"]
    with pytest.raises(TypeError):
        native_core.AwaitingCall(open_span, "owner", orig)
    with pytest.raises(TypeError):
        native_core.AwaitingCall(1, "owner", orig, fallback)
