"""The Django ORM backend on SQLite: the core SQLite backend's decisions on Django's connection.

The tables are the core's (see :mod:`anarchon_django.models`), so every decision of
:class:`~anarchon_core.backends.sqlite.SqliteBackend` applies unchanged: this class
inherits them and replaces only the plumbing: the decisions run on the ``sqlite3``
connection Django opened for the backend's own thread (``connection.connection``, with
Django's settings, ``init_command`` and converters), in Django's autocommit mode
(``isolation_level=None``: no implicit transactions), as they run on the core's own
connection. The worker checks it through Django before each batch (see
:mod:`._orm_thread`); its statements skip Django's cursor wrapper, whose Python per
statement cost about twice SQLite's own work, and raise ``sqlite3`` errors, which the
decisions' busy retries expect.

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

from django.db.backends.base.base import BaseDatabaseWrapper

from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.backends.sqlite._batch import Decision, WriteQueue, execute_batch, retry_busy
from anarchon_core.errors import BackendError

from ._orm_thread import Worker

__all__ = ["OrmSqliteStore"]

T = TypeVar("T")

_DEFAULT_TIMEOUT_S = 5.0  # sqlite3.connect's, which Django keeps unless OPTIONS say otherwise


def _as_sqlite(wrapper: BaseDatabaseWrapper) -> sqlite3.Connection:
    """The ``sqlite3`` connection Django manages (opened by the worker's check)."""
    raw = wrapper.connection
    if raw is None:  # pragma: no cover - Worker.run's check has just connected
        wrapper.ensure_connection()
        raw = wrapper.connection
    return cast(sqlite3.Connection, raw)


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
