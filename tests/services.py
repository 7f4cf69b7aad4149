"""Reaching the local servers the tests need: skip when one is down, fail under CI.

``ANARCHON_REQUIRE_SERVICES=1`` (set by ``.ci/run``, which starts every service)
turns a skip into a failure, so a CI run can never pass by silently skipping.
"""

from __future__ import annotations

import os
import socket
from typing import NoReturn

import pytest

POSTGRES_URL = os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ANARCHON_TEST_REDIS", "redis://127.0.0.1:6379/0")


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
