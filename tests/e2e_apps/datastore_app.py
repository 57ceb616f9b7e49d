"""A Flask app for the data-store end-to-end test: each request of ``/order`` runs one
PostgreSQL query (psycopg2) and one Redis command, on per-worker connections opened after
the fork. The servers come from the environment (``DS_PG_DSN``, ``DS_REDIS_PORT``).
Answers ``"<worker pid> <trace id> <count>"``.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg2
import redis
from flask import Flask, Response

import swmp

app = Flask(__name__)
_conns: dict[str, Any] = {}


def _pg() -> Any:
    conn = _conns.get("pg")
    if conn is None:
        conn = _conns["pg"] = psycopg2.connect(os.environ["DS_PG_DSN"])
        conn.autocommit = True
    return conn


def _redis() -> Any:
    r = _conns.get("redis")
    if r is None:
        r = _conns["redis"] = redis.Redis(host="127.0.0.1", port=int(os.environ["DS_REDIS_PORT"]))
    return r


@app.after_request
def _name_worker(resp: Response) -> Response:
    resp.headers["X-Worker-Pid"] = str(os.getpid())
    return resp


@app.route("/order")
def order() -> str:
    with _pg().cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_class WHERE relkind = %s", ("r",))
        (tables,) = cur.fetchone()
    count = _redis().incr("e2e:orders")
    return f"{os.getpid()} {swmp.trace_id()} {count} {tables}"
