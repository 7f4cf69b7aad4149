"""Fixtures of the backend conformance suite: one ``backend`` fixture, every store a param.

A new backend is one more factory in ``registry.BACKENDS``: an async context
manager that yields an open, empty store and cleans it up afterwards. Server
backends register theirs in a module ``stores_<name>.py`` beside this file. A
factory whose server is unreachable calls ``services.service_unreachable``, which
skips the test, or fails it when ``ANARCHON_REQUIRE_SERVICES=1`` (CI with its
services up must not skip silently).

The tests of the contract are the public suite, ``anarchon_core.conformance``; the
test modules here import it. There is no pytest-asyncio: ``async def`` tests run on
the ``runner`` fixture's event loop (one :class:`asyncio.Runner` per test), the same
loop that opened the backend, because drivers bind their connections to the loop that
made them. The fixture and the hook that runs them are the suite's pytest plugin,
``anarchon_core.conformance.plugin``, imported here (``pytest_plugins`` is allowed in
the rootdir's conftest only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry import BACKENDS, CLAIM_ONLY_BACKENDS, load_store_modules

from anarchon_core.backend import Backend
from anarchon_core.conformance.plugin import *  # noqa: F403  (runner, pytest_pyfunc_call)

load_store_modules()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend`` at collection, after every factory has registered.

    A module that sets ``CLAIM_ONLY_STORES = True`` (a suite the claim-only stores keep
    too) also gets those of ``registry.CLAIM_ONLY_BACKENDS``.
    """
    if "backend" in metafunc.fixturenames:
        stores = list(BACKENDS)
        if getattr(metafunc.module, "CLAIM_ONLY_STORES", False):
            stores += list(CLAIM_ONLY_BACKENDS)
        metafunc.parametrize("backend", stores, indirect=True)


@pytest.fixture
def backend(
    request: pytest.FixtureRequest, runner: asyncio.Runner, tmp_path: Path
) -> Iterator[Backend]:
    """An open, empty store of each registered kind (the param is its id)."""
    context = {**BACKENDS, **CLAIM_ONLY_BACKENDS}[request.param](tmp_path)
    store = runner.run(context.__aenter__())
    try:
        yield store
    finally:
        runner.run(context.__aexit__(None, None, None))
