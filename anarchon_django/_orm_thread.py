"""The Django ORM backend's own thread: one Django connection, never shared.

Every store call runs on one dedicated thread per backend, so the store has a
connection of its own: not the request's (an outer ``transaction.atomic()`` can neither
wrap a claim nor be poisoned by one) and not asgiref's shared sync thread (where a slow
view would delay heartbeats). Each call first checks it through Django (reconnecting a
closed one; autocommit, outside any ``atomic`` block), then runs the store's statements
on the driver connection Django manages, past its cursor wrapper (docs/django.md,
"Performance"). A connection failing with ``OperationalError`` or ``InterfaceError`` is
closed, and a call that found it dead is repeated once at once on a fresh one (every
store operation is idempotent for its token). It lives until it fails or the backend
closes: ``CONN_MAX_AGE`` acts at request boundaries, which this thread never sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from anarchon_core.errors import BackendError, BackendUnavailable

__all__ = ["Worker"]

T = TypeVar("T")

logger = logging.getLogger("anarchon.backends.django")


class Worker:
    """One thread holding the connection of ``alias`` (``where`` names it in errors): the
    core store's :class:`~anarchon_core.backends.supply.ConnectionSupply`."""

    def __init__(self, alias: str, where: str) -> None:
        self.alias = alias
        self.where = where
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anarchon-django")

    def describe(self) -> str:
        return self.where

    async def call(self, op: Callable[[BaseDatabaseWrapper], T]) -> T:
        """Run ``op(connection)`` on the thread; errors arrive as the contract's errors."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.on_django, op)

    def run(self, op: Callable[[Any], T]) -> T:
        """``op(driver connection)``, on the thread: its errors become Django's, so that
        a dead connection is found and replaced, except ``sqlite3``'s (the core's
        decisions retry busy answers themselves)."""

        def raw(conn: BaseDatabaseWrapper) -> T:
            if conn.vendor == "sqlite":
                return op(conn.connection)
            with conn.wrap_database_errors:
                return op(conn.connection)

        return self.on_django(raw)

    def on_django(self, op: Callable[[BaseDatabaseWrapper], T]) -> T:
        """``op(connection)``, on the thread (only): checks, conversion, one reconnect."""
        for retry in (False, True):
            conn = connections[self.alias]
            try:
                # The store's decisions are their own transactions: never inside a block.
                if conn.in_atomic_block or not conn.get_autocommit():
                    raise BackendError(
                        f"{self.where}: the store's thread is inside a transaction; the "
                        f"backend runs in autocommit on its own connection and never inside "
                        f"transaction.atomic()"
                    )
                return op(conn)
            except (OperationalError, InterfaceError) as exc:
                raw = conn.connection  # dead if psycopg says so (sqlite3 never dies so)
                lost = raw is None or getattr(raw, "broken", False) or getattr(raw, "closed", 0)
                _drop(conn)
                if lost and not retry:
                    logger.warning(
                        "connection to %s lost (%s); retrying on a fresh connection",
                        self.where,
                        _message(exc),
                    )
                    continue
                raise BackendUnavailable(f"{self.where}: {_message(exc)}") from exc
            except DatabaseError as exc:
                raise BackendError(f"{self.where}: {_message(exc)}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close the thread's connection (on the thread, its owner) and end the thread."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, lambda: _drop(connections[self.alias]))
        finally:
            self.executor.shutdown(wait=True)


def _drop(conn: BaseDatabaseWrapper) -> None:
    """Close the connection, whatever state it is in; the next call reconnects."""
    with contextlib.suppress(DatabaseError):
        conn.close()
    conn.connection = None  # even if closing failed: never reuse a broken one


def _message(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__
