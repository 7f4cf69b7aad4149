"""The Django ORM backend: ``django://ALIAS``, a lease backend on the project's database.

Registered in the ``anarchon.backends`` entry-point group, so the core factory builds
it from a URL (with ``DJANGO_SETTINGS_MODULE`` set) without the core importing Django.
The store is the core SQL backends' layout, created by this app's migrations, and the
decisions are theirs (SQLite's; PostgreSQL's; SQLite's translated to MySQL), run on a
connection of its own held by :class:`~anarchon_django._orm_thread.Worker`, the core
stores' :class:`~anarchon_core.backends.supply.ConnectionSupply`.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from anarchon_core.backend import Backend, Capabilities
from anarchon_core.backends.delegating import DelegatingBackend
from anarchon_core.backends.supply import check_layout
from anarchon_core.errors import BackendError, ConfigurationError
from anarchon_core.redact import brief, redact_text

from .conf import DEFAULT_ALIAS, alias_from_url

if TYPE_CHECKING:
    from ._orm_thread import Worker

__all__ = ["DjangoBackend", "alias_from_url"]


class DjangoBackend(DelegatingBackend):
    """A lease backend on the Django database ``alias`` (SQLite, PostgreSQL, MySQL/MariaDB),
    constructed before or after Django is set up (the alias is checked once it is known, at
    the latest at :meth:`open`). Use it from one event loop, as every backend."""

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

    def _database(self) -> tuple[str, dict[str, Any]] | None:
        """The alias's vendor and settings once Django is ready (no connection is made)."""
        if not _django_ready(setup=False):
            return None
        from django.db import connections

        try:
            return connections[self.alias].vendor, connections.settings[self.alias]
        except Exception:  # an unknown alias: open() says so
            return None

    @property
    def local_to(self) -> str | None:
        """``"host"`` on an SQLite database (a local file), else ``None``."""
        database = self._database()
        return "host" if database and database[0] == "sqlite" else None

    def describe(self) -> str:
        database = self._database()
        if database is None:
            return f"django://{self.alias}"
        name = redact_text(str(database[1].get("NAME") or ""))  # never the PASSWORD
        return f"django://{self.alias} ({database[0]} {name})".replace(" )", ")")

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Check the database and the migrated tables; start the backend's thread.

        :raises ConfigurationError: Django is not set up, an unknown alias or vendor, no tables.
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
        worker = Worker(self.alias, self.describe())
        try:
            store = _store(connections[self.alias].vendor, worker, settings)
            await worker.call(_check_layout)
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


#: What the store needs on each database of Django's beyond SQLite (its vendor names).
_DRIVERS = {
    "postgresql": "psycopg 3 and psycopg-pool: pip install 'anarchon[django,postgres]'",
    "mysql": "mysqlclient: pip install 'anarchon[django,mysql]'",
}
#: The core store module the ORM store loads on each vendor (it imports the drivers).
_STORE_MODULES = {
    "postgresql": "anarchon_core.backends.postgres",
    "mysql": "anarchon_core.backends.mysql",
}


def missing_driver(vendor: str) -> str | None:
    """What the ORM store on ``vendor`` needs and cannot import here, or ``None``:
    checked by ``manage.py check`` (``anarchon.E006``) before a run would fail on it."""
    module = _STORE_MODULES.get(vendor)
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"the Django ORM backend on {vendor} needs {_DRIVERS[vendor]} ({exc})"
    return None


#: sqlite3.connect's busy timeout, which Django keeps unless OPTIONS say otherwise.
_SQLITE_TIMEOUT_S = 5.0


def _store(vendor: str, worker: Worker, settings: dict[str, Any]) -> Backend:
    """The core store deciding on the worker's driver connection: SQLite's (busy answers
    retried within Django's ``OPTIONS["timeout"]``), PostgreSQL's statements (rendered
    with psycopg 3, whatever Django's driver), or SQLite's translated to MySQL."""
    if vendor == "sqlite":
        from anarchon_core.backends.sqlite import SqliteBackend

        timeout = (settings.get("OPTIONS") or {}).get("timeout", _SQLITE_TIMEOUT_S)
        path, busy_ms = str(settings.get("NAME") or "django"), max(1, int(timeout * 1000))
        return SqliteBackend(path, busy_timeout_ms=busy_ms, supply=worker)
    if vendor not in _DRIVERS:
        raise ConfigurationError(
            f"{worker.where}: the Django ORM backend supports the database vendors sqlite, "
            f"{', '.join(_DRIVERS)} (SQLite, PostgreSQL, MySQL/MariaDB), not {vendor!r}"
        )
    try:
        if vendor == "postgresql":
            from anarchon_core.backends.postgres import SuppliedPostgresBackend

            return SuppliedPostgresBackend(worker)
        from anarchon_core.backends.mysql import SuppliedMysqlBackend

        return SuppliedMysqlBackend(worker, secrets=_secret_urls(settings))
    except ImportError as exc:
        raise ConfigurationError(
            f"{worker.where}: the Django ORM backend on {vendor} needs {_DRIVERS[vendor]} ({exc})"
        ) from exc


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
    with conn.cursor() as cursor:
        check_layout(
            cursor,
            conn.introspection.table_names(cursor),
            where=f"django://{conn.alias}",
            migrate="run 'manage.py migrate anarchon_django'",
            mysql=conn.vendor == "mysql",
        )
