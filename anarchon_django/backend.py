"""The Django ORM backend: ``django://ALIAS``, a lease backend on the project's database.

Registered in the ``anarchon.backends`` entry-point group, so the core factory builds
it from a URL (``anarchon history --backend django://default`` with
``DJANGO_SETTINGS_MODULE`` set) without the core importing Django.

The store is the core SQL backends' layout, created by this app's migrations
(:mod:`anarchon_django.models`), and the decisions are theirs: on SQLite the core
SQLite backend's, under SQLite's write lock; on PostgreSQL the core PostgreSQL
backend's statements, one round trip each (both through the core's public
:class:`~anarchon_core.backends.supply.ConnectionSupply`); on
MySQL/MariaDB the core SQLite backend's again, translated to MySQL and serialised by
one store-wide row lock per batch (:mod:`anarchon_core.backends.mysql`).
They run as raw SQL on a Django connection of their own, held by a dedicated thread
(:mod:`._orm_thread`), in autocommit, never inside an outer ``atomic`` block: checked
and reconnected through Django, the hot statements sent on the driver connection
Django manages, past its cursor wrapper.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from anarchon_core.backend import (
    SCHEMA_VERSION,
    Backend,
    Capabilities,
)
from anarchon_core.backends.delegating import DelegatingBackend
from anarchon_core.errors import BackendError, ConfigurationError, SchemaVersionError
from anarchon_core.redact import brief, redact_text

from .conf import DEFAULT_ALIAS, alias_from_url

if TYPE_CHECKING:
    from ._orm_thread import Worker

__all__ = ["DjangoBackend", "alias_from_url"]

#: The tables the migrations create (``manage.py migrate anarchon_django``).
TABLES = (
    "anarchon_meta",
    "anarchon_runs",
    "anarchon_attempts",
    "anarchon_jobs",
    "anarchon_instances",
)
#: Django's vendor names of the databases the store runs on.
_VENDORS = ("sqlite", "postgresql", "mysql")


class DjangoBackend(DelegatingBackend):
    """A lease backend on the Django database ``alias`` (SQLite, PostgreSQL, MySQL/MariaDB).

    Construct it before or after Django is set up: the alias is checked (and Django set
    up from ``DJANGO_SETTINGS_MODULE`` if needed) when it is known, at the latest at
    :meth:`open`. Use it from one event loop, as every backend.
    """

    capabilities = Capabilities(
        lease=True, store_clock=True, finish=True, finish_in_transaction=True
    )
    name = "django"

    def __init__(self, alias: str = DEFAULT_ALIAS) -> None:
        if not isinstance(alias, str) or not alias:
            raise ConfigurationError(f"Django database alias {brief(alias)} is not valid")
        self.alias = alias
        self._store: Backend | None = None
        self._worker: Worker | None = None
        if _django_ready(setup=False):
            _check_alias(alias)

    @classmethod
    def from_url(cls, url: str) -> DjangoBackend:
        """``django://ALIAS`` (``django://`` alone: ``default``); sets Django up if needed."""
        alias = alias_from_url(url)
        _django_ready(setup=True)
        return cls(alias)

    @property
    def local_to(self) -> str | None:
        """``"host"`` on an SQLite database (a local file), else ``None``."""
        if not _django_ready(setup=False):
            return None
        from django.db import connections

        try:
            return "host" if connections[self.alias].vendor == "sqlite" else None
        except Exception:  # an unknown alias: open() says so
            return None

    def describe(self) -> str:
        where = f"django://{self.alias}"
        if not _django_ready(setup=False):
            return where
        from django.db import connections

        try:
            settings = connections.settings[self.alias]
        except KeyError:  # unknown alias: open() says so
            return where
        vendor = connections[self.alias].vendor  # a wrapper object; no connection is made
        name = redact_text(str(settings.get("NAME") or ""))  # never the PASSWORD: not shown
        return f"{where} ({vendor} {name})".replace(" )", ")")

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Check the database and the migrated tables; start the backend's thread.

        :raises ConfigurationError: Django is not configured, the alias is unknown, the
            database is not one of SQLite, PostgreSQL, MySQL/MariaDB, or the tables are
            missing.
        :raises SchemaVersionError: the store was written by a newer anarchon.
        :raises BackendUnavailable: the database cannot be reached.
        """
        if self._store is not None:
            return
        if not _django_ready(setup=True):
            raise ConfigurationError(
                f"{self.describe()}: Django is not set up: set DJANGO_SETTINGS_MODULE "
                f"(or call django.setup()) before opening the Django ORM backend"
            )
        _check_alias(self.alias)
        from django.db import connections

        from ._orm_thread import Worker

        settings = connections.settings[self.alias]
        vendor = connections[self.alias].vendor
        if vendor not in _VENDORS:
            raise ConfigurationError(
                f"{self.describe()}: the Django ORM backend supports the database vendors "
                f"{', '.join(_VENDORS)} (SQLite, PostgreSQL, MySQL/MariaDB), not {vendor!r}"
            )
        worker = Worker(self.alias, self.describe())
        store: Backend
        try:
            await worker.call(_check_layout)
            if vendor == "postgresql":
                store = _postgres_store(worker, self.describe())
            elif vendor == "mysql":
                store = _mysql_store(worker, settings, self.describe())
            else:
                store = _sqlite_store(worker, settings)
            await store.open()
        except BaseException:
            await worker.close()
            raise
        self._store, self._worker = store, worker

    async def close(self) -> None:
        store, worker = self._store, self._worker
        self._store = self._worker = None
        if store is None or worker is None:
            return
        try:
            await store.close()
        finally:
            await worker.close()

    @property
    def inner(self) -> Backend:
        """The database's store, once open (every contract method is forwarded to it)."""
        store = self._store
        if store is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        return store


