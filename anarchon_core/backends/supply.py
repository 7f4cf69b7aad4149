"""Connections that a host supplies to the core's SQL stores.

The SQLite and PostgreSQL stores open and own their connections. A host that already
manages connections to the same database, the Django ORM with its settings, its
reconnects and its migrations, gives the store one of its own instead: a
:class:`ConnectionSupply`. The store then runs every statement through
:meth:`ConnectionSupply.run`, on the supply's one thread, and never opens, closes or
lays out the database (the host's migrations create the tables). Its decisions are
the same statements either way, so the contract holds unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol, TypeVar

__all__ = ["ConnectionSupply"]

C = TypeVar("C", covariant=True)
T = TypeVar("T")


class ConnectionSupply(Protocol[C]):
    """One connection of the host's, used from one thread: ``C`` is its driver's type
    (``sqlite3.Connection`` for the SQLite store, ``psycopg.Connection`` for PostgreSQL)."""

    @property
    def executor(self) -> Executor:
        """The one thread that every :meth:`run` happens on (the store submits to it)."""
        ...

    def describe(self) -> str:
        """The store as messages name it, with no secret (``django://default (sqlite …)``)."""
        ...

    def run(self, op: Callable[[C], T]) -> T:
        """``op(connection)``, called on :attr:`executor`'s thread.

        The connection is checked first (reconnected if it was lost) and in autocommit,
        outside any transaction of the host's: each statement the store sends is its
        own transaction unless the store opens one. Errors the operation does not handle
        itself arrive as :class:`~anarchon_core.errors.BackendUnavailable` (connection
        problems: retried by the engine) or :class:`~anarchon_core.errors.BackendError`.
        """
        ...
