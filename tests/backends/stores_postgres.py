"""PostgreSQL for the shared suites: every test gets a fresh random schema, dropped after.

The server is ``services.POSTGRES_URL`` (``$ANARCHON_TEST_POSTGRES``); when it does not
answer, the tests skip (or fail under ``ANARCHON_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from registry import backend_factory, lease_url_factory
from services import POSTGRES_URL, service_unreachable

from anarchon_core.backend import Backend
from anarchon_core.backends.postgres import PostgresBackend

_reachable: str | None = None  # "" once the server answered, else why it did not


def require_postgres() -> None:
    """Skip (or fail under CI) unless the test server answers; asked once per session."""
    global _reachable
    if _reachable is None:
        try:
            with psycopg.connect(POSTGRES_URL, connect_timeout=3):
                _reachable = ""
        except psycopg.Error as exc:
            _reachable = str(exc).strip() or type(exc).__name__
    if _reachable:
        service_unreachable("PostgreSQL", f"{POSTGRES_URL} does not answer: {_reachable}")


def fresh_schema() -> str:
    return f"anarchon_t_{secrets.token_hex(6)}"


def url_with(**params: str) -> str:
    """The test server's URL with extra query parameters."""
    parts = urlsplit(POSTGRES_URL)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


def drop_schema(schema: str) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SET lock_timeout = '20s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@backend_factory("postgres")
@asynccontextmanager
async def _postgres(tmp_path: Path) -> AsyncIterator[Backend]:
    require_postgres()
    schema = fresh_schema()
    backend = PostgresBackend(POSTGRES_URL, schema=schema, max_size=6)
    try:
        await backend.open()
        yield backend
    finally:
        await backend.close()
        drop_schema(schema)


@lease_url_factory("postgres")
@contextmanager
def _postgres_url(tmp_path: Path) -> Iterator[str]:
    require_postgres()
    schema = fresh_schema()
    try:
        yield url_with(schema=schema)
    finally:
        drop_schema(schema)
