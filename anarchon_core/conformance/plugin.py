"""The pytest plugin the conformance suite runs on: one event loop per test, no
pytest-asyncio.

- ``runner`` (autouse): one :class:`asyncio.Runner` per test. The ``backend`` fixture
  opens (and closes) its store with ``runner.run(...)`` and the test body runs on the
  same loop, because store drivers bind their connections to the loop that made them.
- ``pytest_pyfunc_call``: runs every ``async def`` test to completion on that loop.

Enable it for the tests that need it only (it runs every ``async def`` test it sees,
which another async plugin such as pytest-asyncio would also claim):
``pytest_plugins = ["anarchon_core.conformance.plugin"]`` in the rootdir's
``conftest.py`` (pytest allows ``pytest_plugins`` only there), or, in a deeper
``conftest.py``, ``from anarchon_core.conformance.plugin import pytest_pyfunc_call,
runner``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import pytest

__all__ = ["pytest_pyfunc_call", "runner"]


@pytest.fixture(autouse=True)
def runner() -> Iterator[asyncio.Runner]:
    """The event loop of one test: the backend fixture and the test body share it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests to completion on the test's ``runner`` loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    runner = pyfuncitem.funcargs["runner"]
    assert isinstance(runner, asyncio.Runner), "the runner fixture is overridden"
    names = pyfuncitem._fixtureinfo.argnames  # what pytest's own pyfunc_call passes
    runner.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
