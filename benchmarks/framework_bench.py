"""What the entry span costs in each web framework, against the framework's bare request
handling, in one run.

Every case serves ``GET /users/42`` (a route with a parameter, so route-template naming is
in the measured path) by calling the framework's own WSGI or ASGI callable in process, no
sockets: a fresh environ/scope per request, the body consumed and closed as a server
would. Each round measures every case twice, back to back: with the agent's
instrumentation uninstalled (``bare``) and installed (``traced``); segments go into a real
shared-memory ring, drained between measurements (untimed). A round alternates the two
modes in short batches and the clock is the process's CPU time, so load from other
processes on a shared machine shifts both modes alike. The entry span's cost is
``traced - bare`` per request (median over rounds of the per-round difference);
``vs WSGI mw`` divides it by the same figure of the reference, the plain WSGI middleware
around a trivial WSGI app. ``generic mw`` is the cost of the generic WSGI (or ASGI)
middleware wrapped around the *same* framework app, uninstrumented otherwise, and
``vs generic`` the framework instrumentation's cost against it: the same span in the same
application, so what the framework-specific parts (entry-point patch, route naming, error
hooks) add. Around a real framework the span costs more than around a trivial app even
for the plain middleware (the framework's larger working set leaves the agent's code and
data colder in the CPU caches), which is why both columns are shown.

    python benchmarks/framework_bench.py [--quick] [--rounds N] [--requests N]
                                         [--case NAME ...] [--json PATH]

Adding a framework (other servers: aiohttp, Tornado, Sanic, gRPC): append a
:class:`Case` to :data:`CASES` whose ``build()`` returns ``serve(n)``, a function that
handles ``n`` requests in process through the framework's entry point. ``build()`` is
called once with the instrumentation installed and once without, before any timing; for
an async framework wrap the loop with :func:`async_serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

Serve = Callable[[int], None]

REFERENCE = "wsgi-middleware"
BATCHES = 6  # bare/traced alternations per case and round
# An ``sw8`` value every request of the WSGI and ASGI drivers carries (a service called by
# another traced one: framework_cachegrind.py --sw8), else None: no such header.
INCOMING_SW8: str | None = None


@dataclass
class Case:
    name: str
    build: Callable[[], Serve]  # -> serve(n): handle n requests through the framework
    server: str = ""  # what users deploy it with (for the table)
    # -> serve(n) through the same application wrapped in the generic WSGI/ASGI middleware
    # (measured uninstalled): what the framework-specific instrumentation is compared with.
    generic: Callable[[], Serve] | None = None


def wsgi_case(name: str, make_app: Callable[[], Any], server: str, path: str = "/users/42") -> Case:
    """A case for a WSGI framework: ``make_app()`` returns its WSGI callable."""
    from swmp.instrument.wsgi import WSGIMiddleware

    return Case(
        name,
        lambda: wsgi_serve(make_app(), path),
        server,
        lambda: wsgi_serve(WSGIMiddleware(make_app()), path),
    )


def asgi_case(name: str, make_app: Callable[[], Any], server: str, path: str = "/users/42") -> Case:
    """A case for an ASGI framework: ``make_app()`` returns its ASGI callable."""
    from swmp.instrument.asgi import ASGIMiddleware

    return Case(
        name,
        lambda: asgi_serve(make_app(), path),
        server,
        lambda: asgi_serve(ASGIMiddleware(make_app()), path),
    )


# -- drivers -------------------------------------------------------------------------------------
def wsgi_serve(app: Any, path: str = "/users/42") -> Serve:
    """``serve(n)`` for a WSGI callable."""
    base = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.errors": sys.stderr,
    }
    if INCOMING_SW8 is not None:
        base["HTTP_SW8"] = INCOMING_SW8

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        return None

    def serve(n: int) -> None:
        for _ in range(n):
            environ = dict(base)
            environ["wsgi.input"] = io.BytesIO(b"")
            body = app(environ, start_response)
            for _chunk in body:
                pass
            close = getattr(body, "close", None)
            if close is not None:
                close()

    return serve


def async_serve(one_request: Callable[[], Awaitable[None]]) -> Serve:
    """``serve(n)`` for an async framework: ``n`` awaits of ``one_request()`` in one loop run."""
    loop = asyncio.new_event_loop()

    async def many(n: int) -> None:
        for _ in range(n):
            await one_request()

    def serve(n: int) -> None:
        loop.run_until_complete(many(n))

    return serve


def asgi_serve(app: Any, path: str = "/users/42") -> Serve:
    """``serve(n)`` for an ASGI callable (HTTP scope, empty body)."""
    base = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000")],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
    }
    if INCOMING_SW8 is not None:
        base["headers"] = [(b"host", b"127.0.0.1:8000"), (b"sw8", INCOMING_SW8.encode())]
    request_msg = {"type": "http.request", "body": b"", "more_body": False}

    async def one() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return request_msg
            await asyncio.sleep(3600)  # never disconnects while the request runs
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            return None

        scope = dict(base)
        scope["headers"] = list(base["headers"])  # type: ignore[call-overload]
        await app(scope, receive, send)

    return async_serve(one)


# -- cases ---------------------------------------------------------------------------------------
def _trivial_wsgi(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"42"]


def build_wsgi_middleware() -> Serve:
    from swmp.instrument import installed
    from swmp.instrument.wsgi import WSGIMiddleware

    # The reference: the middleware itself when "installed", the bare app otherwise.
    return wsgi_serve(WSGIMiddleware(_trivial_wsgi) if installed() else _trivial_wsgi)


def _user(uid: int) -> str:
    return str(uid)


def flask_app() -> Any:
    import flask

    app = flask.Flask("bench")
    app.add_url_rule("/users/<int:uid>", "user", _user)
    return app


def _django_setup() -> None:
    import types

    import django
    from django.conf import settings

    if settings.configured:
        return
    from django.http import HttpResponse
    from django.urls import path

    async def auser(request: Any, pk: int) -> HttpResponse:
        return HttpResponse(str(pk))

    urls = types.ModuleType("bench_django_urls")
    urls.urlpatterns = [  # type: ignore[attr-defined]
        path("users/<int:pk>", lambda request, pk: HttpResponse(str(pk))),
        path("ausers/<int:pk>", auser),
    ]
    sys.modules[urls.__name__] = urls
    settings.configure(
        ROOT_URLCONF=urls.__name__,
        ALLOWED_HOSTS=["*"],
        DEBUG=False,
        SECRET_KEY="bench",
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
        LOGGING_CONFIG=None,
    )
    django.setup()


def django_wsgi_app() -> Any:
    _django_setup()
    from django.core.handlers.wsgi import WSGIHandler

    return WSGIHandler()


def django_asgi_app() -> Any:
    _django_setup()
    from django.core.handlers.asgi import ASGIHandler

    return ASGIHandler()


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def user(request: Any) -> PlainTextResponse:
        return PlainTextResponse(str(request.path_params["uid"]))

    # A new app per build: Starlette builds (and caches) its middleware stack on first call.
    return Starlette(routes=[Route("/users/{uid:int}", user)])


def fastapi_app() -> Any:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/users/{uid}")
    async def user(uid: int) -> dict[str, int]:  # a typed parameter, validated; JSON answer
        return {"uid": uid}

    return app


class _FalconUser:
    def on_get(self, req: Any, resp: Any, uid: int) -> None:
        resp.text = str(uid)


class _FalconAsyncUser:
    async def on_get(self, req: Any, resp: Any, uid: int) -> None:
        resp.text = str(uid)


def falcon_wsgi_app() -> Any:
    import falcon

    app = falcon.App()
    app.add_route("/users/{uid:int}", _FalconUser())
    return app


def falcon_asgi_app() -> Any:
    import falcon.asgi

    app = falcon.asgi.App()
    app.add_route("/users/{uid:int}", _FalconAsyncUser())
    return app


def pyramid_app() -> Any:
    from pyramid.config import Configurator
    from pyramid.response import Response

    with Configurator() as config:
        config.add_route("user", "/users/{uid}")
        config.add_view(lambda request: Response(request.matchdict["uid"]), route_name="user")
        app = config.make_wsgi_app()
    return app


def bottle_app() -> Any:
    import bottle

    app = bottle.Bottle()
    app.route("/users/<uid:int>", callback=_user)
    return app


def build_http_server() -> Serve:
    """A ``BaseHTTPRequestHandler`` fed one request from memory (no socket)."""
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"42"
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    raw = b"GET /users/42 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"

    class Connection:
        def makefile(self, mode: str, bufsize: int = -1) -> io.BytesIO:
            return io.BytesIO(raw)

        def sendall(self, data: bytes) -> None:
            return None

    class Server:
        pass

    def serve(n: int) -> None:
        conn, server = Connection(), Server()
        for _ in range(n):
            Handler(conn, ("127.0.0.1", 50000), server)  # type: ignore[arg-type]

    return serve


CASES: list[Case] = [
    Case(REFERENCE, build_wsgi_middleware, "any WSGI server"),
    wsgi_case("flask", flask_app, "Gunicorn sync/gthread"),
    wsgi_case("django-wsgi", django_wsgi_app, "Gunicorn sync/gthread"),
    asgi_case("django-asgi", django_asgi_app, "Gunicorn + Uvicorn worker", "/ausers/42"),
    asgi_case("starlette", starlette_app, "Gunicorn + Uvicorn worker"),
    asgi_case("fastapi", fastapi_app, "Uvicorn / Gunicorn + Uvicorn worker"),
    wsgi_case("falcon-wsgi", falcon_wsgi_app, "Gunicorn sync/gthread"),
    asgi_case("falcon-asgi", falcon_asgi_app, "Gunicorn + Uvicorn worker"),
    wsgi_case("pyramid", pyramid_app, "Gunicorn sync/gthread"),
    wsgi_case("bottle", bottle_app, "Gunicorn sync/gthread"),
    Case("http.server", build_http_server, "its own (ThreadingHTTPServer)"),
]

# aiohttp, Tornado, Sanic and gRPC: real servers on loopback (benchmarks/framework_bench_servers.py).
from benchmarks.framework_bench_servers import server_cases  # noqa: E402

CASES += [Case(name, build, server, generic) for name, build, server, generic in server_cases()]


# -- the agent side ------------------------------------------------------------------------------
class Agent:
    """The instrumentation (installed / not) with segments going into a real ring of
    ``capacity`` bytes that has gone round once (benchmarks/_ring.py). The default holds the
    segments of a few thousand requests for callers that never drain while measuring."""

    def __init__(self, capacity: int = 16 << 20) -> None:
        from benchmarks._ring import Ring
        from swmp import tracing
        from swmp.config import load

        self.ring = Ring(capacity)
        self.config = load({}, agent_log_reporter_active=False, agent_meter_reporter_active=False)
        tracing.configure(self.config)

    def install(self) -> None:
        from swmp import instrument

        instrument.install_all(self.config)

    def uninstall(self) -> None:
        from swmp import instrument

        instrument.uninstall_all()

    def drain(self) -> int:
        return self.ring.drain()

    def close(self) -> None:
        self.ring.close()


def measure(serve: Serve, n: int) -> float:
    """CPU ns per request of ``serve(n)``, garbage from before collected first.

    CPU time of this process (all its threads: Django runs parts of an ASGI request in a
    thread pool), not wall time: on a shared machine the time the process waits for a
    core is not the instrumentation's cost, and it is what makes wall-clock figures drift.
    """
    gc.collect()
    t0 = time.process_time_ns()
    serve(n)
    return (time.process_time_ns() - t0) / n


@dataclass
class _Built:
    bare: Serve  # built and run with the instrumentation uninstalled
    traced: Serve  # built and run with it installed
    generic: Serve | None  # the same app in the generic middleware, run uninstalled


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run(cases: list[Case], rounds: int, requests: int) -> list[dict[str, Any]]:
    from benchmarks._ring import ring_size_for

    batch = max(1, requests // BATCHES)
    agent = Agent(ring_size_for(batch))  # drained every batch
    built: dict[str, _Built] = {}
    try:
        for case in cases:
            try:
                agent.uninstall()
                bare = case.build()
                generic = case.generic() if case.generic is not None else None
                agent.install()
                traced = case.build()
            except ImportError as e:
                print(f"skipping {case.name}: {e}", file=sys.stderr)
                continue
            built[case.name] = _Built(bare, traced, generic)
        keys = ("bare", "traced", "cost", "generic_cost")
        samples = {name: {k: list[float]() for k in keys} for name in built}
        for b in built.values():  # warm-up (imports, caches, first-call setup)
            agent.uninstall()
            b.bare(min(requests, 200))
            if b.generic is not None:
                b.generic(min(requests, 200))
            agent.install()
            b.traced(min(requests, 200))
            agent.drain()
        agent.ring.warm()  # after the set-up's pause: resident, as a busy worker's ring is
        for _ in range(rounds):
            for name, b in built.items():
                # Short alternating batches: a change of machine load hits all modes alike.
                bare_ns = traced_ns = generic_ns = 0.0
                for _ in range(BATCHES):
                    agent.uninstall()
                    bare_ns += measure(b.bare, batch)
                    if b.generic is not None:
                        generic_ns += measure(b.generic, batch)
                    agent.install()
                    traced_ns += measure(b.traced, batch)
                    agent.drain()
                s = samples[name]
                s["bare"].append(bare_ns / BATCHES)
                s["traced"].append(traced_ns / BATCHES)
                s["cost"].append((traced_ns - bare_ns) / BATCHES)
                if b.generic is not None:
                    s["generic_cost"].append((generic_ns - bare_ns) / BATCHES)
    finally:
        agent.uninstall()
        agent.close()
    ref = _median(samples[REFERENCE]["cost"]) if REFERENCE in samples else float("nan")
    servers = {c.name: c.server for c in cases}
    out = []
    for name, s in samples.items():
        cost = _median(s["cost"])
        generic = _median(s["generic_cost"])
        out.append(
            {
                "case": name,
                "server": servers[name],
                "bare_ns": round(_median(s["bare"])),
                "traced_ns": round(_median(s["traced"])),
                "span_cost_ns": round(cost),
                "span_cost_min_ns": round(min(s["cost"])),
                "vs_wsgi_middleware": round(cost / ref, 2) if ref > 0 else None,
                "generic_middleware_cost_ns": round(generic) if s["generic_cost"] else None,
                "vs_generic_middleware": round(cost / generic, 2)
                if s["generic_cost"] and generic > 0
                else None,
                "rounds": rounds,
                "requests_per_round": requests,
            }
        )
    return out


def _ratio(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few short rounds (smoke test)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=3000, help="requests per case, mode and round")
    names = [c.name for c in CASES]
    ap.add_argument("--case", action="append", choices=names, help="only these (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    rounds, requests = (3, 300) if args.quick else (args.rounds, args.requests)
    wanted = set(args.case or names) | {REFERENCE}
    results = run([c for c in CASES if c.name in wanted], rounds, requests)

    print(
        f"entry span cost per request ({rounds} rounds x {requests} requests per case and mode, "
        f"Python {sys.version.split()[0]}); CPU ns; cost = traced - bare, median of rounds"
    )
    print(
        f"{'case':<16}{'bare':>10}{'traced':>10}{'cost':>9}{'min':>9}{'vs WSGI mw':>12}"
        f"{'generic mw':>12}{'vs generic':>12}"
    )
    for r in results:
        generic = r["generic_middleware_cost_ns"]
        print(
            f"{r['case']:<16}{r['bare_ns']:>10,}{r['traced_ns']:>10,}{r['span_cost_ns']:>9,}"
            f"{r['span_cost_min_ns']:>9,}{_ratio(r['vs_wsgi_middleware']):>12}"
            f"{(f'{generic:,}' if generic is not None else '-'):>12}{_ratio(r['vs_generic_middleware']):>12}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
