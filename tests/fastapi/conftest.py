"""Async tests of this directory run in ``asyncio.run`` (no pytest plugin needed)."""

from __future__ import annotations

import asyncio
import inspect
import secrets
from typing import Any

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True


# -- stores for the multi-worker tests ------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A fresh store of each kind: a SQLite file, a PostgreSQL schema, a Redis prefix."""
    yield from _store(request.param, tmp_path)


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def _store(kind: str, tmp_path: Any) -> Any:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite3'}"
    elif kind == "postgres":
        import psycopg
        from psycopg import sql
        from services import POSTGRES_URL, service_unreachable

        try:
            with psycopg.connect(POSTGRES_URL, connect_timeout=3):
                pass
        except psycopg.Error as exc:
            service_unreachable("PostgreSQL", f"{POSTGRES_URL} does not answer: {exc}")
        schema = f"anarchon_fa_{secrets.token_hex(6)}"
        sep = "&" if "?" in POSTGRES_URL else "?"
        try:
            yield f"{POSTGRES_URL}{sep}schema={schema}"
        finally:
            with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )
    else:
        from redis_servers import delete_prefix, fresh_prefix, shared_redis_url, with_params

        url = shared_redis_url()  # skips (or fails under CI) when the server is down
        prefix = fresh_prefix()
        try:
            yield with_params(url, strategy="lease", prefix=prefix)
        finally:
            delete_prefix(url, prefix)
