"""Fixes found by reviews (one section each): bad input refused out loud, not silently."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.handlers import SimpleHandler

import orjson
import pytest

from reporter_proc import records as R
from swmp import _sink, propagation
from swmp._arena_sink import ArenaSink
from swmp.config import _load, load
from swmp.instrument import log_reporter, wsgi
from swmp.tracing import span as span_module
from swmp.tracing.context import new_entry_span
from tests import test_cli_support as S
from tests.instrumented import instrumented
from tests.test_agent_runtime import segment

GOOD_SW8 = "1-dHJhY2U=-c2VnbWVudA==-3-c2VydmljZQ==-aW5zdGFuY2U=-L2dldA==-aG9zdDo4MA=="


# -- 1. malformed sw8 / sw8-correlation / sw8-x: counted and logged once ----------------------
class BadInputSink(_sink.MemorySink):
    """A memory sink that counts the bad input the agent refused (as ``ProcessSink`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.bad_input = 0

    def count_bad_input(self) -> None:
        self.bad_input += 1


@pytest.fixture(params=["native", "python"])
def bad_sink(request: pytest.FixtureRequest, trace_sink: _sink.MemorySink) -> Iterator[BadInputSink]:
    """A counting sink, with the carrier decoded by the native core's fast paths or by the
    Python path only; the first refusal of the process not yet logged."""
    if request.param == "native":
        if span_module.native_core is None:
            pytest.skip("the native span core is not built")
        propagation.use_native(span_module.native_core)
    else:
        propagation.use_native(None)
    sink = BadInputSink()
    _sink.set_sink(sink)
    propagation._refused_pid = 0
    try:
        yield sink
    finally:
        propagation.use_native(span_module.native_core)
        _sink.set_sink(trace_sink)


MALFORMED_SW8 = [
    "garbage",
    b"1-\xff-x-1-a-b-c-d",
    "1-dHJhY2U=-c2VnbWVudA==-notanumber-c2VydmljZQ==-aW5zdGFuY2U=-L2dldA==-aG9zdDo4MA==",
    "1-dHJhY2U=-c2VnbWVudA==-3-c2VydmljZQ==-aW5zdGFuY2U=-L2dldA==-",  # an empty address
    "1-!!!-c2VnbWVudA==-3-c2VydmljZQ==-aW5zdGFuY2U=-L2dldA==-aG9zdDo4MA==",
    42,
]


@pytest.mark.parametrize("value", MALFORMED_SW8)
def test_a_malformed_sw8_is_counted_and_starts_a_new_trace(bad_sink: BadInputSink, value: Any) -> None:
    assert propagation.from_headers(value) is None  # no carrier: the request's trace is new
    assert bad_sink.bad_input == 1
    assert propagation.from_headers(value) is None
    assert bad_sink.bad_input == 2


def test_absent_and_well_formed_headers_count_nothing(bad_sink: BadInputSink) -> None:
    for _ in range(2):  # the second one from the native core's cache of callers
        carrier = propagation.from_headers(GOOD_SW8, "a2V5:dmFsdWU=", "1-1700000000000")
        assert carrier is not None and carrier.correlation == {"key": "value"} and carrier.skip_analysis
    assert propagation.from_headers(None) is None
    assert propagation.from_headers(GOOD_SW8, "", "0-") is not None  # the Java agent's forms
    assert propagation.decode_correlation("a2V5:" + "dmFsdWU=" * 200) == {}  # over the limit: not bad
    assert bad_sink.bad_input == 0


@pytest.mark.parametrize("correlation", ["nocolon", "a2V5:!!!", "a2V5:dmFsdWU=,:dmFsdWU=", 7])
def test_a_malformed_correlation_header_is_counted_once(bad_sink: BadInputSink, correlation: Any) -> None:
    carrier = propagation.from_headers(GOOD_SW8, correlation)
    assert carrier is not None  # the trace still continues: only the bad entries are dropped
    assert bad_sink.bad_input == 1


@pytest.mark.parametrize("sw8x", ["2", "x-1", "1-abc", "", 3.5, "1" * 100])
def test_a_malformed_sw8x_header_is_counted(bad_sink: BadInputSink, sw8x: Any) -> None:
    carrier = propagation.from_headers(GOOD_SW8, None, sw8x)
    # The first field decides as before: "1-abc" still asks to skip analysis.
    assert carrier is not None and carrier.skip_analysis == (sw8x == "1-abc")
    assert bad_sink.bad_input == 1


@pytest.mark.parametrize("entry", ["wsgi_call", "python"])
def test_a_request_with_a_malformed_sw8_is_counted(bad_sink: BadInputSink, entry: str) -> None:
    """Through a whole request: the C WSGI entry (wsgi.c) and the Python one."""
    native = span_module.native_core
    if entry == "wsgi_call" and (native is None or not hasattr(native, "wsgi_call")):
        pytest.skip("the native span core is not built")
    run = native.wsgi_call if entry == "wsgi_call" else wsgi._py_trace_wsgi

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"ok"]

    for sw8 in ("garbage", GOOD_SW8):
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/in", "HTTP_SW8": sw8}
        assert run(app, environ, lambda *a: None, 7001, False, 0) == [b"ok"]
    refs = [orjson.loads(p)[R.SEG_SPANS][0][R.SPAN_REFS] for _, p in bad_sink.records]
    assert not refs[0] and refs[1]  # the bad one: a new trace; the good one continues its own
    assert bad_sink.bad_input == 1


def test_the_refusal_is_logged_once_a_process(
    bad_sink: BadInputSink, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="swmp.agent"):
        for _ in range(5):
            propagation.from_headers("garbage\x1b[31m")
            propagation.from_headers(GOOD_SW8, None, "junk")
    said = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "sw8" in said[0].getMessage() and "\x1b" not in said[0].getMessage()  # repr: escaped
    assert bad_sink.bad_input == 10


def test_swmp_status_shows_the_count(tmp_path: Path, trace_sink: _sink.MemorySink) -> None:
    arena = S.make_arena(tmp_path, slots=2)
    try:
        sink = ArenaSink(arena, "svc", "base", owner_pid=os.getppid())
        assert sink.write(R.SEGMENT, segment("base"))  # claims slot 0
        _sink.set_sink(sink)
        try:
            for _ in range(3):
                assert propagation.from_headers("garbage") is None
            assert propagation.from_headers(GOOD_SW8) is not None
        finally:
            _sink.set_sink(trace_sink)
        assert arena.ring_stats(0).bad_input == 3
        _rc, doc = S.cli_json("status", "--dir", str(tmp_path), "--interval", "0")
        (agent,) = doc["agents"]
        assert agent["totals"]["bad_input"] == 3
        assert [sl["bad_input"] for sl in agent["slots"]] == [3]
        text = S.cli("status", "--dir", str(tmp_path), "--interval", "0").stdout
        assert "bad input 3 malformed sw8 headers refused" in text
        sink.leave(for_good=True)
    finally:
        arena.close()


# -- 2. one bad backend address refuses that entry, not the list -------------------------------
@pytest.mark.parametrize(
    ("variable", "value", "kept", "bad"),
    [
        ("SW_AGENT_COLLECTOR_BACKEND_SERVICES", "good:11800,host:99999", "good:11800", ["host:99999"]),
        ("SW_AGENT_COLLECTOR_BACKEND_SERVICES", " a:1, :2 ,b:3,c:", "a:1,b:3", [":2", "c:"]),
        ("SW_KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:0", "k1:9092", ["k2:0"]),
    ],
)
def test_a_bad_backend_entry_is_refused_and_the_good_ones_kept(
    variable: str, value: str, kept: str, bad: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    _load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = load({variable: value})
        load({variable: value})  # a worker's reload: said once
    got = (
        cfg.agent_collector_backend_services
        if variable.startswith("SW_AGENT")
        else cfg.kafka_bootstrap_servers
    )
    assert got == kept
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(bad), lines
    for entry, line in zip(bad, lines, strict=True):
        assert (
            line.startswith(f"swmp: {variable} entry {entry!r} is not host:port")
            and f"using {kept!r}" in line
        )


def test_a_list_with_no_usable_entry_still_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    _load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = load({}, agent_collector_backend_services="host:99999, :1")
    assert cfg.agent_collector_backend_services == "127.0.0.1:11800"
    assert "is invalid ('host:99999' is not host:port" in caplog.text and "entry" not in caplog.text


# -- 3. swmp status --dir <a file> ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["status", "health"])
def test_a_file_given_as_the_directory_is_named_as_such(tmp_path: Path, command: str) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    proc = S.cli(command, "--dir", str(afile))
    # It said "does not exist", of a file the user can see; 2: as for a directory that is missing.
    said = " ".join(proc.stderr.split())  # (the line is wrapped)
    assert proc.returncode == 2 and "is not a directory" in said and "does not exist" not in said
    missing = S.cli(command, "--dir", str(tmp_path / "none"))
    assert missing.returncode == 2 and "does not exist" in " ".join(missing.stderr.split())


# -- 4. websockets: headers Headers() does not take leave no span open -----------------------------
def _websocket_server(port: list[int], ready: threading.Event, stop: list[Any]) -> None:
    from websockets.asyncio.server import serve

    async def echo(ws: Any) -> None:
        async for msg in ws:
            await ws.send(msg)

    async def main() -> None:
        async with serve(echo, "127.0.0.1", 0) as server:
            port.append(next(iter(server.sockets)).getsockname()[1])
            done = asyncio.get_running_loop().create_future()
            stop.append((asyncio.get_running_loop(), done))
            ready.set()
            await done

    asyncio.run(main())


@pytest.mark.parametrize("client", ["asyncio", "sync"])
def test_websockets_bad_headers_finish_the_span(client: str) -> None:
    port: list[int] = []
    ready = threading.Event()
    stop: list[Any] = []
    t = threading.Thread(target=_websocket_server, args=(port, ready, stop))
    t.start()
    try:
        assert ready.wait(10)
        url = f"ws://127.0.0.1:{port[0]}/x"
        import websockets.asyncio.client
        import websockets.sync.client

        async def connect_async() -> None:
            async with websockets.asyncio.client.connect(url, additional_headers=42):
                pass

        def connect() -> None:
            if client == "sync":
                with websockets.sync.client.connect(url, additional_headers=42):  # type: ignore[arg-type]
                    pass
            else:
                asyncio.run(connect_async())

        # What the library raises without the agent (a TypeError from websockets 17 on; 16,
        # the last release for Python 3.10, wraps it into a ConnectionClosedError) ...
        try:
            connect()
        except Exception as exc:
            plain = type(exc)
        else:
            pytest.fail("headers of 42 were accepted")
        with instrumented() as (memory, _):
            # ... is what it raises with it.
            with new_entry_span("/in"), pytest.raises(plain):
                connect()
            got = [orjson.loads(p) for kind, p in memory.records if kind == R.SEGMENT]
        # The exit span stayed open: the whole segment was never reported.
        assert len(got) == 1, got
        ops = {s[R.SPAN_OPERATION]: s for s in got[0][R.SEG_SPANS]}
        assert set(ops) == {"/x", "/in"} and ops["/x"][R.SPAN_IS_ERROR]
    finally:
        if stop:
            loop, done = stop[0]
            loop.call_soon_threadsafe(done.set_result, None)
        t.join(10)


# -- 5. WSGI: a response that fails at its first item is a 500 -----------------------------------
def _generator_app(when: str) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        def body() -> Iterator[bytes]:
            start_response("200 OK", [("Content-Type", "text/plain")])
            if when == "first":
                raise ValueError("at the first item")
            yield b"sent"
            raise ValueError("after the first item")

        return body()

    return app


def _served(run: Any, when: str, sink: _sink.MemorySink) -> tuple[bytes, dict[str, str], bool]:
    """The app served by wsgiref (a real server's error handling): its answer, and the tags
    and error flag of the request's span."""
    out, err = io.BytesIO(), io.StringIO()
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/gen", "SERVER_NAME": "h", "SERVER_PORT": "80"}
    environ["SERVER_PROTOCOL"] = "HTTP/1.0"
    handler = SimpleHandler(io.BytesIO(), out, err, environ)  # type: ignore[arg-type]
    handler.run(lambda e, sr: run(_generator_app(when), e, sr, 7001, False, 0))
    got = [orjson.loads(p) for kind, p in sink.records if kind == R.SEGMENT]
    sink.clear()
    (span,) = got[0][R.SEG_SPANS]
    tags = span[R.SPAN_TAGS]
    return out.getvalue(), dict(zip(tags[::2], tags[1::2], strict=True)), span[R.SPAN_IS_ERROR]


@pytest.mark.parametrize("form", ["native", "python"])
def test_a_response_failing_at_its_first_item_is_tagged_500(
    form: str, trace_sink: _sink.MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    if form == "native":
        if span_module.native_core is None:
            pytest.skip("the native span core is not built")
        run = span_module.native_core.wsgi_call
    else:
        monkeypatch.setattr(wsgi, "_make_body", wsgi._Body)
        run = wsgi._py_trace_wsgi
    answer, tags, error = _served(run, "first", trace_sink)
    assert answer.startswith(b"HTTP/1.0 500")  # the server's answer...
    assert tags["http.status_code"] == "500" and error  # ...is the span's (it said 200)
    # After the first item the status line has gone out: it stands, the span is an error.
    answer, tags, error = _served(run, "later", trace_sink)
    assert answer.startswith(b"HTTP/1.0 200") and tags["http.status_code"] == "200" and error


# -- 6. unformatted log reports: a single dict argument ------------------------------------------
def test_a_single_dict_argument_gives_the_peer_agents_tags() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("tests.left_fixes.dict_args")
    logger.propagate = False
    keep = Keep()
    logger.addHandler(keep)
    try:
        logger.warning("%(a)s and %(b)s", {"a": 1, "b": "two"})
        logger.warning("%s and %s", 1, "two")
    finally:
        logger.removeHandler(keep)
    reporter = log_reporter.LogReporter(formatted=False)
    (body, tags), (_, tuple_tags) = (reporter.body_and_tags(r) for r in records)
    assert body == "%(a)s and %(b)s"
    # The SkyWalking Python agent enumerates record.args, a dict here: its keys (it gave none).
    assert tags[6:] == ["argument.0", "a", "argument.1", "b"]
    assert tuple_tags[6:] == ["argument.0", "1", "argument.1", "two"]
