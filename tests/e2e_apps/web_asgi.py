"""Three ASGI frameworks behind one Gunicorn with Uvicorn workers: each serves
``/<framework>/users/<id>`` and ``/<framework>/fail`` (raises, the framework answers 500).

    swmp run -- gunicorn -k uvicorn.workers.UvicornWorker tests.e2e_apps.web_asgi:app

``app`` hands each HTTP request to the framework named by the first path segment,
unchanged; lifespan events go to Starlette only. It is plain ASGI and not traced itself.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
from django.http import HttpRequest, HttpResponse
from django.urls import path
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.e2e_apps import web_django


def failure(framework: str) -> RuntimeError:
    return RuntimeError(f"{framework} failed on purpose")


# -- Starlette ------------------------------------------------------------------------------------
async def starlette_user(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"starlette {request.path_params['uid']}")


async def starlette_fail(request: Request) -> PlainTextResponse:
    raise failure("starlette")


starlette_app = Starlette(
    routes=[Route("/starlette/users/{uid:int}", starlette_user), Route("/starlette/fail", starlette_fail)]
)


# -- Django under ASGI (settings in this module: the app is its own URLconf) ----------------------
async def django_user(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse(f"django {pk}")


def django_fail(request: HttpRequest) -> HttpResponse:  # a sync view: Django runs it in a thread
    raise failure("django")


urlpatterns = [path("django/users/<int:pk>/", django_user), path("django/fail", django_fail)]

web_django.configure(__name__)

from django.core.asgi import get_asgi_application  # noqa: E402 (after settings)

django_app = get_asgi_application()


# -- Falcon (ASGI) --------------------------------------------------------------------------------
class FalconUser:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, uid: int) -> None:
        resp.text = f"falcon {uid}"


class FalconFail:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raise failure("falcon")


falcon_app = falcon.asgi.App()
falcon_app.add_route("/falcon/users/{uid:int}", FalconUser())
falcon_app.add_route("/falcon/fail", FalconFail())


# -- the dispatcher -------------------------------------------------------------------------------
APPS: dict[str, Any] = {"starlette": starlette_app, "django": django_app, "falcon": falcon_app}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        await starlette_app(scope, receive, send)
        return
    target = APPS.get(scope["path"].split("/")[1])
    if target is None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"no such framework"})
        return
    await target(scope, receive, send)
