"""The backend conformance suite: the store contract as pytest tests, for any store.

Every store anarchon ships passes these tests, and so must a new one. They need pytest
(a test dependency: nothing else in ``anarchon_core`` imports this package). A store's
suite is two files:

``conftest.py`` — the plugin (one event loop per test, ``async def`` tests run on it)
and a ``backend`` fixture that yields an open, empty store, opened and closed on the
``runner`` loop::

    import pytest

    from my_store import MyBackend

    pytest_plugins = ["anarchon_core.conformance.plugin"]


    @pytest.fixture
    def backend(runner, tmp_path):
        store = MyBackend(tmp_path / "store")
        runner.run(store.open())
        try:
            yield store
        finally:
            runner.run(store.close())

``test_my_store_conformance.py`` — the tests, imported (``__all__`` of each module is
its tests and nothing else)::

    from anarchon_core.conformance.contract import *  # noqa: F403
    from anarchon_core.conformance.operations import *  # noqa: F403

- :mod:`~anarchon_core.conformance.contract`: claims, overlap, heartbeats, finish,
  release, takeover, retries, history and prune.
- :mod:`~anarchon_core.conformance.operations`: pause, manual runs, cancel and the
  instance registry (a claim-only store skips what it does not offer).
- :mod:`~anarchon_core.conformance.definitions`: job definitions kept in the store and
  the version a claim checks (a store that keeps none is skipped).
- :mod:`~anarchon_core.conformance.plugin`: the ``runner`` fixture and the hook that
  runs ``async def`` tests. ``pytest_plugins`` works only in the rootdir's
  ``conftest.py``; a deeper one imports ``pytest_pyfunc_call`` and ``runner`` from it.

Each test is a module-level ``async def test_…(backend)``; one test module can
parametrise ``backend`` over several stores. The tests use real time (short leases
die after a sleep), so the store judges time by its own clock. The helpers below
(requests with defaults, ``win``/``take`` that insist on winning, ``history_pages``)
serve a store's own tests too.
"""

from __future__ import annotations

import pytest

# Before the import: pytest explains a failed ``assert`` of these modules as it does
# in a test module's (nothing happens outside a pytest run).
pytest.register_assert_rewrite(
    "anarchon_core.conformance.contract",
    "anarchon_core.conformance.definitions",
    "anarchon_core.conformance.operations",
)

from anarchon_core.conformance import contract, operations  # noqa: E402
from anarchon_core.conformance.contract import *  # noqa: E402, F403
from anarchon_core.conformance.contract import (  # noqa: E402
    HOUR,
    JOB,
    LIVE_MS,
    RETRY_MS,
    SHORT_MS,
    claim_request,
    expire,
    history_pages,
    record,
    records,
    take,
    takeover_request,
    win,
)
from anarchon_core.conformance.operations import *  # noqa: E402, F403
from anarchon_core.conformance.operations import (  # noqa: E402
    ME,
    instance,
    manual,
    needs,
    needs_manual_runs,
    start,
)

__all__ = [
    "HOUR",
    "JOB",
    "LIVE_MS",
    "ME",
    "RETRY_MS",
    "SHORT_MS",
    "claim_request",
    "expire",
    "history_pages",
    "instance",
    "manual",
    "needs",
    "needs_manual_runs",
    "record",
    "records",
    "start",
    "take",
    "takeover_request",
    "win",
]
__all__ += contract.__all__
__all__ += operations.__all__
