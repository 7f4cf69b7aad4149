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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from anarchon_core.errors import BackendError, BackendUnavailable

__all__ = ["Worker"]

T = TypeVar("T")

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
