"""The registry entry holds who an instance is, its targets and the digest of its jobs
(store name → fingerprint); the jobs' schedules live in the stored definitions, which a
starting scheduler fills with its code jobs, and the API reads them there."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from virtual import BASE_MS, noop, run_virtual, scheduler_on

from anarchon_core import MemoryBackend
from anarchon_core.backend import InstanceInfo, instance_json
from anarchon_core.engine import registry
from anarchon_core.engine.candidates import Candidates
from anarchon_core.schedules import Every, Window
from anarchon_core.testing import LoopClock
from anarchon_core.web import api

JOBS = 1000


def test_an_entry_is_200_bytes_plus_40_per_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 jobs of a namespace: the entry lists each one's store name and fingerprint."""
    monkeypatch.setattr(registry.socket, "gethostname", lambda: "web-7f9c4d8b6-x2kqp")
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    scheduler = scheduler_on(store, "web-7f9c4d8b6-x2kqp:1:a1b2c3", namespace="billing")
    for i in range(JOBS):
        scheduler.every(f"sync.{i:04d}", "1m", noop)
    scheduler.add_target("reports.send", noop)

    async def main() -> list[InstanceInfo]:
        await scheduler.start()
        await asyncio.sleep(0.3)
        live = await store.instances()
        await scheduler.stop()
        return live

    (info,) = run_virtual(main)
    assert info.jobs == {job.store_name: job.fingerprint for job in scheduler.jobs.values()}
    assert all(len(fingerprint) == 16 for fingerprint in info.jobs.values())
    assert info.targets == ("reports.send",)
    size = len(instance_json(info).encode())
    assert size <= 200 + 40 * JOBS, size
    empty = len(
        instance_json(InstanceInfo(**{**info.to_json(), "jobs": {}, "targets": ()})).encode()
    )
    assert empty <= 200, empty


def test_an_older_entry_with_specs_is_read_as_a_digest() -> None:
    """A rolling upgrade: an older instance's entry maps each job to its whole spec."""
    old = {
        "instance_id": "old:1:aaaaaa",
        "host": "old",
        "pid": 1,
        "version": "0.1.0",
        "started_at": BASE_MS,
        "last_seen": BASE_MS,
        "jobs": {
            "sync": {"name": "sync", "schedule": "every 1m", "fingerprint": "0f3a9c1e5b7d2a64"},
            "odd": {"schedule": "every 1m"},
        },
    }
    info = InstanceInfo.from_json(old)
    assert info.jobs == {"sync": "0f3a9c1e5b7d2a64", "odd": ""}
    new = InstanceInfo.from_json(
        {**old, "instance_id": "new:1:bbbbbb", "jobs": {"sync": "0f3a9c1e5b7d2a64"}}
    )
    view = Candidates(2, "new:1:bbbbbb", stale_after_ms=10_000)
    view.update({i.instance_id: i.jobs for i in (info, new)}, 0)
    assert sorted(view.ranking("sync", "0f3a9c1e5b7d2a64", BASE_MS)) == [
        "new:1:bbbbbb",
        "old:1:aaaaaa",
    ]


def test_the_api_shows_a_code_jobs_schedule_from_its_stored_definition() -> None:
    """The registry entry lists a fingerprint only: the row's schedule, zone, options and
    next slots come from the stored definition, and without one the row has none."""
    store = MemoryBackend(clock=LoopClock(BASE_MS))

    async def main(sync: bool) -> tuple[dict[str, Any], InstanceInfo]:
        scheduler = scheduler_on(store, namespace="svc" if sync else "bare", sync_code_jobs=sync)
        scheduler.cron("nightly", "0 3 * * *", noop, tz="Europe/Athens", timeout_ms=60_000)
        await scheduler.start()
        await asyncio.sleep(0.3)
        data = await api.jobs(store, now_ms=BASE_MS)
        (info,) = await store.instances()
        await scheduler.stop()
        (row,) = [r for r in data["jobs"] if r["job"].endswith(":nightly")]
        return row, info

    row, info = run_virtual(lambda: main(True))
    assert info.jobs == {"svc:nightly": row["fingerprints"][0]}  # no schedule in the registry
    assert (row["job"], row["schedule"], row["tz"]) == (
        "svc:nightly",
        'cron "0 3 * * *" (Europe/Athens)',
        "Europe/Athens",
    )
    assert row["options"]["timeout_ms"] == 60_000
    assert row["next_slots"][0]["at"] == "2027-01-16T01:00:00.000Z"
    row, _ = run_virtual(lambda: main(False))
    assert (row["job"], row["schedule"], row["next_slots"], row["instances"]) == (
        "bare:nightly",
        None,
        [],
        1,
    )


def test_a_job_that_cannot_be_stored_shows_without_a_schedule() -> None:
    """A custom schedule (here a Window) has no stored definition: its row lists the live
    instance that runs it, with no schedule and no next slots, as an unknown job."""
    store = MemoryBackend(clock=LoopClock(BASE_MS))

    async def main() -> dict[str, Any]:
        scheduler = scheduler_on(store)
        scheduler.every("plain", "1s", noop)
        scheduler.add_job("custom", Window(Every("1s"), start_at=BASE_MS), noop)
        await scheduler.start()
        await asyncio.sleep(0.3)
        data = await api.jobs(store, now_ms=BASE_MS)
        await scheduler.stop()
        return {row["job"]: row for row in data["jobs"]}

    rows = run_virtual(main)
    assert (rows["plain"]["schedule"], len(rows["plain"]["next_slots"])) == ("every 1s", 5)
    custom = rows["custom"]
    assert (custom["schedule"], custom["next_slots"], custom["instances"]) == (None, [], 1)
