"""The Django ORM backend on SQLite: the core SQLite backend's decisions on Django's connection.

The tables are the core's (see :mod:`anarchon_django.models`), so every decision of
:class:`~anarchon_core.backends.sqlite.SqliteBackend` applies unchanged: this class
inherits them and replaces only the plumbing. Statements go through Django's cursor
(its ``?`` placeholders pass Django's ``%s`` conversion untouched), on the backend's
own thread, in Django's autocommit mode.

Atomicity is the core's: each decision runs under SQLite's write lock (``BEGIN
IMMEDIATE`` … ``COMMIT``, decisions queued together sharing one transaction, each in
its own savepoint), so processes sharing the file serialise exactly where they must;
a claim that can only lose reads the run without taking the lock. The store's clock
is the host's wall clock read under the lock (what SQLite's own ``'now'`` reads too).
Busy answers are retried within Django's ``OPTIONS["timeout"]`` (default 5 s).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from anarchon_core.backends._sqlite_batch import Decision, WriteQueue, execute_batch, retry_busy
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.errors import BackendError

from ._orm_thread import Worker

__all__ = ["OrmSqliteStore"]

T = TypeVar("T")

_DEFAULT_TIMEOUT_S = 5.0  # sqlite3.connect's, which Django keeps unless OPTIONS say otherwise


class DjangoSqliteConnection:
    """Django's SQLite connection shaped as the ``sqlite3.Connection`` the decisions use.

    Each ``execute`` is one Django cursor. Django wraps driver errors in its own
    classes; the decisions and their busy retries expect the driver's, so the original
    ``sqlite3`` error is raised again.
    """

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self._wrapper = wrapper

    def execute(self, query: str, params: Any = ()) -> Any:
        cursor = self._wrapper.cursor()
        try:
            cursor.execute(query, params)
        except DatabaseError as exc:
            if isinstance(exc.__cause__, sqlite3.Error):
                raise exc.__cause__ from None
            raise
        return cursor

    @property
    def in_transaction(self) -> bool:
        raw = self._wrapper.connection
        return raw is not None and bool(raw.in_transaction)


def _as_sqlite(wrapper: BaseDatabaseWrapper) -> sqlite3.Connection:
    # The decisions use only execute() and in_transaction, which the adapter provides.
    return cast(sqlite3.Connection, DjangoSqliteConnection(wrapper))


class OrmSqliteStore(SqliteBackend):
    """:class:`SqliteBackend` whose statements run on a :class:`Worker`'s Django connection."""

    name = "django"

    def __init__(self, worker: Worker, settings: dict[str, Any]) -> None:
        timeout = (settings.get("OPTIONS") or {}).get("timeout", _DEFAULT_TIMEOUT_S)
        super().__init__(
            str(settings.get("NAME") or "django"), busy_timeout_ms=max(1, int(timeout * 1000))
        )
        self._worker = worker

    def describe(self) -> str:
        return self._worker.describe

    async def open(self) -> None:
        """Start the write queue on the worker's thread (the layout is the migrations')."""
        self._queue = WriteQueue(self._worker.executor, self._execute_batch)

    async def close(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.drain()

    def _execute_batch(self, batch: list[Decision[Any]]) -> list[Any]:
        def run(wrapper: BaseDatabaseWrapper) -> list[Any]:
            return execute_batch(
                _as_sqlite(wrapper), batch, timeout_ms=self.busy_timeout_ms, convert=self._convert
            )

        return self._worker.run(run)

    async def _call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._queue is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")

        def run(wrapper: BaseDatabaseWrapper) -> T:
            return retry_busy(
                partial(op, _as_sqlite(wrapper)),
                timeout_ms=self.busy_timeout_ms,
                convert=self._convert,
            )

        return await self._worker.call(run)
