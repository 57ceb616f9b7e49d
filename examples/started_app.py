"""Explicit start inside the WSGI module: no ``swmp run``, one call before the app is built.

    gunicorn -w 4 -b 127.0.0.1:8000 examples.started_app:app           # with or without --preload
    uwsgi --master --processes 4 --http-socket 127.0.0.1:8000 --module examples.started_app:app [--lazy-apps]

Where this module is imported decides where the agent starts, and swmp handles each case:

* in the master (Gunicorn ``--preload``, uWSGI without ``lazy-apps``): the master creates
  the arena and forks the reporter; workers take their ring after fork;
* in every worker (Gunicorn without ``--preload``, uWSGI ``--lazy-apps``): the first worker
  creates the arena (keyed by the master's pid) and starts a reporter detached from itself,
  the others attach: exactly one reporter, which outlives any worker and ends with the master.

Settings come from ``SW_*`` variables; keywords override them
(``swmp.start(agent_name="orders")``).
"""

from __future__ import annotations

import swmp

swmp.start()

from examples.app import app  # noqa: E402  (after start: Flask is instrumented when imported)

__all__ = ["app"]
