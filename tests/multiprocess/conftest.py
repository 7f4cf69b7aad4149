"""Lease backends the multi-process tests run against (one more param per backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

LEASE_STORES = ["sqlite"]


@pytest.fixture(params=LEASE_STORES)
def lease_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite3'}"
    raise AssertionError(request.param)
