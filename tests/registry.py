"""The stores every shared suite runs against, registered by one module per store.

Two registries: :data:`BACKENDS` (the conformance suite: async context managers that
yield an open, empty backend) and :data:`LEASE_URLS` (the multi-process suites:
context managers that yield a URL of an isolated, empty store that worker processes
can open). Server stores register both in ``tests/backends/stores_<name>.py``;
:func:`load_store_modules` imports those once. Claim-only stores register their URLs
in :data:`CLAIM_ONLY_URLS`, and may register an open backend in
:data:`CLAIM_ONLY_BACKENDS` for the suites of the parts of the contract they keep (a
test module joins them by setting ``CLAIM_ONLY_STORES = True``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path

from anarchon_core.backend import Backend
from anarchon_core.backends.memory import MemoryBackend
from anarchon_core.backends.sqlite import SqliteBackend

BackendFactory = Callable[[Path], AbstractAsyncContextManager[Backend]]
UrlFactory = Callable[[Path], AbstractContextManager[str]]

#: The conformance suite's stores, by test id.
BACKENDS: dict[str, BackendFactory] = {}
#: The multi-process suites' lease stores, by test id.
LEASE_URLS: dict[str, UrlFactory] = {}
#: Claim-only stores (one winner per run, no leases), by test id.
CLAIM_ONLY_URLS: dict[str, UrlFactory] = {}
#: Claim-only stores as open backends, for the suites they keep (not the lease contract).
CLAIM_ONLY_BACKENDS: dict[str, BackendFactory] = {}


def backend_factory(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Register a conformance factory under ``name``; it receives a fresh tmp dir."""

    def register(factory: BackendFactory) -> BackendFactory:
        BACKENDS[name] = factory
        return factory

    return register


def claim_only_backend_factory(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Register a claim-only store's open backend under ``name`` (see the module doc)."""

    def register(factory: BackendFactory) -> BackendFactory:
        CLAIM_ONLY_BACKENDS[name] = factory
        return factory

    return register


def lease_url_factory(name: str) -> Callable[[UrlFactory], UrlFactory]:
    """Register a multi-process URL factory under ``name``; it receives a fresh tmp dir."""

    def register(factory: UrlFactory) -> UrlFactory:
        LEASE_URLS[name] = factory
        return factory

    return register


def claim_only_url_factory(name: str) -> Callable[[UrlFactory], UrlFactory]:
    """Register a claim-only URL factory under ``name``; it receives a fresh tmp dir."""

    def register(factory: UrlFactory) -> UrlFactory:
        CLAIM_ONLY_URLS[name] = factory
        return factory

    return register


def load_store_modules() -> None:
    """Import every ``tests/backends/stores_*.py`` once; each registers its factories.

    Each is imported by its own name, as the backend tests import it, so that a module
    is never loaded twice (nor its factories registered twice), and ``stores_supplied``
    finds ``stores_postgres`` from any test directory.
    """
    for path in sorted((Path(__file__).parent / "backends").glob("stores_*.py")):
        name = path.stem
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


@backend_factory("memory")
@asynccontextmanager
async def _memory(tmp_path: Path) -> AsyncIterator[Backend]:
    yield MemoryBackend()


@backend_factory("sqlite")
@asynccontextmanager
async def _sqlite(tmp_path: Path) -> AsyncIterator[Backend]:
    backend = SqliteBackend(tmp_path / "anarchon.sqlite3")
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@lease_url_factory("sqlite")
@contextmanager
def _sqlite_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'store.sqlite3'}"
