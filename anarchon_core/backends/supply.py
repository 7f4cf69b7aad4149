"""Connections that a host supplies to the core's SQL stores.

The SQLite and PostgreSQL stores open and own their connections. A host that already
manages connections to the same database, the Django ORM with its settings, its
reconnects and its migrations, gives the store one of its own instead: a
:class:`ConnectionSupply`. The store then runs every statement through
:meth:`ConnectionSupply.run`, on the supply's one thread, and never opens, closes or
lays out the database (the host's migrations create the tables). Its decisions are
the same statements either way, so the contract holds unchanged.

The tables a host's migrations create are the core's own, one schema per vendor:
:func:`layout` gives the core's statements that make them (the SQLite store's, the
PostgreSQL store's, and MySQL's of :mod:`anarchon_core.backends.mysql_layout`), with
one addition, a surrogate ``id`` primary key on every table for the host's admin (the
core's keys become unique constraints, which is all its ``ON CONFLICT`` clauses need;
no statement reads ``id``). The core's own stores lay out their tables without it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

from ..backend import SCHEMA_VERSION
from ..errors import BackendError, ConfigurationError, SchemaVersionError

__all__ = ["TABLES", "ConnectionSupply", "check_layout", "layout"]

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


#: The tables of the SQL stores' layout, which a host's migrations create.
TABLES = (
    "anarchon_meta",
    "anarchon_runs",
    "anarchon_attempts",
    "anarchon_jobs",
    "anarchon_instances",
)


def layout(vendor: str, *, schema: str = "public", mariadb: bool = False) -> list[str]:
    """The statements that create the store's tables for a host, on ``vendor``
    (Django's names: ``sqlite``, ``postgresql``, ``mysql``): the core's layout of that
    database with the surrogate ``id`` key. Idempotent: on tables that exist they add
    what a newer layout has (indexes, columns) and change nothing else.

    ``schema``: PostgreSQL's, where the tables go (the connection's ``current_schema()``;
    the PostgreSQL functions are not among them: the store creates them at open, named
    after a digest of their text). ``mariadb``: on ``mysql``, a MariaDB server (the
    binary collation of its key columns is named otherwise than MySQL's).

    :raises ConfigurationError: a vendor with no layout in the core.
    """
    if vendor == "sqlite":
        from .sqlite._sql import layout as sqlite_layout

        return [textwrap.dedent(text).strip() for text in sqlite_layout(surrogate_key=True)]
    if vendor == "postgresql":
        from .postgres._sql import Statements  # needs psycopg 3, as the store does

        statements = Statements(schema, "anarchon_", surrogate_key=True)
        # One statement each (a host may prepare them: no multiple commands then); the
        # layout's text holds no ';' but between its statements.
        tables = [text.strip() for text in statements.create_tables.split(";\n")]
        return [statements.create_meta.strip(), *tables]
    if vendor == "mysql":
        from .mysql_layout import layout as mysql_layout

        return mysql_layout(mariadb=mariadb)
    raise ConfigurationError(f"the core has no layout of its tables on {vendor!r}")


def check_layout(
    cursor: Any, tables: Iterable[str], *, where: str, migrate: str, mysql: bool = False
) -> None:
    """Check a host's migrated store on ``cursor`` (``%s`` parameters): every one of
    :data:`TABLES` is among the database's ``tables`` (``migrate`` says how to create
    them), and the schema version is known, recorded by the first check.

    :raises ConfigurationError: tables are missing.
    :raises SchemaVersionError: the store was written by a newer anarchon.
    """
    missing = sorted(set(TABLES) - set(tables))
    if missing:
        raise ConfigurationError(
            f"{where}: the anarchon tables {', '.join(missing)} do not exist: {migrate}"
        )
    key = "`key`" if mysql else "key"  # a reserved word on MySQL
    # Recorded once by the first open (a flush of the tables forgets it: set again).
    # On MySQL the row is also the store's lock (see anarchon_core.backends.mysql).
    cursor.execute(
        f"INSERT INTO anarchon_meta ({key}, value) VALUES ('schema_version', %s) "
        + ("ON DUPLICATE KEY UPDATE id = id" if mysql else "ON CONFLICT (key) DO NOTHING"),
        [str(SCHEMA_VERSION)],
    )
    cursor.execute(f"SELECT value FROM anarchon_meta WHERE {key} = 'schema_version'")
    row = cursor.fetchone()
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        raise BackendError(f"{where}: the store's schema version {row!r} is unreadable") from None
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: the store holds schema version {version}, newer than version "
            f"{SCHEMA_VERSION} known to this anarchon: upgrade anarchon to use it"
        )
