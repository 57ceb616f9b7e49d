"""A FastAPI application run by ``tests/test_instrument_fastapi.py`` under the servers it
is deployed with (under ``swmp run``):

    uvicorn tests.e2e_apps.fastapi_app:app --host 127.0.0.1 --port PORT
    gunicorn -k uvicorn.workers.UvicornWorker -w 2 tests.e2e_apps.fastapi_app:app

Routes:

* ``/users/{uid}`` (``uid: int``): ``{"uid": uid}``; a non-integer id is FastAPI's 422;
* ``/files/{file_path:path}``: a typed (Starlette convertor) parameter;
* ``/api/v1/items/{item_id}`` and ``/api/v1/orgs/{org}/members/{uid}``: an ``APIRouter``
  with a prefix, and a router included in it with its own prefix;
* ``/sync/users/{uid}``: a plain ``def`` endpoint (FastAPI runs it in a thread) that calls
  ``/users/{uid}`` of this server with ``http.client`` (an exit span, sw8 sent on);
* ``/missing/{key}``: ``HTTPException(404)``;
* ``/boom``: raises ``RuntimeError("fastapi failed on purpose")`` (FastAPI answers 500).
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request

app = FastAPI()


@app.get("/users/{uid}")
async def user(uid: int) -> dict[str, Any]:
    return {"uid": uid, "pid": os.getpid()}


@app.get("/files/{file_path:path}")
async def file(file_path: str) -> dict[str, str]:
    return {"path": file_path}


@app.get("/missing/{key}")
async def missing(key: str) -> None:
    raise HTTPException(status_code=404, detail=f"no {key}")


@app.get("/boom")
async def boom() -> None:
    raise RuntimeError("fastapi failed on purpose")


@app.get("/sync/users/{uid}")
def sync_user(uid: int, request: Request) -> dict[str, Any]:
    port = request.url.port or 80
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/users/{uid}")
        body = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return {"via": "sync", "downstream": body["uid"]}


items = APIRouter(prefix="/api/v1", tags=["items"])


@items.get("/items/{item_id}")
async def item(item_id: int) -> dict[str, int]:
    return {"item": item_id}


members = APIRouter(prefix="/orgs/{org}")


@members.get("/members/{uid}")
def member(org: str, uid: int) -> dict[str, Any]:
    return {"org": org, "uid": uid}


items.include_router(members)
app.include_router(items)
