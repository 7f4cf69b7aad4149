"""The Django ORM backend on PostgreSQL: the core PostgreSQL backend's statements via Django.

The tables are the core's (see :mod:`anarchon_django.models`), so the statements of
:class:`~anarchon_core.backends.postgres._sql.Statements` run on them unchanged, one
statement and one round trip per decision, in autocommit:

- the claim calls the core's PL/pgSQL function: ``INSERT … ON CONFLICT DO NOTHING``
  on the run's key decides between concurrent claims, and the function reports
  won/taken/skipped/paused/expired/early in the same round trip, so a loser writes
  nothing, logs nothing and never poisons a transaction;
- heartbeat, finish, release and cancel are single conditional ``UPDATE``s (CTEs)
  whose matched rows are the verdict; the takeover is a compare-and-set in its
  function;
- every time is ``clock_timestamp()`` in epoch ms, read inside the statement: leases
  are judged by the database's clock, and not by ``now()``, which is frozen at the
  start of a transaction.

Batches are the core's too: ``claim_many`` one call of its batch function, ``finish_many``
one statement, each a single round trip.

The tables come from the migrations; the functions are created at open when
missing (named after a digest of their text, as the core does, so a rolling upgrade
that changes them adds new ones beside the old). The rendering needs psycopg 3.

The statements run on the psycopg connection Django manages for the backend's thread
(``connection.connection``, checked and reconnected through Django before each call:
see :mod:`._orm_thread`), through one plain ``psycopg.Cursor`` kept for it, and not
Django's cursor wrapper: they are the core's, written for server-side binding, so
they are sent with their parameters bound by the server (as the core backend sends
them) whatever ``OPTIONS["server_side_binding"]`` says for Django's own queries.
Prepared statements follow Django's setting: none by default (Django turns psycopg's
preparation off to keep transaction-mode poolers working), the hot statements
prepared after ``OPTIONS["prepare_threshold"]`` executions when it is set. Driver
errors become Django's (``wrap_database_errors``), so a dead connection is detected
and replaced as before.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import psycopg
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import pq

from anarchon_core.backend import Capabilities
from anarchon_core.backends.postgres._contract import PostgresContract
from anarchon_core.backends.postgres._sql import Statements
from anarchon_core.errors import ConfigurationError

from ._orm_thread import Worker

__all__ = ["OrmPostgresStore"]

Rows = list[tuple[Any, ...]]

#: The table prefix of the models' ``db_table`` (the core's default).
PREFIX = "anarchon_"
_TUPLES_OK = pq.ExecStatus.TUPLES_OK


class _Cursors:
    """One server-binding cursor per driver connection (a reconnect gets a new one)."""

    __slots__ = ("cursor", "raw")

    def __init__(self) -> None:
        self.raw: Any = None
        self.cursor: psycopg.Cursor[Any] | None = None

    def query(self, conn: BaseDatabaseWrapper, text: str, params: Any = None) -> tuple[Rows, int]:
        """One statement: its rows (none for a statement without a result) and row count."""
        raw = conn.connection
        cur = self.cursor
        if cur is None or raw is not self.raw or cur.closed:
            cur = self.cursor = psycopg.Cursor(raw)
            self.raw = raw
        with conn.wrap_database_errors:
            cur.execute(text, params)
            result = cur.pgresult  # cheaper than cur.description, which builds columns
            has_rows = result is not None and result.status == _TUPLES_OK
            return (cur.fetchall() if has_rows else []), cur.rowcount


class OrmPostgresStore(PostgresContract):
    """The contract on PostgreSQL, each method one statement on the worker's connection."""

    capabilities = Capabilities(lease=True, store_clock=True, finish=True)
    name = "django"

    def __init__(self, worker: Worker, *, prune_batch: int = 1000) -> None:
        self._worker = worker
        self.prune_batch = prune_batch
        self._cursors = _Cursors()

    def describe(self) -> str:
        return self._worker.describe

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Render the statements for the tables' schema; create missing functions."""
        self.sql = await self._worker.call(self._prepare)

    async def close(self) -> None:
        """Nothing to free: the connection belongs to the worker thread."""

    def _prepare(self, conn: BaseDatabaseWrapper) -> Statements:
        _query = self._cursors.query
        rows, _ = _query(conn, "SELECT current_schema()")
        schema = rows[0][0] if rows else None
        if not schema:
            raise ConfigurationError(
                f"{self.describe()}: no schema on the search_path: run manage.py migrate"
            )
        statements = Statements(schema, PREFIX)
        count = """SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = %s AND p.proname = ANY(%s)"""
        found = _query(conn, count, (schema, statements.function_names))[0][0][0]
        if found != len(statements.function_names):
            # Serialised across instances (concurrent CREATE OR REPLACE FUNCTION fails).
            with transaction.atomic(using=conn.alias):
                _query(conn, statements.lock_layout)
                for create in statements.create_functions:
                    _query(conn, create)
        return statements

    async def _rows(self, text: str, params: Any = None) -> Rows:
        return (await self._worker.call(partial(self._cursors.query, text=text, params=params)))[0]
