"""The Django ORM backend's own thread: one Django connection, never shared.

Django connections belong to the thread that opened them. Every store call runs on
one dedicated thread per backend, so the store has a connection of its own: not the
request's (an outer ``transaction.atomic()`` can neither wrap a claim nor be poisoned
by one) and not asgiref's shared sync thread (where a slow sync view would delay
heartbeats until backups take the run over). That connection is in autocommit, as
Django leaves it: each statement is its own transaction unless the store opens one.

Each call first checks the connection through Django (``get_autocommit()``, which
runs ``ensure_connection()``: a closed connection is opened again, with Django's
settings and ``init_command``) and that it is in autocommit and outside any ``atomic``
block. The statements themselves then run on the driver connection Django manages
(``connection.connection``: ``sqlite3`` / psycopg), not through Django's cursor
wrapper, whose Python per statement (a new cursor, thread checks, ``execute_wrapper``
hooks, the ``%s``→``?`` rewrite, the ``DEBUG`` query log) took about twice SQLite's own
work (see the Django section of ``docs/benchmarks.md``). So the store's statements do
not appear in ``connection.queries`` nor in ``execute_wrapper`` instrumentation. On
PostgreSQL the driver's errors become Django's through ``connection.wrap_database_errors``,
as in Django's cursor; on SQLite the decisions handle ``sqlite3`` errors themselves.

A connection that fails with ``OperationalError`` or ``InterfaceError`` is closed, so
the next call connects afresh; the call itself is repeated once at once when the
connection was found dead (a server restart, ``pg_terminate_backend``, a proxy's idle
timeout): every store operation is idempotent for its token (docs/guarantees.md). Django's
``CONN_HEALTH_CHECKS`` and ``CONN_MAX_AGE`` act at request boundaries, which this
thread never sees: its connection lives until it fails or the backend closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Generic, TypeVar, cast

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from anarchon_core.backends.supply import ConnectionSupply
from anarchon_core.errors import BackendError, BackendUnavailable

__all__ = ["Worker", "driver_supply", "sqlite_supply"]

T = TypeVar("T")
C = TypeVar("C")

logger = logging.getLogger("anarchon.backends.django")


class Worker:
    """One thread holding the connection of ``alias``; ``describe`` names it in errors."""

    def __init__(self, alias: str, describe: str) -> None:
        self.alias = alias
        self.describe = describe
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anarchon-django")

    async def call(self, op: Callable[[BaseDatabaseWrapper], T]) -> T:
        """Run ``op(connection)`` on the thread; errors arrive as the contract's errors."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.run, op)

    def run(self, op: Callable[[BaseDatabaseWrapper], T]) -> T:
        """``op(connection)``, on the thread (only): checks, conversion, one reconnect."""
        for retry in (False, True):
            conn = connections[self.alias]
            try:
                _check(conn, self.describe)
                return op(conn)
            except (OperationalError, InterfaceError) as exc:
                lost = _is_lost(conn)
                _drop(conn)
                if lost and not retry:
                    logger.warning(
                        "connection to %s lost (%s); retrying on a fresh connection",
                        self.describe,
                        str(exc).strip() or type(exc).__name__,
                    )
                    continue
                raise BackendUnavailable(f"{self.describe}: {_message(exc)}") from exc
            except DatabaseError as exc:
                raise BackendError(f"{self.describe}: {_message(exc)}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close the thread's connection (on the thread, its owner) and end the thread."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self._close_connection)
        finally:
            self.executor.shutdown(wait=True)

    def _close_connection(self) -> None:
        _drop(connections[self.alias])


class _Supply(Generic[C]):
    """The worker's connection as a core store's :class:`ConnectionSupply`: the store's
    operations get the driver connection (``raw``), checked through Django first."""

    def __init__(
        self, worker: Worker, raw: Callable[[BaseDatabaseWrapper, Callable[[C], Any]], Any]
    ) -> None:
        self._worker, self._raw = worker, raw

    @property
    def executor(self) -> Executor:
        return self._worker.executor

    def describe(self) -> str:
        return self._worker.describe

    def run(self, op: Callable[[C], T]) -> T:
        return cast(T, self._worker.run(lambda conn: self._raw(conn, op)))


def _on_sqlite(conn: BaseDatabaseWrapper, op: Callable[[sqlite3.Connection], T]) -> T:
    """``sqlite3`` errors reach the core's decisions as they are: they retry busy answers."""
    if conn.connection is None:  # pragma: no cover - the check has just connected
        conn.ensure_connection()
    return op(cast(sqlite3.Connection, conn.connection))


def _on_driver(conn: BaseDatabaseWrapper, op: Callable[[Any], T]) -> T:
    """Driver errors become Django's, so that a dead connection is found and replaced."""
    with conn.wrap_database_errors:
        return op(conn.connection)


def sqlite_supply(worker: Worker) -> ConnectionSupply[sqlite3.Connection]:
    """The worker's ``sqlite3`` connection (Django's settings, ``init_command`` and all)."""
    return _Supply(worker, _on_sqlite)


def driver_supply(worker: Worker) -> ConnectionSupply[Any]:
    """The worker's driver connection (psycopg, MySQLdb)."""
    return _Supply(worker, _on_driver)


def _check(conn: BaseDatabaseWrapper, describe: str) -> None:
    """The store's decisions are their own transactions: never inside someone's block."""
    if conn.in_atomic_block or not conn.get_autocommit():
        raise BackendError(
            f"{describe}: the store's thread is inside a transaction; the backend runs "
            f"in autocommit on its own connection and never inside transaction.atomic()"
        )


def _is_lost(conn: BaseDatabaseWrapper) -> bool:
    """Whether the driver connection is dead (psycopg says so; sqlite3 never dies so)."""
    raw = conn.connection
    if raw is None:
        return True
    return bool(getattr(raw, "broken", False) or getattr(raw, "closed", False))


def _drop(conn: BaseDatabaseWrapper) -> None:
    """Close the connection, whatever state it is in; the next call reconnects."""
    with contextlib.suppress(DatabaseError):
        conn.close()
    conn.connection = None  # even if closing failed: never reuse a broken one


def _message(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__