def _postgres_store(worker: Worker, describe: str) -> Backend:
    """The core PostgreSQL store's statements on the worker's psycopg connection (they
    are rendered with psycopg 3, whatever driver Django uses)."""
    try:
        from anarchon_core.backends.postgres import SuppliedPostgresBackend
    except ImportError as exc:
        raise ConfigurationError(
            f"{describe}: the Django ORM backend on PostgreSQL needs psycopg 3: "
            f"pip install 'anarchon[postgres]' ({exc})"
        ) from exc
    from ._orm_thread import driver_supply

    return SuppliedPostgresBackend(driver_supply(worker))


#: sqlite3.connect's busy timeout, which Django keeps unless OPTIONS say otherwise.
_SQLITE_TIMEOUT_S = 5.0


def _sqlite_store(worker: Worker, settings: dict[str, Any]) -> Backend:
    """The core SQLite store's decisions on the worker's ``sqlite3`` connection, under
    SQLite's write lock; busy answers are retried within Django's ``OPTIONS["timeout"]``."""
    from anarchon_core.backends.sqlite import SqliteBackend

    from ._orm_thread import sqlite_supply

    timeout = (settings.get("OPTIONS") or {}).get("timeout", _SQLITE_TIMEOUT_S)
    return SqliteBackend(
        str(settings.get("NAME") or "django"),
        busy_timeout_ms=max(1, int(timeout * 1000)),
        supply=sqlite_supply(worker),
    )


def _mysql_store(worker: Worker, settings: dict[str, Any], describe: str) -> Backend:
    """The core SQLite store's decisions, translated to MySQL, on the worker's MySQLdb
    connection (Django's MySQL driver)."""
    try:
        from anarchon_core.backends.mysql import SuppliedMysqlBackend
    except ImportError as exc:
        raise ConfigurationError(
            f"{describe}: the Django ORM backend on MySQL/MariaDB needs mysqlclient: "
            f"pip install 'anarchon[mysql]' ({exc})"
        ) from exc
    from ._orm_thread import driver_supply

    return SuppliedMysqlBackend(driver_supply(worker), secrets=_secret_urls(settings))


def _secret_urls(settings: dict[str, Any]) -> list[str]:
    """The settings' passwords as URLs, the form :func:`redact_text` scrubs secrets of."""
    options = settings.get("OPTIONS") or {}
    user = quote(str(settings.get("USER") or "user"), safe="")
    passwords = [settings.get("PASSWORD"), options.get("password"), options.get("passwd")]
    return [f"mysql://{user}:{quote(str(p), safe='')}@db/" for p in passwords if p]


# -- Django set-up ---------------------------------------------------------------------
def _django_ready(*, setup: bool) -> bool:
    """Whether Django's apps are loaded; with ``setup``, load them from the environment.

    ``django.setup()`` is called only when nothing is loading them already (it is not
    reentrant) and settings are known: a CLI process given ``DJANGO_SETTINGS_MODULE``.
    """
    from django.apps import apps

    if apps.ready:
        return True
    if not setup or apps.loading:
        return False
    from django.conf import ENVIRONMENT_VARIABLE, settings

    if not (os.environ.get(ENVIRONMENT_VARIABLE) or settings.configured):
        return False
    import django

    try:
        django.setup()
    except ImportError as exc:  # the settings module (or an app) is not importable here
        raise ConfigurationError(
            f"django:// needs the project's Django settings, and "
            f"{ENVIRONMENT_VARIABLE}={os.environ.get(ENVIRONMENT_VARIABLE)!r} could not be "
            f"imported ({exc}): run from the project's directory or set PYTHONPATH, or use "
            f"'python manage.py anarchon ...'"
        ) from exc
    return apps.ready


def _check_alias(alias: str) -> None:
    from django.db import connections

    if alias not in connections.settings:
        known = ", ".join(repr(name) for name in connections.settings) or "none"
        raise ConfigurationError(
            f"django://{alias}: {alias!r} is not a database of settings.DATABASES "
            f"(configured: {known})"
        )


def _check_layout(conn: Any) -> None:
    """On the backend's thread: the migrated tables exist; the version is known, or set."""
    missing = sorted(set(TABLES) - set(conn.introspection.table_names()))
    if missing:
        raise ConfigurationError(
            f"django://{conn.alias}: the anarchon tables {', '.join(missing)} do not exist: "
            f"run 'manage.py migrate anarchon_django'"
        )
    key = conn.ops.quote_name("key")  # a reserved word on MySQL
    if conn.vendor == "mysql":
        record = (
            f"INSERT INTO anarchon_meta ({key}, value) VALUES ('schema_version', %s) "
            f"ON DUPLICATE KEY UPDATE id = id"
        )
    else:
        record = (
            "INSERT INTO anarchon_meta (key, value) VALUES ('schema_version', %s) "
            "ON CONFLICT (key) DO NOTHING"
        )
    with conn.cursor() as cur:
        # Recorded once by the first open (a flush of the tables forgets it: set again).
        # On MySQL the row is also the store's lock (see anarchon_core.backends.mysql).
        cur.execute(record, [str(SCHEMA_VERSION)])
        cur.execute(f"SELECT value FROM anarchon_meta WHERE {key} = 'schema_version'")
        row = cur.fetchone()
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        raise BackendError(
            f"django://{conn.alias}: the store's schema version {row!r} is unreadable"
        ) from None
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"django://{conn.alias}: the store holds schema version {version}, newer than "
            f"version {SCHEMA_VERSION} known to this anarchon: upgrade anarchon to use it"
        )
