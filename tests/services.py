"""Reaching the local servers the tests need: skip when one is down, fail under CI.

``ANARCHON_REQUIRE_SERVICES=1`` (set by ``.ci/run``, which starts every service)
turns a skip into a failure, so a CI run can never pass by silently skipping.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import pytest

T = TypeVar("T")

POSTGRES_URL = os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ANARCHON_TEST_REDIS", "redis://127.0.0.1:6379/0")

_answered: dict[str, str] = {}  # URL -> "" once its server answered, else why it did not


def service_unreachable(service: str, reason: str) -> NoReturn:
    """Skip a test whose server is down, or fail it if ``ANARCHON_REQUIRE_SERVICES=1``."""
    if os.environ.get("ANARCHON_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{service} is required (ANARCHON_REQUIRE_SERVICES=1) but {reason}")
    pytest.skip(f"{service} is unreachable ({reason}); set ANARCHON_REQUIRE_SERVICES=1 to fail")


def require_tcp(service: str, host: str, port: int, timeout: float = 1.0) -> None:
    """Skip (or fail, under CI) unless something listens on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        service_unreachable(service, f"nothing answers on {host}:{port}: {exc}")


def require_answer(service: str, url: str, probe: Callable[[], Awaitable[object]]) -> str:
    """``url`` once ``probe`` succeeded on it, or skip (fail under CI); asked once per URL."""
    if url not in _answered:
        try:
            run_sync(probe)
            _answered[url] = ""
        except Exception as exc:
            _answered[url] = f"{type(exc).__name__}: {exc}"
    if _answered[url]:
        service_unreachable(service, f"{url} does not answer: {_answered[url]}")
    return url


def require_mysql(host: str, port: int, user: str, password: str = "") -> None:
    """Skip (or fail, under CI) unless the MariaDB/MySQL server at ``host:port`` lets
    ``user`` log in; asked once per server."""
    where = f"mysql://{user}@{host}:{port}"
    if where not in _answered:
        try:
            import MySQLdb

            MySQLdb.connect(
                host=host, port=port, user=user, password=password, connect_timeout=3
            ).close()
            _answered[where] = ""
        except Exception as exc:
            _answered[where] = f"{type(exc).__name__}: {exc}"
    if _answered[where]:
        service_unreachable("MariaDB/MySQL", f"{where} does not answer: {_answered[where]}")


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a private loop in a thread (safe inside a loop)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(_call(make)))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name="services-run-sync")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


async def _call(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


def free_port() -> int:
    """A local port nothing listens on (the OS may hand it out again later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
