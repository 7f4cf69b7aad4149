"""Fixtures of the backend conformance suite: one ``backend`` fixture, every store a param.

A new backend is one more factory in ``registry.BACKENDS``: an async context
manager that yields an open, empty store and cleans it up afterwards. Server
backends register theirs in a module ``stores_<name>.py`` beside this file. A
factory whose server is unreachable calls ``services.service_unreachable``, which
skips the test, or fails it when ``ANARCHON_REQUIRE_SERVICES=1`` (CI with its
services up must not skip silently).

There is no pytest-asyncio: ``async def`` tests run on the ``runner`` fixture's event
loop (one :class:`asyncio.Runner` per test), the same loop that opened the backend,
because drivers bind their connections to the loop that made them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry import BACKENDS, load_store_modules

from anarchon_core.backend import Backend

load_store_modules()


@pytest.fixture(autouse=True)
def runner() -> Iterator[asyncio.Runner]:
    """The event loop of one test: the backend fixture and the test body share it."""
    with asyncio.Runner() as runner:
        yield runner


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend`` at collection, after every factory has registered."""
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", list(BACKENDS), indirect=True)


@pytest.fixture
def backend(
    request: pytest.FixtureRequest, runner: asyncio.Runner, tmp_path: Path
) -> Iterator[Backend]:
    """An open, empty store of each registered kind (the param is its id)."""
    context = BACKENDS[request.param](tmp_path)
    store = runner.run(context.__aenter__())
    try:
        yield store
    finally:
        runner.run(context.__aexit__(None, None, None))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests to completion on the test's ``runner`` loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    runner: asyncio.Runner = pyfuncitem.funcargs["runner"]
    names = pyfuncitem._fixtureinfo.argnames  # what pytest's own pyfunc_call passes
    runner.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
