"""Fixtures of the Django adapter's tests: the ORM backend on the test database.

Run with ``DJANGO_SETTINGS_MODULE=django_project.settings`` and
``ANARCHON_TEST_DJANGO_DB=sqlite|postgres``; pytest-django creates the test database.

As in ``tests/backends``, there is no pytest-asyncio: ``async def`` tests run on the
``runner`` fixture's event loop, the loop that opened the backend (the conformance
suite's plugin, ``anarchon_core.conformance.plugin``, imported here). The backend runs
its statements on a thread of its own with its own connection, so its tests need
``transactional_db`` (what it writes is committed, and flushed after the test).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from anarchon_core.conformance.plugin import *  # noqa: F403  (runner, pytest_pyfunc_call)
from anarchon_django.backend import DjangoBackend


@pytest.fixture
def backend(transactional_db: None, runner: asyncio.Runner) -> Iterator[DjangoBackend]:
    """An open ORM backend on the (empty, migrated) test database ``default``."""
    store = DjangoBackend("default")
    runner.run(store.open())
    try:
        yield store
    finally:
        runner.run(store.close())
