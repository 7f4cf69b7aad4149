"""The engine on virtual time: claims in rank order start runs at their slot; an engine
loop that dies fails the scheduler loudly and takes it out of the registry."""

from __future__ import annotations

import asyncio
import logging

import pytest
from virtual import BASE_MS, Recorder, run_virtual

from anarchon_core import MemoryBackend, RunContext, Scheduler
from anarchon_core.errors import SchedulerStateError
from anarchon_core.records import HistoryQuery, Status
from anarchon_core.testing import LoopClock

HEARTBEAT_MS = 100
LEASE_MS = 300


def make(store: MemoryBackend, name: str, **options: object) -> Scheduler:
    return Scheduler(
        store,
        instance_id=name,
        heartbeat_ms=HEARTBEAT_MS,
        lease_ms=LEASE_MS,
        clock=LoopClock(BASE_MS),
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("k", [1, 2])
def test_ranked_runs_start_at_their_slot_without_a_random_wait(k: int) -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    waits: list[int] = []

    async def main() -> None:
        schedulers = [make(store, f"i{n}", candidates=k) for n in range(4)]
        for scheduler in schedulers:
            for j in range(5):
                handler = recorder.handler(20)

                async def handle(ctx: RunContext, handler=handler) -> None:  # type: ignore[no-untyped-def]
                    waits.append(ctx.jitter_ms)
                    await handler(ctx)

                scheduler.every(f"job{j}", "1s")(handle)
            await scheduler.start()
        await asyncio.sleep(6)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    # After a registry read, before the stop (a claim sent at the stop's instant runs too).
    ranked = [r for r in recorder.executions if BASE_MS + 2000 <= r.slot < BASE_MS + 6000]
    assert len(ranked) == 5 * 4
    assert {r.start - r.slot for r in ranked} == {0}, "the first candidate claims at the slot"
    assert len({(r.job, r.slot) for r in ranked}) == len(ranked)
    assert waits.count(0) >= len(ranked)
    assert len({r.instance for r in ranked}) > 1, "the runs spread over the instances"


def test_a_dead_slot_loop_fails_the_scheduler_and_leaves_the_registry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> tuple[set[str], set[str], BaseException | None]:
        broken, healthy = make(store, "broken"), make(store, "healthy")
        for scheduler in (broken, healthy):
            scheduler.every("tick", "1s")(recorder.handler(10))
            await scheduler.start()
        await asyncio.sleep(1.5)
        before = {i.instance_id for i in await store.instances()}
        engine = broken._engine
        assert engine is not None

        def boom(*args: object) -> None:
            raise RuntimeError("a bug in the planner")

        engine.slots._plan = boom  # type: ignore[method-assign]
        await asyncio.sleep(2.5)
        after = {i.instance_id for i in await store.instances()}
        failed = broken.failed
        await asyncio.gather(broken.stop(), healthy.stop())
        return before, after, failed

    with caplog.at_level(logging.ERROR, logger="anarchon"):
        before, after, failed = run_virtual(main)
    assert before == {"broken", "healthy"}
    assert after == {"healthy"}, "the failed instance left the registry at once"
    assert isinstance(failed, RuntimeError)
    assert any("engine loop crashed" in r.getMessage() for r in caplog.records)
    late = sorted(
        (r.slot, r.instance)
        for r in recorder.executions
        if BASE_MS + 2000 <= r.slot < BASE_MS + 4000
    )
    assert late == [(BASE_MS + 2000, "healthy"), (BASE_MS + 3000, "healthy")]


def test_run_ends_and_raises_when_an_engine_loop_dies() -> None:
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    scheduler = make(store, "solo")
    scheduler.every("tick", "1s")(lambda ctx: None)

    async def main() -> None:
        async def break_it() -> None:
            while scheduler._engine is None or not scheduler._engine.opened:
                await asyncio.sleep(0.01)

            def boom(*args: object) -> None:
                raise RuntimeError("a bug in the planner")

            scheduler._engine.slots._plan = boom  # type: ignore[method-assign]

        breaker = asyncio.ensure_future(break_it())
        try:
            await scheduler._run_until_signalled(grace_ms=0)
        finally:
            breaker.cancel()

    with pytest.raises(SchedulerStateError, match="stopped claiming: a bug in the planner"):
        run_virtual(main)
    assert not scheduler.running


class SlowFirstRead(MemoryBackend):
    """A store whose catch-up read answers only after ``delay_s`` (a cold pool)."""

    delay_s = 0.0

    async def last_scheduled_slot(self, job: str) -> int | None:
        await asyncio.sleep(self.delay_s)
        return await super().last_scheduled_slot(job)


def test_slots_due_while_a_job_catches_up_run_after_it_never_beside_it() -> None:
    """Restarted after an outage while its first store read is slow: the missed slots
    run in order, then the slots that came due meanwhile, one at a time, none skipped."""
    recorder = Recorder()
    store = SlowFirstRead(clock=recorder.clock)

    def scheduler() -> Scheduler:
        s = make(store, "solo")
        s.every("tick", "1s", catch_up="all", misfire_grace_ms=10_000)(recorder.handler(300))
        return s

    async def main() -> None:
        first = scheduler()
        await first.start()
        await asyncio.sleep(3.5)
        await first.stop()
        await asyncio.sleep(4.0)  # the outage
        store.delay_s = 1.5
        again = scheduler()
        await again.start()
        await asyncio.sleep(6.0)
        await again.stop()

    run_virtual(main)
    assert not recorder.overlapping()
    runs = sorted(r.slot for r in recorder.executions)
    assert runs == list(range(BASE_MS + 1000, BASE_MS + 14_000, 1000)), runs
    assert not [r for r in recorder.executions if r.end is None or not r.completed]


class SlowClaims(MemoryBackend):
    """A store whose claims are answered after ``delay_s`` (a slow link)."""

    delay_s = 0.05

    async def claim_many(self, requests):  # type: ignore[no-untyped-def]
        await asyncio.sleep(self.delay_s)
        return await super().claim_many(requests)

    async def claim(self, request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(self.delay_s)
        return await super().claim(request)


def test_a_claim_in_flight_at_a_stop_runs_within_the_grace() -> None:
    """Stopped while the claim of a slot is on its way: the run it wins is a run in
    flight like any other (it runs in the grace), not given back unstarted."""
    recorder = Recorder()
    store = SlowClaims(clock=recorder.clock)

    async def main() -> None:
        scheduler = make(store, "solo")
        scheduler.every("tick", "1s")(recorder.handler(200))
        await scheduler.start()
        await asyncio.sleep(3.02)  # the claim of slot 3000 is in flight
        await scheduler.stop(grace_ms=1000)

    run_virtual(main)
    records = run_virtual(lambda: store.history(HistoryQuery(job="tick", since=BASE_MS + 3000)))
    assert [(r.slot, r.status) for r in records] == [(BASE_MS + 3000, Status.SUCCESS)]
    assert [r.completed for r in recorder.executions if r.slot == BASE_MS + 3000] == [True]
