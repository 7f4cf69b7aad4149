"""Cluster-wide operations (issue 6), proved identically on every backend.

The tests of pause/resume, manual runs, cancel and the instance registry are the
public suite's, :mod:`anarchon_core.conformance.operations`, collected here against
every registered store (the ``backend`` fixture of ``conftest.py``). The tests below
are about particular stores, not the contract: a claim-only store's refusals, the
memory store's frozen clock, the core SQLite file layout.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import pytest

from anarchon_core.backend import Backend
from anarchon_core.backends import backend_from_url
from anarchon_core.backends.memory import MemoryBackend
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.conformance import JOB, LIVE_MS, ME, instance, record, win
from anarchon_core.conformance.operations import *  # noqa: F403
from anarchon_core.errors import CapabilityError
from anarchon_core.records import Status

# -- claim-only backends ---------------------------------------------------------------
CLAIM_ONLY_URLS = [
    "nats://127.0.0.1:4222",
    "amqp://guest:guest@127.0.0.1:5672/",
    "redis://127.0.0.1:6379/0?strategy=stream-id",
    "redis://127.0.0.1:6379/0?strategy=script",
    "redis://127.0.0.1:6379/0?strategy=idmp",
]


@pytest.mark.parametrize("url", CLAIM_ONLY_URLS)
async def test_claim_only_backends_refuse_operations_clearly(url: str) -> None:
    """Each operation a claim-only backend does not implement names it and the lease ones.

    The refusal comes before any connection, so these stores are never opened.
    """
    store = backend_from_url(url)
    assert not store.capabilities.lease
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "set_paused": lambda: store.set_paused(JOB, True),
        "paused_jobs": store.paused_jobs,
        "trigger": lambda: store.trigger(JOB, ME),
        "cancel": lambda: store.cancel(JOB, 0),
        "register": lambda: store.register(instance("a:1:000000"), LIVE_MS),
        "unregister": lambda: store.unregister("a:1:000000"),
        "instances": store.instances,
    }
    refused = [op for op in calls if getattr(type(store), op) is getattr(Backend, op)]
    if not refused:
        pytest.skip(f"{store.name} implements every operation: its own suite tests them")
    for op in refused:
        with pytest.raises(CapabilityError, match=re.escape(store.name) + ".*sqlite://") as raised:
            await calls[op]()
        assert "claim-only" in str(raised.value)


# -- store specifics ---------------------------------------------------------------------
async def test_memory_trigger_skips_every_taken_millisecond() -> None:
    """Deterministic (a frozen clock): a trigger never takes a scheduled run's slot."""
    now = 1_700_000_000_000
    store = MemoryBackend(clock=lambda: now)
    for slot in (now, now + 1, now + 3):
        await win(store, slot, skip_overlap=False)
    assert await store.trigger(JOB, ME) == now + 2
    assert await store.trigger(JOB, ME) == now + 2


async def test_sqlite_file_written_before_the_registry_gains_it(tmp_path: Path) -> None:
    """A file from before the operations (no registry table) opens and works as is."""
    path = tmp_path / "old.sqlite3"
    store = SqliteBackend(path)
    await store.open()
    lease = await win(store, await store.now_ms())
    await store.close()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE anarchon_instances")
        conn.commit()
    store = SqliteBackend(path)
    await store.open()
    try:
        await store.register(instance("a:1:000000"), LIVE_MS)
        assert [i.instance_id for i in await store.instances()] == ["a:1:000000"]
        assert (await record(store, lease)).status == Status.RUNNING
    finally:
        await store.close()
