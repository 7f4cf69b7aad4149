"""A starting scheduler stores its code jobs as ``owner='code'`` definitions (where the
dashboards read their schedules): once, only what changed, without letting a store that
keeps none, an outage or identical replicas starting together stop the start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from virtual import BASE_MS, Recorder, noop, run_virtual, scheduler_on

from anarchon_core import MemoryBackend, Scheduler, stored_jobs
from anarchon_core.backend import StoredDefinition
from anarchon_core.errors import BackendUnavailable, ConfigurationError, ConflictError
from anarchon_core.schedules import Every, Window
from anarchon_core.testing import LoopClock

HEARTBEAT_MS = 100


def build(store: MemoryBackend, **kw: Any) -> Scheduler:
    scheduler = scheduler_on(store, **kw)
    scheduler.every("a", "1s", noop, retries=1)
    scheduler.cron("b", "0 3 * * *", noop, tz="Europe/Athens")
    scheduler.add_job("custom", Window(Every("1s"), start_at=BASE_MS), noop)  # not storable
    return scheduler


def test_a_starting_scheduler_stores_its_code_jobs_once() -> None:
    store = MemoryBackend(clock=LoopClock(BASE_MS))

    async def main() -> None:
        off = build(store, sync_code_jobs=False)
        await off.start()
        await off.stop()
        assert await store.definitions_version() == 0  # turned off: nothing written
        first = build(store)
        await first.start()
        stored = {d.name: d for d in await first.definitions()}
        assert {name: d.owner for name, d in stored.items()} == {"a": "code", "b": "code"}
        assert stored["b"].schedule == first.jobs["b"].schedule
        assert stored["a"].options["retries"] == 1
        version = await store.definitions_version()
        await first.stop()
        again = build(store, instance_id="web-7f9c4d:13:d4e5f6")  # an identical replica
        await again.start()
        assert await store.definitions_version() == version  # nothing written again
        await again.stop()

    run_virtual(main)


def test_the_setting_is_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="sync_code_jobs 'yes' is not valid"):
        Scheduler(MemoryBackend(), sync_code_jobs="yes")  # type: ignore[arg-type]


def test_a_store_without_definitions_is_skipped_quietly_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = Scheduler(f"sqlite:///{tmp_path / 'a.sqlite3'}", heartbeat_ms=HEARTBEAT_MS)
    scheduler.every("a", "1s", noop)

    async def main() -> None:
        await scheduler.start()
        await asyncio.sleep(0.2)
        assert scheduler.running and scheduler.failed is None
        await scheduler.stop()

    with caplog.at_level(logging.INFO, logger="anarchon"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "definitions" in r.getMessage()]


class Unavailable(MemoryBackend):
    """The job table cannot be read: an outage of the store's definitions."""

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        raise BackendUnavailable("the store did not answer")


def test_an_outage_during_the_sync_does_not_stop_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    store = Unavailable(clock=recorder.clock)
    scheduler = scheduler_on(store)
    scheduler.every("a", "1s", recorder.handler(1))

    async def main() -> None:
        await scheduler.start()
        await asyncio.sleep(2.5)
        await scheduler.stop()

    with caplog.at_level(logging.INFO, logger="anarchon"):
        run_virtual(main)
    assert sorted(r.slot - BASE_MS for r in recorder.executions) == [1000, 2000]
    assert any("could not store the code jobs" in r.getMessage() for r in caplog.records)


class Interleaving(MemoryBackend):
    """Every definition read and write yields first, so that replicas starting together
    interleave their syncs; successful writes and refused ones are counted."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.written: list[str] = []
        self.conflicts = 0

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        await asyncio.sleep(0)
        return await super().definitions_since(version)

    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        await asyncio.sleep(0)
        try:
            version = await super().write_definition(job, body, expected=expected)
        except ConflictError:
            self.conflicts += 1
            raise
        self.written.append(job)
        return version


def test_identical_replicas_starting_together_sync_each_job_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Interleaving(clock=LoopClock(BASE_MS))
    replicas = [scheduler_on(store, f"web-{i}:1:aaaaaa") for i in range(3)]
    names = [f"job.{i:02d}" for i in range(20)]
    for replica in replicas:
        for name in names:
            replica.every(name, "1m", noop)

    async def main() -> Sequence[stored_jobs.SyncReport]:
        reports = await asyncio.gather(
            *(stored_jobs.sync_code_jobs(store, r.jobs, None) for r in replicas)
        )
        await asyncio.gather(*(r.start() for r in replicas))  # and through start
        assert all(r.running for r in replicas)
        await asyncio.gather(*(r.stop() for r in replicas))
        return reports

    with caplog.at_level(logging.WARNING, logger="anarchon"):
        reports = run_virtual(main)
    assert 0 < store.conflicts <= len(replicas) - 1  # they raced; each loser stopped once
    assert sorted(store.written) == names  # each written once, by one of them
    for report in reports:
        assert sorted(report.created + report.unchanged + report.raced) == names
    assert not caplog.records


def test_a_code_job_of_another_live_instance_is_not_pruned() -> None:
    """Two services in one namespace: a start removes the code-owned definitions of jobs
    that left its code only once no live instance lists them."""
    store = MemoryBackend(clock=LoopClock(BASE_MS))

    async def main() -> None:
        web = scheduler_on(store, "web:1:aaaaaa")
        web.every("web.sync", "1s", noop)
        beat = scheduler_on(store, "beat:1:bbbbbb")
        beat.every("beat.tick", "1s", noop)
        await web.start()
        await asyncio.sleep(0.3)  # web is listed in the registry
        await beat.start()  # its sync keeps web.sync
        report = await beat.sync_code_jobs()
        assert (report.unchanged, report.kept, report.removed) == (["beat.tick"], ["web.sync"], [])
        await web.stop()
        report = await beat.sync_code_jobs()
        assert report.removed == ["web.sync"]  # its service is gone
        assert [d.name for d in await beat.definitions()] == ["beat.tick"]
        await beat.stop()

    run_virtual(main)
