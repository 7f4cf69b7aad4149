"""The store's tables in this app's migrations: the core's layout, run as SQL.

One schema (``docs/django.md``, "The store in your database"): the core's statements
per database are the only definition of the tables (:func:`anarchon_core.backends.supply.layout`:
the core SQLite store's, the PostgreSQL store's, the core's MySQL layout; each with a
surrogate ``id`` key for the admin). A migration runs them with :class:`CoreLayout`, a
``RunSQL`` whose statements are the core's for the migrated database (its vendor, its
schema on PostgreSQL, its server's collation on MySQL/MariaDB), read when it runs, as
``sqlmigrate`` shows them. The models map the tables (``managed = False``).

Because the statements are idempotent (``IF NOT EXISTS``, as the core's stores run them
at every open), a later change of the core's layout is one more migration running
:class:`CoreLayout` again. The PostgreSQL functions are not in it: the store creates
them at open, named after a digest of their text.

``CoreLayout(upgrade=True)`` first brings tables made by this app's former migrations
(Django's ``CreateModel``, ``0001_initial`` to ``0004``) to the core's layout: the same
columns and keys already, they differ in indexes (and PostgreSQL in fill factors), and
on SQLite and MySQL in an unused ``requested_by`` column.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, router

from anarchon_core.backends.supply import TABLES, layout

__all__ = ["CoreLayout", "statements"]

#: The vendors the core has a layout for (Django's names).
VENDORS = ("sqlite", "postgresql", "mysql")


def _schema(connection: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        return str(cursor.fetchone()[0])


def _has_column(connection: Any, table: str, column: str) -> bool:
    with connection.cursor() as cursor:
        described = connection.introspection.get_table_description(cursor, table)
    return any(info.name == column for info in described)


def _former(connection: Any, schema: str) -> list[str]:
    """What turns tables made by the former migrations into the core's layout, before
    the layout's statements add what they lack."""
    vendor, quote = connection.vendor, connection.ops.quote_name
    if vendor == "postgresql":
        from anarchon_core.backends.postgres import FILL_FACTORS  # psycopg 3

        qualified = f"{quote(schema)}.{{}}".format
        return [
            # Django's (state, job); the layout's is partial, on (job, slot).
            f"DROP INDEX IF EXISTS {qualified(quote('anarchon_runs_open'))}",
            *(
                f"ALTER TABLE {qualified(quote('anarchon_' + table))} SET (fillfactor = {fill})"
                for table, fill in FILL_FACTORS.items()
            ),
        ]
    statements = []
    if vendor == "sqlite":
        # Django's (state, job) index; the layout's covers lease_expires too. SQLite's
        # statements keep one pending request per job under the file's write lock.
        statements += [
            "DROP INDEX IF EXISTS anarchon_runs_open",
            "DROP INDEX IF EXISTS anarchon_runs_pending",
        ]
    # Never written by the SQLite statements (who asked is kept in fingerprint). SQLite
    # drops a column from 3.35 on; before, the column stays, unmapped and unused.
    droppable = vendor == "mysql" or connection.Database.sqlite_version_info >= (3, 35)
    if droppable and _has_column(connection, "anarchon_runs", "requested_by"):
        statements.append(f"ALTER TABLE anarchon_runs DROP COLUMN {quote('requested_by')}")
    return statements


def statements(connection: Any, *, upgrade: bool = False) -> list[str]:
    """The core's layout for ``connection``'s database (none on a database the core has
    no layout for: the store refuses it at open); with ``upgrade``, preceded by what
    brings the former migrations' tables to it."""
    vendor = connection.vendor
    if vendor not in VENDORS:
        return []
    schema = _schema(connection) if vendor == "postgresql" else "public"
    mariadb = vendor == "mysql" and bool(connection.mysql_is_mariadb)
    former = _former(connection, schema) if upgrade else []
    return [*former, *layout(vendor, schema=schema, mariadb=mariadb)]


def _execute(schema_editor: Any, texts: list[str]) -> None:
    """Each statement in turn, as ``RunSQL`` runs a list (``sqlmigrate`` collects them)."""
    for text in texts:
        schema_editor.execute(text, params=None)


class CoreLayout(migrations.RunSQL):
    """``RunSQL`` of the core's layout on the migrated database (see the module).

    Backwards, the initial migration's drops the tables (as Django's ``DeleteModel``
    would); the upgrade's changes nothing (the layout serves the former state's models).
    """

    def __init__(self, *, upgrade: bool = False) -> None:
        self.upgrade = upgrade
        super().__init__(sql=migrations.RunSQL.noop, reverse_sql=migrations.RunSQL.noop)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__name__, [], {"upgrade": True} if self.upgrade else {}

    def describe(self) -> str:
        if self.upgrade:
            return "Bring the former tables to the core's layout of the anarchon store"
        return "Create the anarchon store's tables: the core's layout of this database"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        connection = schema_editor.connection
        if router.allow_migrate(connection.alias, app_label, **self.hints):
            _execute(schema_editor, statements(connection, upgrade=self.upgrade))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        connection = schema_editor.connection
        if self.upgrade or not router.allow_migrate(connection.alias, app_label, **self.hints):
            return
        if connection.vendor in VENDORS:
            quote = connection.ops.quote_name
            drops = [f"DROP TABLE IF EXISTS {quote(table)}" for table in reversed(TABLES)]
            _execute(schema_editor, drops)
