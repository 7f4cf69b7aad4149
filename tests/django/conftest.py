"""Fixtures of the Django adapter's tests: the ORM backend on the test database.

Run with ``DJANGO_SETTINGS_MODULE=django_project.settings`` and
``ANARCHON_TEST_DJANGO_DB=sqlite|postgres``; pytest-django creates the test database.

As in ``tests/backends``, there is no pytest-asyncio: ``async def`` tests run on the
``runner`` fixture's event loop, the loop that opened the backend. The backend runs
its statements on a thread of its own with its own connection, so its tests need
``transactional_db`` (what it writes is committed, and flushed after the test).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import pytest

from anarchon_django.backend import DjangoBackend


@pytest.fixture(autouse=True)
def runner() -> Iterator[asyncio.Runner]:
    """The event loop of one test: the backend fixture and the test body share it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture
def backend(transactional_db: None, runner: asyncio.Runner) -> Iterator[DjangoBackend]:
    """An open ORM backend on the (empty, migrated) test database ``default``."""
    store = DjangoBackend("default")
    runner.run(store.open())
    try:
        yield store
    finally:
        runner.run(store.close())


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests to completion on the test's ``runner`` loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    runner: asyncio.Runner = pyfuncitem.funcargs["runner"]
    names = pyfuncitem._fixtureinfo.argnames  # what pytest's own pyfunc_call passes
    runner.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
