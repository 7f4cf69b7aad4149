"""The SQL stores on a supplied connection (``backends.supply.ConnectionSupply``), as a
host other than Django would supply one: the conformance suite runs against them too.

The "host" here is a thread with one driver connection in autocommit; its "migrations"
are the core store's own layout, created once by the store that owns its connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import psycopg
from registry import backend_factory
from services import POSTGRES_URL
from stores_postgres import drop_schema, fresh_schema, require_postgres

from anarchon_core.backend import Backend
from anarchon_core.backends.postgres import PostgresBackend, SuppliedPostgresBackend
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.errors import BackendError

C = TypeVar("C")
T = TypeVar("T")


class ThreadSupply(Generic[C]):
    """One connection, made and used on one thread; driver errors become BackendError."""

    def __init__(self, connect: Callable[[], C], describe: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="supply")
        self._conn = self._executor.submit(connect).result()
        self._describe = describe

    @property
    def executor(self) -> Executor:
        return self._executor

    def describe(self) -> str:
        return self._describe

    def run(self, op: Callable[[C], T]) -> T:
        try:
            return op(self._conn)
        except (sqlite3.Error, psycopg.Error) as exc:
            raise BackendError(f"{self._describe}: {exc}") from exc

    def close(self) -> None:
        self._executor.submit(getattr(self._conn, "close")).result()  # noqa: B009
        self._executor.shutdown()


@backend_factory("sqlite-supplied")
@asynccontextmanager
async def _sqlite_supplied(tmp_path: Path) -> AsyncIterator[Backend]:
    path = tmp_path / "host.sqlite3"
    owner = SqliteBackend(path)  # the host's "migrations": the core's layout
    await owner.open()
    await owner.close()

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, timeout=5)

    supply: ThreadSupply[sqlite3.Connection] = ThreadSupply(connect, f"host sqlite {path}")
    backend = SqliteBackend(path, supply=supply)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()
        supply.close()


@backend_factory("postgres-supplied")
@asynccontextmanager
async def _postgres_supplied(tmp_path: Path) -> AsyncIterator[Backend]:
    require_postgres()
    schema = fresh_schema()
    owner = PostgresBackend(POSTGRES_URL, schema=schema)
    await owner.open()
    await owner.close()

    def connect() -> psycopg.Connection[Any]:
        return psycopg.connect(POSTGRES_URL, autocommit=True, options=f"-c search_path={schema}")

    supply: ThreadSupply[psycopg.Connection[Any]] = ThreadSupply(connect, f"host pg {schema}")
    backend = SuppliedPostgresBackend(supply)
    try:
        await backend.open()
        yield backend
    finally:
        await backend.close()
        supply.close()
        drop_schema(schema)
