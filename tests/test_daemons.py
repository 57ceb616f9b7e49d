"""The data-store fixtures start real servers that accept the documented credentials."""

from __future__ import annotations

import os

from tests.daemons import ServerInfo, talk


def test_postgres_accepts_the_documented_user(postgres_server: ServerInfo) -> None:
    import psycopg2

    s = postgres_server
    conn = psycopg2.connect(host=s.host, port=s.port, user=s.user, password=s.password, dbname=s.database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_user, current_database()")
            assert cur.fetchone() == (s.user, s.database)
    finally:
        conn.close()
    assert os.path.exists(f"/proc/{s.pid}")


def test_mariadb_accepts_the_documented_user(mariadb_server: ServerInfo) -> None:
    import pymysql

    s = mariadb_server
    conn = pymysql.connect(host=s.host, port=s.port, user=s.user, password=s.password, database=s.database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT DATABASE()")
            assert cur.fetchone() == (s.database,)
    finally:
        conn.close()


def test_redis_and_memcached_answer(redis_server: ServerInfo, memcached_server: ServerInfo) -> None:
    assert talk(redis_server.port, b"PING\r\n", b"+PONG")
    assert talk(memcached_server.port, b"version\r\n", b"VERSION ")
