"""Stored definitions on virtual time: three instances follow adds, changes, disables and
removals without a restart; no slot of a superseded definition runs, each slot once."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from virtual import BASE_MS, Recorder, run_virtual

from anarchon_core import BackgroundScheduler, MemoryBackend, RunContext, Scheduler
from anarchon_core.definitions import Definition
from anarchon_core.errors import ConfigurationError, ConflictError
from anarchon_core.records import HistoryQuery, RunRecord, Status, error_summary
from anarchon_core.schedules import At, Every
from anarchon_core.testing import LoopClock

HEARTBEAT_MS = 100
LEASE_MS = 300


def cluster(store: MemoryBackend, recorder: Recorder, n: int = 3) -> list[Scheduler]:
    schedulers = []
    for i in range(n):
        scheduler = Scheduler(
            store,
            instance_id=f"i{i}",
            heartbeat_ms=HEARTBEAT_MS,
            lease_ms=LEASE_MS,
            clock=LoopClock(BASE_MS),
        )
        work = recorder.handler(10)

        async def send(ctx: RunContext, *args: Any, work: Any = work, **kwargs: Any) -> None:
            await work(ctx)

        scheduler.add_target("reports.send", send)
        schedulers.append(scheduler)
    return schedulers


def slots_of(recorder: Recorder, job: str) -> list[int]:
    return sorted(r.slot - BASE_MS for r in recorder.executions if r.job == job)


def test_a_definition_added_changed_and_removed_is_followed_by_every_instance() -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    marks: dict[str, int] = {}

    async def main() -> None:
        schedulers = cluster(store, recorder)
        for scheduler in schedulers:
            await scheduler.start()
        await asyncio.sleep(0.5)
        added = await schedulers[0].add_definition(
            Definition.create("report", Every("1s"), "reports.send", args=[7])
        )
        marks["added"] = recorder.clock() - BASE_MS
        await asyncio.sleep(5)
        changed = await schedulers[1].update_definition(
            Definition.create("report", Every("2s", "500ms"), "reports.send", version=added.version)
        )
        marks["changed"] = recorder.clock() - BASE_MS
        await asyncio.sleep(6)
        await schedulers[2].remove_definition("report", version=changed.version)
        marks["removed"] = recorder.clock() - BASE_MS
        await asyncio.sleep(4)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    slots = slots_of(recorder, "report")
    assert len(slots) == len(set(slots)), "each slot once"
    before = [s for s in slots if s < marks["changed"]]
    after = [s for s in slots if s > marks["changed"]]
    # Added at 0.5 s: followed within a heartbeat, so from the slot at 1 s on.
    assert before == list(range(1000, 6000, 1000)), before
    # No slot of the old schedule (whole seconds) after the change; the new one's slots run.
    assert all(s % 2000 == 500 for s in after), after
    assert [s for s in after if s < marks["removed"]] == list(range(6500, 11_500, 2000))
    assert not [s for s in slots if s > marks["removed"]], "removed: no further run"


def test_a_replica_that_has_not_read_a_change_cannot_run_the_old_schedule() -> None:
    """The store refuses the claim of a superseded version at once, whatever the replica
    has read: here every follower is stalled (it never polls) after the first read."""
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    marks: dict[str, int] = {}

    async def main() -> None:
        schedulers = cluster(store, recorder)
        defined = await schedulers[0].add_definition(
            Definition.create("report", Every("1s"), "reports.send")
        )
        for scheduler in schedulers:
            await scheduler.start()
            engine = scheduler._engine
            assert engine is not None and engine.follower is not None
            engine.follower.kept = False  # the loop ends: no poll, only STALE wakes it
        await asyncio.sleep(3.2)
        await store.write_definition(
            "report",
            Definition.create("report", Every("1s"), "reports.send", enabled=False).body(),
            expected=defined.version,
        )
        marks["disabled"] = recorder.clock() - BASE_MS
        await asyncio.sleep(3)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    slots = slots_of(recorder, "report")
    assert slots == [1000, 2000, 3000]
    assert marks["disabled"] < 4000


@pytest.mark.parametrize("policy", ["none", "latest", "all"])
def test_enabled_again_a_definition_follows_its_catch_up_policy(policy: str) -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> None:
        schedulers = cluster(store, recorder)
        for scheduler in schedulers:
            await scheduler.start()
        first = await schedulers[0].add_definition(
            Definition.create("report", Every("1s"), "reports.send", options={"catch_up": policy})
        )
        await asyncio.sleep(2.5)  # runs 1 s and 2 s
        off = await schedulers[0].update_definition(
            Definition.create(
                "report",
                Every("1s"),
                "reports.send",
                options={"catch_up": policy},
                enabled=False,
                reason="maintenance",
                version=first.version,
            )
        )
        await asyncio.sleep(4)  # 3, 4, 5 and 6 s pass disabled
        await schedulers[0].update_definition(
            Definition.create(
                "report",
                Every("1s"),
                "reports.send",
                options={"catch_up": policy},
                version=off.version,
            )
        )
        await asyncio.sleep(2.8)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    executions = [r for r in recorder.executions if r.job == "report"]
    caught_up = sorted(r.slot - BASE_MS for r in executions if r.origin == "catch_up")
    scheduled = sorted(r.slot - BASE_MS for r in executions if r.origin == "schedule")
    assert scheduled == [1000, 2000, 7000, 8000, 9000]
    expected = {"none": [], "latest": [6000], "all": [3000, 4000, 5000, 6000]}[policy]
    assert caught_up == expected
    assert all(n == 1 for n in Counter(r.slot for r in executions).values())


def test_a_one_off_runs_once_cluster_wide() -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> None:
        schedulers = cluster(store, recorder)
        for scheduler in schedulers:
            await scheduler.start()
        await schedulers[0].add_definition(
            Definition.create("once", At(BASE_MS + 2500), "reports.send")
        )
        await asyncio.sleep(5)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    assert slots_of(recorder, "once") == [2500]


def test_edits_are_refused_when_stale_or_shadowing_a_code_job() -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    def replica(instance_id: str, job: str, *, sync: bool) -> Scheduler:
        other = Scheduler(
            store,
            instance_id=instance_id,
            heartbeat_ms=HEARTBEAT_MS,
            lease_ms=LEASE_MS,
            clock=LoopClock(BASE_MS),
            sync_code_jobs=sync,
        )
        other.every(job, "1s")(recorder.handler(1))
        return other

    async def main() -> None:
        (scheduler,) = cluster(store, recorder, n=1)
        scheduler.every("tick", "1s")(recorder.handler(1))
        with pytest.raises(ConfigurationError, match="shadow the code job"):
            await scheduler.add_definition(Definition.create("tick", Every("1s"), "reports.send"))
        # Code jobs of other live instances: their registry entries list each job's name
        # and fingerprint only; the stored definitions tell a code job from a stored one.
        unsynced = replica("tock-1", "tock", sync=False)
        synced = replica("tack-1", "tack", sync=True)
        for other in (unsynced, synced):
            await other.start()
        await asyncio.sleep(0.3)  # both listed in the registry
        assert await scheduler.get_definition("tock") is None  # not stored: a code job
        with pytest.raises(ConfigurationError, match=r"shadow the code job .* on instance tock-1"):
            await scheduler.add_definition(Definition.create("tock", Every("2s"), "reports.send"))
        tack = await scheduler.get_definition("tack")
        assert tack is not None and tack.owner == "code"  # stored by its start
        with pytest.raises(ConfigurationError, match=r"shadow the code job .* owner 'code'"):
            await scheduler.add_definition(Definition.create("tack", Every("2s"), "reports.send"))
        await unsynced.stop()
        first = await scheduler.add_definition(
            Definition.create("report", Every("1s"), "reports.send")
        )
        await scheduler.start()  # it runs the stored job: its entry lists "report"
        await asyncio.sleep(0.3)
        live = {info.instance_id: info.jobs.keys() for info in await scheduler.instances()}
        assert live == {"i0": {"tick", "report"}, "tack-1": {"tack"}}
        with pytest.raises(ConflictError, match="exists already"):  # a stored job's name
            await scheduler.add_definition(Definition.create("report", Every("2s"), "x.y"))
        await scheduler.update_definition(
            Definition.create("report", Every("2s"), "reports.send", version=first.version)
        )
        with pytest.raises(ConflictError, match="changed since it was read") as stale:
            await scheduler.update_definition(
                Definition.create("report", Every("3s"), "reports.send", version=first.version)
            )
        assert stale.value.current > first.version
        report = await scheduler.get_definition("report")
        assert report is not None and report.schedule == Every("2s")
        # "tack" stays stored: its sync kept the code job that another live instance runs.
        assert [d.name for d in await scheduler.definitions()] == ["report", "tack", "tick"]
        await asyncio.gather(scheduler.stop(), synced.stop())

    run_virtual(main)


def test_code_jobs_sync_into_the_store_and_leave_it_with_the_code() -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> None:
        old = Scheduler(store, namespace="svc", clock=LoopClock(BASE_MS))
        old.every("a", "1s")(recorder.handler(1))
        old.cron("b", "0 3 * * *", tz="Europe/Athens")(recorder.handler(1))
        report = await old.sync_code_jobs()
        assert report.created == ["a", "b"]
        assert (await old.sync_code_jobs()).unchanged == ["a", "b"]
        new = Scheduler(store, namespace="svc", clock=LoopClock(BASE_MS))
        new.every("a", "2s")(recorder.handler(1))
        report = await new.sync_code_jobs()
        assert (report.updated, report.removed) == (["a"], ["b"])
        (a,) = await new.definitions()
        assert (a.owner, a.schedule, a.target) == ("code", Every("2s"), "a")
        assert a.description.startswith("code job virtual:")  # where the handler is
        with pytest.raises(ConfigurationError, match="change it in the code"):
            await new.update_definition(
                Definition.create("a", Every("5s"), "reports.send", version=a.version)
            )

    run_virtual(main)


def test_the_background_scheduler_edits_definitions_from_synchronous_code(tmp_path: Path) -> None:
    """A sync host (Django, Celery) edits definitions on the engine's loop while it runs,
    and on a loop of its own while it does not; the runs follow on a real SQLite file."""
    ran = threading.Event()
    scheduler = Scheduler(f"sqlite:///{tmp_path / 'store.sqlite3'}", heartbeat_ms=100)

    @scheduler.target("reports.send")
    def send(ctx: RunContext, n: int) -> None:
        assert n == 3
        ran.set()

    background = BackgroundScheduler(scheduler)
    first = background.add_definition(Definition.create("report", Every("1s"), "x.y"))
    assert first.version == 1 and background.get_definition("report") == first
    background.start()
    try:
        second = background.update_definition(
            Definition.create("report", Every("1s"), "reports.send", args=[3], version=1)
        )
        assert ran.wait(5), "the changed definition ran"
        assert [d.version for d in background.definitions()] == [second.version]
        background.remove_definition("report", version=second.version)
        assert background.definitions() == []
    finally:
        background.stop()
    assert background.sync_code_jobs().created == []


def test_one_offs_that_fired_are_removed_after_the_retention_unless_kept() -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> list[str]:
        (scheduler,) = cluster(store, recorder, n=1)
        for name, at, keep in (("old", 1000, False), ("kept", 1000, True), ("new", 9000, False)):
            await scheduler.add_definition(
                Definition.create(name, At(BASE_MS + at), "reports.send", keep=keep)
            )
        await scheduler.add_definition(Definition.create("every", Every("1s"), "reports.send"))
        await scheduler.start()
        engine = scheduler._engine
        assert engine is not None and engine.follower is not None
        assert await engine.follower.retire_one_offs(BASE_MS + 5000) == 1
        assert await engine.follower.retire_one_offs(BASE_MS + 5000) == 0
        await scheduler.stop()
        return [d.name for d in await scheduler.definitions()]

    assert run_virtual(main) == ["every", "kept", "new"]


def test_a_target_that_no_live_instance_holds_records_a_failure_per_slot() -> None:
    """An instance lacking a definition's target never runs it while another instance
    holds it; while none does, one instance records each slot as failed, saying so."""
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> list[RunRecord]:
        holders = cluster(store, recorder, n=2)
        lacking = Scheduler(
            store,
            instance_id="lacking",
            heartbeat_ms=HEARTBEAT_MS,
            lease_ms=LEASE_MS,
            clock=LoopClock(BASE_MS),
        )
        lacking.add_target("other.thing", recorder.handler(1))
        for scheduler in (*holders, lacking):
            await scheduler.start()
        await lacking.add_definition(Definition.create("held", Every("1s"), "reports.send"))
        await lacking.add_definition(Definition.create("nowhere", Every("1s"), "no.such"))
        await asyncio.sleep(4.5)
        await asyncio.gather(*(s.stop() for s in (*holders, lacking)))
        return await store.history(HistoryQuery(limit=1000))

    records = run_virtual(main)
    held = [r for r in records if r.job == "held"]
    assert held and all(r.status == Status.SUCCESS and r.instance_id != "lacking" for r in held)
    nowhere = [r for r in records if r.job == "nowhere"]
    assert len(nowhere) == len({r.slot for r in nowhere}) >= 3, "one record per slot"
    assert all(r.status == Status.FAILED for r in nowhere)
    summary = error_summary(nowhere[0].error)
    assert summary is not None and "MissingTargetError: target 'no.such'" in summary


def test_a_target_may_take_the_whole_definition() -> None:
    """An adapter's target reads more than the arguments (Celery's send options)."""
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    async def main() -> None:
        scheduler = Scheduler(store, heartbeat_ms=HEARTBEAT_MS, clock=LoopClock(BASE_MS))

        async def send(ctx: RunContext, definition: Definition) -> None:
            seen.append((definition.args, dict(definition.target_options)))

        scheduler.add_target("proj.tasks.add", send, takes_definition=True)
        await scheduler.add_definition(
            Definition.create(
                "add",
                Every("1s"),
                "proj.tasks.add",
                args=[1, 2],
                target_options={"queue": "math", "priority": 3},
            )
        )
        await scheduler.start()
        await asyncio.sleep(1.5)
        await scheduler.stop()

    run_virtual(main)
    assert seen == [((1, 2), {"queue": "math", "priority": 3})]


def test_a_targets_check_refuses_a_definition_when_it_is_planned(caplog) -> None:
    """A refused definition is logged when read, and each of its runs fails with the
    refusal (in the history) instead of calling the target; a corrected version runs."""
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    seen: list[dict[str, Any]] = []

    def check(definition: Definition) -> None:
        if "queu" in definition.target_options:
            raise ConfigurationError("target_options: unknown key 'queu'")

    async def main() -> list[RunRecord]:
        scheduler = Scheduler(store, heartbeat_ms=HEARTBEAT_MS, clock=LoopClock(BASE_MS))

        async def send(ctx: RunContext, definition: Definition) -> None:
            seen.append(dict(definition.target_options))

        scheduler.add_target("proj.tasks.add", send, takes_definition=True, check=check)
        bad = await scheduler.add_definition(
            Definition.create("add", Every("1s"), "proj.tasks.add", target_options={"queu": "q"})
        )
        await scheduler.start()
        await asyncio.sleep(2.5)
        good = Definition.create(
            "add", Every("1s"), "proj.tasks.add", target_options={"queue": "q"}, version=bad.version
        )
        await scheduler.update_definition(good)
        await asyncio.sleep(2.0)
        await scheduler.stop()
        return await store.history(HistoryQuery(job="add", limit=100))

    records = run_virtual(main)
    failed = [r for r in records if r.status == Status.FAILED]
    assert len(failed) >= 2
    summary = error_summary(failed[0].error)
    assert (
        summary is not None and "ConfigurationError: target_options: unknown key 'queu'" in summary
    )
    assert seen and all(options == {"queue": "q"} for options in seen)
    warned = [r for r in caplog.records if "cannot run as it is" in r.getMessage()]
    assert len(warned) == 1 and "unknown key 'queu'" in warned[0].getMessage()


def test_a_check_must_be_callable() -> None:
    scheduler = Scheduler(MemoryBackend())
    with pytest.raises(ConfigurationError, match="check 3 is not callable"):
        scheduler.add_target("t", lambda ctx, d: None, takes_definition=True, check=3)  # type: ignore[arg-type]
