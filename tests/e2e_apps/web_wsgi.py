"""Five WSGI frameworks behind one Gunicorn: each serves ``/<framework>/users/<id>`` and
``/<framework>/fail`` (raises, the framework answers 500).

    swmp run -- gunicorn -k gthread --threads 4 tests.e2e_apps.web_wsgi:app

``app`` sends each request to the framework named by the first path segment, unchanged (as
a path-prefix dispatcher in front of several applications would); it is plain WSGI and not
traced itself, so every entry span comes from the framework's own instrumentation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import bottle
import falcon
import flask
from django.http import HttpRequest, HttpResponse
from django.urls import path
from pyramid.config import Configurator
from pyramid.response import Response

from tests.e2e_apps import web_django


def failure(framework: str) -> RuntimeError:
    return RuntimeError(f"{framework} failed on purpose")


# -- Flask ----------------------------------------------------------------------------------------
flask_app = flask.Flask(__name__)


@flask_app.route("/flask/users/<int:uid>")
def flask_user(uid: int) -> str:
    return f"flask {uid}"


@flask_app.route("/flask/fail")
def flask_fail() -> str:
    raise failure("flask")


# -- Django (settings in this module: the app is its own URLconf) ---------------------------------
def django_user(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse(f"django {pk}")


def django_fail(request: HttpRequest) -> HttpResponse:
    raise failure("django")


urlpatterns = [path("django/users/<int:pk>/", django_user), path("django/fail", django_fail)]

web_django.configure(__name__)

from django.core.wsgi import get_wsgi_application  # noqa: E402 (after settings)

django_app = get_wsgi_application()


# -- Falcon ---------------------------------------------------------------------------------------
class FalconUser:
    def on_get(self, req: falcon.Request, resp: falcon.Response, uid: int) -> None:
        resp.text = f"falcon {uid}"


class FalconFail:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        raise failure("falcon")


falcon_app = falcon.App()
falcon_app.add_route("/falcon/users/{uid:int}", FalconUser())
falcon_app.add_route("/falcon/fail", FalconFail())


# -- Pyramid --------------------------------------------------------------------------------------
def pyramid_user(request: Any) -> Response:
    return Response(f"pyramid {request.matchdict['uid']}")


def pyramid_fail(request: Any) -> Response:
    raise failure("pyramid")


def pyramid_error_page(exc: Exception, request: Any) -> Response:
    return Response("pyramid error page", status=500)


with Configurator() as config:
    config.add_route("user", "/pyramid/users/{uid}")
    config.add_view(pyramid_user, route_name="user")
    config.add_route("fail", "/pyramid/fail")
    config.add_view(pyramid_fail, route_name="fail")
    config.add_exception_view(pyramid_error_page, context=RuntimeError)
    pyramid_app = config.make_wsgi_app()


# -- Bottle ---------------------------------------------------------------------------------------
bottle_app = bottle.Bottle()


@bottle_app.route("/bottle/users/<uid:int>")
def bottle_user(uid: int) -> str:
    return f"bottle {uid}"


@bottle_app.route("/bottle/fail")
def bottle_fail() -> str:
    raise failure("bottle")


# -- the dispatcher -------------------------------------------------------------------------------
APPS: dict[str, Callable[..., Iterable[bytes]]] = {
    "flask": flask_app,
    "django": django_app,
    "falcon": falcon_app,
    "pyramid": pyramid_app,
    "bottle": bottle_app,
}


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    first = (environ.get("PATH_INFO") or "/").split("/")[1]
    target = APPS.get(first)
    if target is None:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such framework"]
    return target(environ, start_response)
