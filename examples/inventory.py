"""The second service of ``swmp demo``: the example app's ``/call`` fans out to it.

    DOWNSTREAM_URL=http://127.0.0.1:8001/stock swmp run -- gunicorn -w 4 examples.app:app
    swmp run -- gunicorn -w 2 -b 127.0.0.1:8001 examples.inventory:app

``/stock?item=NAME`` answers a stock count after a little work, and fails (HTTP 500, an
error span) for the item ``discontinued``, so a demo trace shows an error crossing services.
"""

from __future__ import annotations

import hashlib
import logging

from flask import Flask, request

app = Flask(__name__)
log = logging.getLogger("inventory")


@app.route("/stock")
def stock() -> str:
    item = request.args.get("item", "widget")
    if item == "discontinued":
        log.error("no stock record for %s", item)
        raise LookupError(f"{item} is no longer stocked")
    digest = hashlib.sha256(item.encode()).digest()
    for _ in range(300):
        digest = hashlib.sha256(digest).digest()
    return f"{item}: {digest[0]} in stock"
