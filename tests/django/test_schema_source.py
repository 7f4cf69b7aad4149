"""One schema: the ORM store's migrated tables agree with the core store's own layout.

The ORM store runs the core SQLite and PostgreSQL stores' statements on tables that
Django's migrations create, so the two layouts must not drift. On the test database,
the core store creates its layout beside the migrated one (another file on SQLite,
another schema on PostgreSQL), and every table is compared column by column (type,
nullability, default, collation) and key by key. MySQL/MariaDB has no core store of its
own: the ORM store runs the core SQLite store's statements there, so its migrated
tables are compared with the core SQLite layout (types by SQLite's affinity; the exact
collation of the key columns is ``test_orm_mysql``'s). The differences that are meant
are listed in :data:`EXTRA_COLUMNS`, each with its reason; anything else fails.
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
    # The core's SQLite store keeps who asked for a manual run in ``fingerprint``; the
    # ORM store runs SQLite's statements, which never write this column.
    ("anarchon_runs", "requested_by"): "PostgreSQL's column, unused on SQLite",
}

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
    elif vendor == "postgresql":
        schema = f"anarchon_core_{uuid.uuid4().hex[:8]}"
        asyncio.run(_open_and_close(_postgres_store(schema)))
        try:
            with connection.cursor() as cursor:
                migrated = postgres_layout(cursor, "public")
                migrated_keys = postgres_keys(cursor, "public")
                core, core_keys = postgres_layout(cursor, schema), postgres_keys(cursor, schema)
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
    # Every key the core's statements rely on (ON CONFLICT, one pending request per job)
    # is a unique key of the migrated tables too.
    for table in TABLES:
        assert core_keys[table] <= migrated_keys[table], table


def _postgres_store(schema: str) -> Any:
    from anarchon_core.backends.postgres import PostgresBackend

    settings = connection.settings_dict
    user = quote(settings.get("USER") or "")
    host, port = settings.get("HOST") or "127.0.0.1", settings.get("PORT") or "5432"
    url = f"postgresql://{user}@{host}:{port}/{settings['NAME']}?schema={schema}"
    return PostgresBackend.from_url(url)
