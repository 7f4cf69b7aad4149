"""The PostgreSQL contract on a host's own connection (a :class:`ConnectionSupply`).

The statements are :class:`~._sql.Statements`, the same as :class:`PostgresBackend`
sends through its pool: one statement and one round trip per decision, in
autocommit, every time read from ``clock_timestamp()`` inside the statement. The
host's migrations made the tables (in the connection's ``current_schema()``); the
functions are created at :meth:`SuppliedPostgresBackend.open` when missing, under the
layout's advisory lock, named after a digest of their text (a rolling upgrade that
changes them adds new ones beside the old).

Statements go through one plain ``psycopg.Cursor`` per driver connection (a reconnect
gets a new one): server-side binding, as the pooled store sends them, whatever the
host's own cursors do. Prepared statements follow the connection's
``prepare_threshold``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from psycopg import pq

from ...backend import Capabilities
from ...errors import BackendError, ConfigurationError
from ..supply import ConnectionSupply
from ._contract import Params, PostgresContract
from ._sql import Statements

__all__ = ["SuppliedPostgresBackend"]

Rows = list[tuple[Any, ...]]
_TUPLES_OK = pq.ExecStatus.TUPLES_OK

_COUNT_FUNCTIONS = """SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %s AND p.proname = ANY(%s)"""


class SuppliedPostgresBackend(PostgresContract):
    """The contract on PostgreSQL, each method one statement on ``supply``'s connection."""

    capabilities = Capabilities(
        lease=True, store_clock=True, finish=True, finish_in_transaction=True
    )
    name = "postgresql"

    def __init__(
        self,
        supply: ConnectionSupply[psycopg.Connection[Any]],
        *,
        table_prefix: str = "anarchon_",
        prune_batch: int = 1000,
    ) -> None:
        self._supply = supply
        self.table_prefix = table_prefix
        self.prune_batch = prune_batch
        self._raw: Any = None
        self._cursor: psycopg.Cursor[Any] | None = None
        self._opened = False

    def describe(self) -> str:
        return self._supply.describe()

    async def open(self) -> None:
        """Render the statements for the connection's schema; create missing functions."""
        if not self._opened:
            self.sql = await self._call(self._prepare)
            self._opened = True

    async def close(self) -> None:
        """Nothing to free: the connection is the host's."""
        self._opened = False

    def _prepare(self, conn: psycopg.Connection[Any]) -> Statements:
        rows = self._query(conn, "SELECT current_schema()")
        schema = rows[0][0] if rows else None
        if not schema:
            raise ConfigurationError(
                f"{self.describe()}: no schema on the search_path: run the host's migrations"
            )
        statements = Statements(schema, self.table_prefix)
        found = self._query(conn, _COUNT_FUNCTIONS, (schema, statements.function_names))
        if found[0][0] != len(statements.function_names):
            # Serialised across instances (concurrent CREATE OR REPLACE FUNCTION fails).
            with conn.transaction():
                self._query(conn, statements.lock_layout)
                for create in statements.create_functions:
                    self._query(conn, create)
        return statements

    def _query(
        self, conn: psycopg.Connection[Any], text: str, params: Params | None = None
    ) -> Rows:
        """One statement on the connection's own cursor: its rows (none without a result)."""
        cur = self._cursor
        if cur is None or conn is not self._raw or cur.closed:
            cur = self._cursor = psycopg.Cursor(conn)
            self._raw = conn
        cur.execute(text, params)
        result = cur.pgresult  # cheaper than cur.description, which builds columns
        has_rows = result is not None and result.status == _TUPLES_OK
        return cur.fetchall() if has_rows else []

    async def _call(self, op: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._supply.executor, self._supply.run, op)

    async def _rows(self, query: str, params: Params | None = None) -> Rows:
        if not self._opened:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        rows: Rows = await self._call(partial(self._query, text=query, params=params))
        return rows
