"""The data-store instrumentations install lazily: nothing of a driver is imported at agent
start, and each one is patched when the application imports it (a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = {
    "psycopg2": "psycopg2",
    "psycopg": "psycopg",
    "asyncpg": "asyncpg",
    "pymysql": "pymysql",
    "mysqlclient": "MySQLdb",
    "aiomysql": "aiomysql",
    "redis": "redis",
    "pymemcache": "pymemcache",
}

CHILD = """
import importlib, json, sys
from swmp import instrument
from swmp.config import load
drivers = json.loads(sys.argv[1])
status = instrument.install_all(load({}, agent_log_reporter_active=False))
before = {n: status.get(n) for n in drivers}
preloaded = sorted(m for m in drivers.values() if m in sys.modules)
for module in drivers.values():
    importlib.import_module(module)
after = {n: instrument.statuses().get(n) for n in drivers}
from psycopg2.extensions import connection
import psycopg, redis.client, pymemcache.client.base, pymysql.cursors, MySQLdb.cursors
patched = all(hasattr(f, "__swmp_original__") for f in (
    psycopg.Cursor.execute, redis.client.Redis.execute_command, pymemcache.client.base.Client.get,
    pymysql.cursors.Cursor.execute, MySQLdb.cursors.BaseCursor.execute))
print(json.dumps({"before": before, "preloaded": preloaded, "after": after, "patched": patched}))
"""


def test_drivers_are_patched_when_imported_not_before() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(DRIVERS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["preloaded"] == []
    assert got["before"] == dict.fromkeys(DRIVERS, "deferred")
    assert got["after"] == dict.fromkeys(DRIVERS, "installed")
    assert got["patched"] is True
