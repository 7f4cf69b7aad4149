"""One schema: the ORM store's tables are the core store's own layout.

The core's statements per database are the one definition of the tables
(:func:`anarchon_core.backends.supply.layout`); this app's migrations run them and the
models map them (``managed = False``). Guarded here, on the test database:

- The migrated tables are the core store's layout: the core store creates its own beside
  them (another file on SQLite, another schema on PostgreSQL) and every table is
  compared column by column (type, nullability, default, collation), key by key and,
  on SQLite and PostgreSQL, index by index. MySQL/MariaDB has no store of its own: the
  ORM store runs the core SQLite store's statements there, so its tables are compared
  with the core SQLite layout (types by SQLite's affinity, the keys; the exact collation
  of the key columns is ``test_orm_mysql``'s). The one difference meant is
  :data:`EXTRA_COLUMNS`, the admin's surrogate ``id``.
- The models map the tables: every column (but :data:`UNMAPPED`), nullable alike.
- A database that the former migrations made (``django_project.former_migrations``:
  Django's ``CreateModel`` tables, either ``0001``) upgrades with ``migrate`` alone to
  exactly a new install's layout, its rows kept; ``migrate`` then has nothing left to
  do and ``makemigrations --check`` finds no change.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection

from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.backends.supply import TABLES

pytestmark = pytest.mark.django_db(transaction=True)

#: Columns of the migrated tables that the core's layout does not have.
EXTRA_COLUMNS = {
    # A surrogate key for every table: the admin cannot show composite keys.
    **{(table, "id"): "the admin's surrogate key" for table in TABLES},
}
#: Columns of the layout that no model maps: not in every database's layout.
UNMAPPED = {("anarchon_runs", "requested_by"): "PostgreSQL's (SQLite's is fingerprint)"}

Column = tuple[str, bool, str | None, str | None]  # kind, nullable, default, collation


# -- SQLite ----------------------------------------------------------------------------
def _affinity(declared: str) -> str:
    """SQLite's type affinity of a declared type (its documented rules, in order)."""
    text = declared.upper()
    if "INT" in text:
        return "integer"
    if any(word in text for word in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if "BLOB" in text or not text:
        return "blob"
    if any(word in text for word in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


def _sqlite_default(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip("()")  # Django writes db_default as an expression in parentheses
    return {"false": "0", "true": "1"}.get(value.lower(), value).strip("'\"")


def sqlite_layout(conn: Any) -> dict[str, dict[str, Column]]:
    tables: dict[str, dict[str, Column]] = {}
    for table in TABLES:
        columns: dict[str, Column] = {}
        for _cid, name, declared, notnull, default, pk in conn.execute(
            f"PRAGMA table_info({table})"
        ).fetchall():
            kind = _affinity(declared)
            if declared.upper() == "BOOL":
                kind = "integer"  # SQLite has no booleans: 0 and 1
            nullable = not (notnull or pk)
            columns[name] = (kind, nullable, _sqlite_default(default), None)
        tables[table] = columns
    return tables


def sqlite_keys(conn: Any) -> dict[str, set[tuple[str, ...]]]:
    """Every unique key of each table, as its column tuples (partial ones included)."""
    keys: dict[str, set[tuple[str, ...]]] = {}
    for table in TABLES:
        found: set[tuple[str, ...]] = set()
        for _seq, name, unique, _origin, _partial in conn.execute(
            f"PRAGMA index_list({table})"
        ).fetchall():
            if unique:
                info = conn.execute(f"PRAGMA index_info({name})").fetchall()
                found.add(tuple(row[2] for row in info))
        keys[table] = found - {("id",)}
    return keys


def sqlite_indexes(conn: Any) -> set[tuple[Any, ...]]:
    """Every index made by ``CREATE INDEX``: name, table, unique, partial, key columns."""
    found = set()
    for table in TABLES:
        for _seq, name, unique, origin, partial in conn.execute(
            f"PRAGMA index_list({table})"
        ).fetchall():
            if origin == "c":
                info = conn.execute(f"PRAGMA index_xinfo({name})").fetchall()
                columns = tuple((row[2], bool(row[3])) for row in info if row[5])  # key, desc
                found.add((name, table, bool(unique), bool(partial), columns))
    return found


@pytest.fixture
def core_sqlite(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    store = SqliteBackend(tmp_path / "core.sqlite3")
    asyncio.run(_open_and_close(store))
    conn = sqlite3.connect(tmp_path / "core.sqlite3")
    try:
        yield conn
    finally:
        conn.close()


async def _open_and_close(store: Any) -> None:
    await store.open()
    await store.close()


# -- PostgreSQL ------------------------------------------------------------------------
POSTGRES_COLUMNS = """
SELECT table_name, column_name, data_type, is_nullable = 'YES', column_default,
       collation_name
FROM information_schema.columns WHERE table_schema = %s AND table_name = ANY(%s)
"""
POSTGRES_KEYS = """
SELECT t.relname, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
WHERE i.indisunique AND n.nspname = %s AND t.relname = ANY(%s)
GROUP BY i.indexrelid, t.relname
"""


POSTGRES_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid), t.relname, t.reloptions
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = %s AND t.relname = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
"""


def postgres_indexes(cursor: Any, schema: str) -> set[tuple[Any, ...]]:
    """Every index that backs no constraint (its definition, with no schema), and the
    fill factor of its table."""
    cursor.execute(POSTGRES_INDEXES, (schema, list(TABLES)))
    return {
        (name, definition.replace(f"{schema}.", ""), table, tuple(options or ()))
        for name, definition, table, options in cursor.fetchall()
    }


def _postgres_default(value: str | None) -> str | None:
    if value is None or value.startswith("nextval("):
        return None
    value = re.sub(r"::[a-z ]+$", "", value)  # '{}'::jsonb, ''::text
    return value.strip("'")


def postgres_layout(cursor: Any, schema: str) -> dict[str, dict[str, Column]]:
    cursor.execute(POSTGRES_COLUMNS, (schema, list(TABLES)))
    tables: dict[str, dict[str, Column]] = {table: {} for table in TABLES}
    for table, name, kind, nullable, default, collation in cursor.fetchall():
        tables[table][name] = (kind, nullable, _postgres_default(default), collation)
    return tables


def postgres_keys(cursor: Any, schema: str) -> dict[str, set[tuple[str, ...]]]:
    cursor.execute(POSTGRES_KEYS, (schema, list(TABLES)))
    keys: dict[str, set[tuple[str, ...]]] = {table: set() for table in TABLES}
    for table, columns in cursor.fetchall():
        keys[table].add(tuple(columns))
    for found in keys.values():
        found.discard(("id",))
    return keys


# -- MySQL/MariaDB ---------------------------------------------------------------------
MYSQL_COLUMNS = """
SELECT table_name, column_name, data_type, is_nullable = 'YES', column_default
FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name IN %s
"""
MYSQL_KEYS = """
SELECT table_name, index_name, column_name FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name IN %s AND non_unique = 0
ORDER BY table_name, index_name, seq_in_index
"""
#: MySQL's types by the SQLite affinity of the core's column (MariaDB's JSON is longtext).
_MYSQL_AFFINITY = {
    **dict.fromkeys(("varchar", "char", "text", "longtext", "mediumtext", "json"), "text"),
    **dict.fromkeys(("bigint", "int", "smallint", "tinyint"), "integer"),
}


def _mysql_default(value: str | None) -> str | None:
    if value is None or value == "NULL":  # MariaDB shows a NULL default as the word
        return None
    return value.strip("'")


def mysql_layout(cursor: Any) -> dict[str, dict[str, Column]]:
    cursor.execute(MYSQL_COLUMNS, [TABLES])
    tables: dict[str, dict[str, Column]] = {table: {} for table in TABLES}
    for table, name, kind, nullable, default in cursor.fetchall():
        affinity = _MYSQL_AFFINITY.get(kind.lower(), kind)
        tables[table][name] = (affinity, bool(nullable), _mysql_default(default), None)
    return tables


def mysql_keys(cursor: Any) -> dict[str, set[tuple[str, ...]]]:
    cursor.execute(MYSQL_KEYS, [TABLES])
    indexes: dict[tuple[str, str], list[str]] = {}
    for table, index, column in cursor.fetchall():
        indexes.setdefault((table, index), []).append(column)
    keys: dict[str, set[tuple[str, ...]]] = {table: set() for table in TABLES}
    for (table, _index), columns in indexes.items():
        keys[table].add(tuple(columns))
    for found in keys.values():
        found.discard(("id",))
    return keys


# -- the comparison --------------------------------------------------------------------
def compare(
    core: dict[str, dict[str, Column]], migrated: dict[str, dict[str, Column]]
) -> list[str]:
    """Every difference between the two layouts that :data:`EXTRA_COLUMNS` does not name."""
    problems = []
    for table in TABLES:
        ours, theirs = core[table], migrated[table]
        assert ours, f"the core layout has no table {table}"
        for name, column in ours.items():
            if name not in theirs:
                problems.append(f"{table}.{name}: missing from the migrations")
            elif theirs[name] != column:
                problems.append(f"{table}.{name}: core {column}, migrated {theirs[name]}")
        for name in theirs.keys() - ours.keys():
            if (table, name) not in EXTRA_COLUMNS:
                problems.append(f"{table}.{name}: only in the migrations")
    return problems


def test_the_migrated_tables_are_the_core_layout(core_sqlite: sqlite3.Connection) -> None:
    vendor = connection.vendor
    if vendor == "sqlite":
        with connection.cursor() as cursor:
            migrated = sqlite_layout(cursor)
            migrated_keys = sqlite_keys(cursor)
        core, core_keys = sqlite_layout(core_sqlite), sqlite_keys(core_sqlite)
        with connection.cursor() as cursor:
            assert sqlite_indexes(cursor) == sqlite_indexes(core_sqlite)
    elif vendor == "postgresql":
        schema = f"anarchon_core_{uuid.uuid4().hex[:8]}"
        asyncio.run(_open_and_close(_postgres_store(schema)))
        try:
            with connection.cursor() as cursor:
                migrated = postgres_layout(cursor, "public")
                migrated_keys = postgres_keys(cursor, "public")
                core, core_keys = postgres_layout(cursor, schema), postgres_keys(cursor, schema)
                assert postgres_indexes(cursor, "public") == postgres_indexes(cursor, schema)
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    elif vendor == "mysql":  # the core SQLite store's statements run there
        with connection.cursor() as cursor:
            migrated, migrated_keys = mysql_layout(cursor), mysql_keys(cursor)
        core, core_keys = sqlite_layout(core_sqlite), sqlite_keys(core_sqlite)
    else:
        pytest.skip(f"the core has no layout of its own on {vendor}: the migrations are it")
    assert compare(core, migrated) == []
    # The keys the core's statements rely on (ON CONFLICT, one pending request per job)
    # are the migrated tables' unique keys, and no other is.
    for table in TABLES:
        assert core_keys[table] == migrated_keys[table], table


def _postgres_store(schema: str) -> Any:
    from anarchon_core.backends.postgres import PostgresBackend

    settings = connection.settings_dict
    user = quote(settings.get("USER") or "")
    host, port = settings.get("HOST") or "127.0.0.1", settings.get("PORT") or "5432"
    url = f"postgresql://{user}@{host}:{port}/{settings['NAME']}?schema={schema}"
    return PostgresBackend.from_url(url)


# -- the models map the tables ---------------------------------------------------------
def migrated_columns() -> dict[str, dict[str, bool]]:
    """Each table's columns on the test database, and whether each is nullable."""
    with connection.cursor() as cursor:
        return {
            table: {
                column.name: bool(column.null_ok)
                for column in connection.introspection.get_table_description(cursor, table)
            }
            for table in TABLES
        }


def test_the_models_map_every_column() -> None:
    from django.apps import apps

    models = apps.get_app_config("anarchon_django").get_models()
    tables = migrated_columns()
    mapped = set()
    for model in models:
        assert model._meta.managed is False, model
        table = model._meta.db_table
        for field in model._meta.concrete_fields:
            assert field.column in tables[table], f"{table}.{field.column}: no such column"
            assert field.null == tables[table][field.column], f"{table}.{field.column}"
        mapped |= {(table, field.column) for field in model._meta.concrete_fields}
    assert sorted(mapped) == sorted({(t, c) for t in TABLES for c in tables[t]} - set(UNMAPPED))


# -- a database of the former migrations upgrades ---------------------------------------
FORMER = "django_project.former_migrations"
SQUASHED = ("anarchon_django", "0001_squashed_0005_core_layout")


def snapshot() -> Any:
    """The store's tables as exactly as the database describes them."""
    vendor = connection.vendor
    with connection.cursor() as cursor:
        if vendor == "sqlite":
            return sqlite_layout(cursor), sqlite_keys(cursor), sqlite_indexes(cursor)
        if vendor == "postgresql":
            cursor.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, "
                "collation_name, is_identity, identity_generation "
                "FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = ANY(%s)",
                [list(TABLES)],
            )
            columns = set(cursor.fetchall())
            return columns, postgres_keys(cursor, "public"), postgres_indexes(cursor, "public")
        cursor.execute(
            "SELECT table_name, column_name, column_type, is_nullable, column_default, "
            "collation_name, extra FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name IN %s",
            [TABLES],
        )
        columns = set(cursor.fetchall())
        cursor.execute(
            "SELECT table_name, index_name, non_unique, seq_in_index, column_name, collation "
            "FROM information_schema.statistics "
            "WHERE table_schema = DATABASE() AND table_name IN %s",
            [TABLES],
        )
        return columns, set(cursor.fetchall())


def applied() -> set[tuple[str, str]]:
    from django.db.migrations.recorder import MigrationRecorder

    return {
        key
        for key in MigrationRecorder(connection).applied_migrations()
        if key[0] == "anarchon_django"
    }


def _migrate_former(first: str) -> None:
    """Migrate with the former migrations to their last, ``0004``, from ``first``."""
    from django.db.migrations.executor import MigrationExecutor
    from django.db.migrations.loader import MigrationLoader
    from django.test import override_settings

    with override_settings(MIGRATION_MODULES={"anarchon_django": FORMER}):
        executor = MigrationExecutor(connection)
        # From 0001_initial: the chain as it ran before 0001_initial_key_columns existed.
        replace = first != "0001_initial"
        executor.loader = MigrationLoader(connection, replace_migrations=replace)
        executor.migrate([("anarchon_django", "0004_job_definitions")])
    if not replace:  # as recorded then: nothing of the squash that came later
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM django_migrations WHERE app = 'anarchon_django' "
                "AND name = '0001_initial_key_columns'"
            )


@pytest.mark.parametrize("first", ["0001_initial", "0001_initial_key_columns"])
def test_a_database_of_the_former_migrations_upgrades(first: str, runner: Any) -> None:
    from django.core.management import call_command
    from django.db.migrations.executor import MigrationExecutor

    from anarchon_core.backend import ClaimRequest
    from anarchon_core.records import Origin
    from anarchon_django.backend import DjangoBackend

    if first == "0001_initial" and connection.vendor == "mysql":
        pytest.skip("0001_initial never ran on MySQL (InnoDB indexes no whole TEXT column)")
    fresh, fresh_applied = snapshot(), applied()
    assert SQUASHED in fresh_applied
    call_command("migrate", "anarchon_django", "zero", verbosity=0)
    assert not set(TABLES) & set(connection.introspection.table_names())
    try:
        _migrate_former(first)
        assert snapshot() != fresh  # Django's tables: other indexes, requested_by, …
        # The store on the former tables, as before the upgrade: a run and a definition.
        store = DjangoBackend("default")

        async def write() -> int:
            await store.open()
            try:
                now = await store.now_ms()
                request = ClaimRequest(
                    job="kept",
                    slot=now,
                    origin=Origin.SCHEDULE,
                    token="t1",
                    instance_id="host:1:abc",
                    lease_ms=60_000,
                    horizon_ms=600_000,
                    skip_overlap=False,
                )
                assert (await store.claim(request)).outcome == "won"
                await store.write_definition("kept", '{"every": "1m"}', expected=0)
                return now
            finally:
                await store.close()

        slot = runner.run(write())
        call_command("migrate", "anarchon_django", verbosity=0)
    except BaseException:
        # Leave the test database as the other tests expect it.
        call_command("migrate", "anarchon_django", "zero", verbosity=0)
        call_command("migrate", "anarchon_django", verbosity=0)
        raise
    assert snapshot() == fresh
    assert SQUASHED in applied()
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes("anarchon_django")) == []
    call_command("migrate", "anarchon_django", verbosity=0)  # nothing to do: no error
    call_command("makemigrations", "anarchon_django", check=True, dry_run=True, verbosity=0)

    from anarchon_django.models import Job, Run

    assert Run.objects.get(job="kept", slot=slot).token == "t1"
    assert Job.objects.get(job="kept").definition == '{"every": "1m"}'

    async def again() -> None:
        await store.open()
        try:
            assert [d.job for d in await store.definitions_since(0)] == ["kept"]
        finally:
            await store.close()

    runner.run(again())


def test_a_new_install_applies_one_migration() -> None:
    """The test database was made as a new install is: by the squashed migration alone."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    nodes = [key for key in loader.graph.nodes if key[0] == "anarchon_django"]
    assert nodes == [SQUASHED]
    assert loader.graph.nodes[SQUASHED].initial
