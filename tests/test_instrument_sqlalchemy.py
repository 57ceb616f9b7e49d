"""SQLAlchemy needs no instrumentation of its own: over an instrumented driver (psycopg 3,
PyMySQL) its Core and ORM calls show up as the driver's spans, and its connection pool keeps
working across fork (the SQLAlchemy-documented ``dispose(close=False)`` in the child)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from swmp.tracing import Component, Layer
from tests.daemons import ServerInfo
from tests.datastore_support import Traced, traced

__all__ = ["traced"]


def _url(kind: str, s: ServerInfo) -> str:
    driver = "postgresql+psycopg" if kind == "pg" else "mysql+pymysql"
    return f"{driver}://{s.user}:{s.password}@{s.host}:{s.port}/{s.database}"


def _server(kind: str, request: pytest.FixtureRequest) -> ServerInfo:
    return request.getfixturevalue("postgres_server" if kind == "pg" else "mariadb_server")  # type: ignore[no-any-return]


_EXPECT = {"pg": ("PostgreSQL/Psycopg/", Component.PSYCOPG), "my": ("Mysql/PyMsql/", Component.PYMYSQL)}


@pytest.mark.parametrize("kind", ["pg", "my"])
def test_core_and_orm_are_seen_through_the_driver(
    traced: Traced, kind: str, request: pytest.FixtureRequest
) -> None:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session, declarative_base

    s = _server(kind, request)
    table = f"sa_items_{kind}"

    Base: Any = declarative_base()

    class Item(Base):
        __tablename__ = table
        id = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
        name = sa.Column(sa.String(20))

    engine = sa.create_engine(_url(kind, s))
    try:
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)
        with traced.trace() as got:
            with engine.begin() as conn:  # Core
                conn.execute(
                    sa.text(f"INSERT INTO {table} (id, name) VALUES (:i, :n)"), {"i": 1, "n": "core"}
                )
                assert conn.execute(sa.select(Item.__table__.c.name)).scalar_one() == "core"
            with Session(engine) as session:  # ORM
                session.add(Item(id=2, name="orm"))
                session.commit()
                assert [i.name for i in session.scalars(sa.select(Item).order_by(Item.id))] == ["core", "orm"]
        prefix, component = _EXPECT[kind]
        assert got.exits, "no span recorded"
        assert all(e.op.startswith(prefix) and e.component == component for e in got.exits)
        assert all(e.layer == Layer.DATABASE and e.peer == f"127.0.0.1:{s.port}" for e in got.exits)
        statements = " | ".join(e.tags["db.statement"] for e in got.exits)
        assert f"INSERT INTO {table} (id, name) VALUES" in statements
        assert statements.count("SELECT") >= 2
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["pg", "my"])
def test_pool_across_fork(traced: Traced, kind: str, request: pytest.FixtureRequest) -> None:
    import sqlalchemy as sa

    s = _server(kind, request)
    engine = sa.create_engine(_url(kind, s), pool_size=2)
    try:
        with engine.connect() as conn:  # the pool now holds a connection opened before fork
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        pid = os.fork()
        if pid == 0:  # the child: report through its exit status only
            code = 3
            try:
                engine.dispose(close=False)  # SQLAlchemy's rule: never reuse the parent's sockets
                with traced.trace() as got, engine.connect() as conn:
                    value = conn.execute(sa.text("SELECT 40 + 2")).scalar()
                prefix, _ = _EXPECT[kind]
                # (a fresh MySQL connection also runs the dialect's own set-up statements)
                ok = value == 42 and "SELECT 40 + 2" in [e.tags["db.statement"] for e in got.exits]
                code = 0 if ok and all(e.op.startswith(prefix) for e in got.exits) else 4
            except BaseException:
                code = 5
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with traced.trace() as got, engine.connect() as conn:  # the parent's pool is intact
            assert conn.execute(sa.text("SELECT 2")).scalar() == 2
        assert [e.tags["db.statement"] for e in got.exits] == ["SELECT 2"]
    finally:
        engine.dispose()
