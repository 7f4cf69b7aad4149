"""Claim-only stores with real OS processes: one winner per slot, and no lease-only options.

Parametrised over ``registry.CLAIM_ONLY_URLS`` (each store module registers its
claim-only URLs). Claim-only stores promise exactly one winner per run, nothing
about takeover, so the test is the exactly-once one: many slots, several processes,
every slot run once and none missed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
from registry import CLAIM_ONLY_URLS, load_store_modules

from anarchon_core import Scheduler, Status
from anarchon_core.errors import CapabilityError

from .cluster import cluster, starts
from .test_lease_processes import grid_slots

load_store_modules()

pytestmark = pytest.mark.slow

STORES = sorted(CLAIM_ONLY_URLS)


@pytest.mark.parametrize("store", STORES)
def test_each_slot_runs_exactly_once(store: str, tmp_path: Path) -> None:
    jobs = [
        {"name": "tick", "every": "200ms", "kind": "async"},
        {"name": "tock", "every": "300ms", "kind": "sync"},
    ]
    with (
        CLAIM_ONLY_URLS[store](tmp_path) as url,
        cluster(url, tmp_path, jobs=jobs, jitter_ms=60) as c,
    ):
        c.start_all(4)
        ready = max(e["t"] for e in c.events() if e["e"] == "ready")
        time.sleep(4)
        until = time.time() - 0.5
        c.stop_all()
        events = c.events()
        logs = c.logs()
        history = c.history()
    assert "Traceback" not in logs
    for job, interval in (("tick", 200), ("tock", 300)):
        ran = Counter(e["slot"] for e in starts(events, job))
        duplicates = {slot: n for slot, n in ran.items() if n > 1}
        assert not duplicates, f"{job} ran twice: {duplicates}"
        expected = grid_slots(ready + 0.1, until, interval)
        missing = [s for s in expected if s not in ran]
        assert len(expected) >= 10
        assert not missing, f"{job} missed slots {missing}"
        recorded = Counter(r.slot for r in history if r.job == job)
        assert max(recorded.values(), default=1) == 1, f"{job}: a run is recorded twice"
        if history:  # a store that keeps a readable history records every run
            assert set(ran) <= set(recorded), f"{job}: a run that ran is not recorded"
    statuses = {r.status for r in history}
    assert statuses <= {Status.CLAIMED, Status.SUCCESS}
    assert len({e["instance"] for e in starts(events)}) >= 2, "winners should spread"


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize(
    ("where", "options"),
    [
        ("job", {"catch_up": "latest"}),
        ("job", {"overlap": "skip"}),
        ("scheduler", {"catch_up": "all"}),
        ("scheduler", {"overlap": "skip"}),
    ],
)
def test_lease_only_options_are_refused_at_start(
    store: str, where: str, options: dict[str, str], tmp_path: Path
) -> None:
    with CLAIM_ONLY_URLS[store](tmp_path) as url:
        scheduler = Scheduler(url, **(options if where == "scheduler" else {}))
        scheduler.every("job", "1s", lambda ctx: None, **(options if where == "job" else {}))
        with pytest.raises(CapabilityError) as err:
            asyncio.run(scheduler.start())
        assert not scheduler.running
    option, value = next(iter(options.items()))
    message = str(err.value)
    assert f"{option}={value!r}" in message
    assert scheduler.backend.describe() in message  # names the store and its strategy
    assert "claim-only" in message
