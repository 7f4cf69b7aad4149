"""The shared conformance and operations suites, run against the Django ORM backend.

The test functions are the very ones of ``tests/backends`` (imported, not copied), with
this directory's ``backend`` fixture: an open ``DjangoBackend`` on the test database,
PostgreSQL or SQLite as ``ANARCHON_TEST_DJANGO_DB`` says.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

_BACKENDS = str(Path(__file__).resolve().parents[1] / "backends")
if _BACKENDS not in sys.path:  # as pytest's own import of tests/backends (no __init__)
    sys.path.insert(0, _BACKENDS)

import test_conformance  # noqa: E402
import test_operations  # noqa: E402

#: Tests of those modules that are about other stores, not the contract.
EXCLUDED = {
    "test_claim_only_backends_refuse_operations_clearly": "claim-only stores by URL",
    "test_memory_trigger_skips_every_taken_millisecond": "the memory store's frozen clock",
    "test_sqlite_file_written_before_the_registry_gains_it": "the core SQLite file layout",
}


def _shared_tests() -> dict[str, Any]:
    tests: dict[str, Any] = {}
    for module in (test_conformance, test_operations):
        for name, function in vars(module).items():
            if not name.startswith("test_") or not callable(function) or name in EXCLUDED:
                continue
            # A new store-specific test (no ``backend``) must be listed above, with a reason.
            assert "backend" in inspect.signature(function).parameters, name
            tests[name] = function
    return tests


globals().update(_shared_tests())
