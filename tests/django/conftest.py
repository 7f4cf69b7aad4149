"""Fixtures of the Django adapter's tests: the ORM backend on the test database.

Run with ``DJANGO_SETTINGS_MODULE=django_project.settings`` and
``ANARCHON_TEST_DJANGO_DB=sqlite|postgres|mysql``; pytest-django creates the test
database. On ``mysql`` (MariaDB or MySQL), a server that does not answer skips the tests
that need the database, or fails them under ``ANARCHON_REQUIRE_SERVICES=1``.

As in ``tests/backends``, there is no pytest-asyncio: ``async def`` tests run on the
``runner`` fixture's event loop, the loop that opened the backend (the conformance
suite's plugin, ``anarchon_core.conformance.plugin``, imported here). The backend runs
its statements on a thread of its own with its own connection, so its tests need
``transactional_db`` (what it writes is committed, and flushed after the test).

The store's tables are the core's, mapped by models with ``managed = False``, which
Django's flush (the end of a ``transactional_db`` test) leaves alone: ``clear_store``
empties them after every such test, as the flush did when the models were managed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from services import require_mysql

from anarchon_core.conformance.plugin import *  # noqa: F403  (runner, pytest_pyfunc_call)
from anarchon_django.backend import DjangoBackend


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """pytest-django's hook before it creates the test database: on MySQL, first see
    that the server answers (a skip with the reason, rather than an error per test)."""
    from django.db import connections

    settings = connections["default"].settings_dict
    if connections["default"].vendor == "mysql":
        require_mysql(
            settings["HOST"] or "127.0.0.1",
            int(settings["PORT"] or 3306),
            settings["USER"],
            settings["PASSWORD"],
        )


@pytest.fixture(autouse=True)
def clear_store(request: pytest.FixtureRequest, django_db_blocker: Any) -> Iterator[None]:
    """After a test whose writes were committed, empty the store's tables."""
    yield
    marker = request.node.get_closest_marker("django_db")
    committed = {"transactional_db", "live_server"} & set(request.fixturenames) or (
        marker is not None and marker.kwargs.get("transaction")
    )
    if not committed:
        return
    from django.db import connection

    from anarchon_core.backends.supply import TABLES

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")


@pytest.fixture
def backend(transactional_db: None, runner: asyncio.Runner) -> Iterator[DjangoBackend]:
    """An open ORM backend on the (empty, migrated) test database ``default``."""
    store = DjangoBackend("default")
    runner.run(store.open())
    try:
        yield store
    finally:
        runner.run(store.close())
