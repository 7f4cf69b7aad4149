"""The lease stores the multi-process tests run against: every ``registry.LEASE_URLS``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from registry import LEASE_URLS, load_store_modules

load_store_modules()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lease_url" in metafunc.fixturenames:
        metafunc.parametrize("lease_url", list(LEASE_URLS), indirect=True)


@pytest.fixture
def lease_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an isolated, empty lease store that worker processes can open."""
    with LEASE_URLS[request.param](tmp_path) as url:
        yield url
