"""Issue 27, one scenario per defect: each reproduces one on the in-memory store.

Every test here is marked ``issue27``: each one FAILED on main when it was written
(before the engine's fixes for issue 27), deterministically, on virtual time. The
deployment simulation (``tests/deploy_simulation.py``) finds the same defects among
random deployments; these pin each one down alone.

1. instances that do not hold a job are ranked as its candidates;
2. jitter is not clamped to the claim horizon;
3. ``stop()`` hands over an attempt whose handler returned while its finish is pending;
4. a forward clock step replays the backlog one slot (and one warning) at a time (and,
   found by the simulation, a backward one puts the slot loop to sleep for the step);
5. catch-up claims skip the overlap check;
6. a graceful stop stays in the ranking through its grace;
7. (found by the simulation) replicas started just after a slot are ranked for it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from virtual import BASE_MS, Recorder, describe, run_virtual

from anarchon_core import Backend, MemoryBackend, Scheduler
from anarchon_core.records import HistoryQuery, RunRecord
from anarchon_core.testing import FaultyBackend, LoopClock

issue27 = pytest.mark.issue27
FAST: dict[str, Any] = {"heartbeat_ms": 100, "lease_ms": 300}


def make(store: Backend, name: str, clock: LoopClock | None = None, **options: object) -> Scheduler:
    clock = clock or LoopClock(BASE_MS)
    return Scheduler(store, instance_id=name, clock=clock, **options)  # type: ignore[arg-type]


async def history(store: MemoryBackend) -> list[RunRecord]:
    return await store.history(HistoryQuery(limit=100_000))


def seconds(ms: int) -> str:
    return f"{(ms - BASE_MS) / 1000:g}s"


@issue27
def test_1_instances_of_another_service_are_not_candidates_for_a_job_they_do_not_hold() -> None:
    """Two instances of ``orders`` beside four of ``billing`` on one store, each service
    with its own job every second: every slot of both runs (issue 27 saw 4 of 27 of
    ``orders:sync`` never run: billing's instances were ranked as its candidates)."""
    random.seed(1)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> None:
        schedulers = []
        for service, job, count in (("orders", "sync", 2), ("billing", "invoice", 4)):
            for n in range(count):
                scheduler = make(store, f"{service}-{n}", namespace=service, **FAST)
                scheduler.every(job, "1s")(recorder.handler(50))
                schedulers.append(scheduler)
        for scheduler in schedulers:
            await scheduler.start()
        await asyncio.sleep(30)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    ran = {(run.job, run.slot) for run in recorder.executions}
    slots = range(BASE_MS + 2000, BASE_MS + 29_000, 1000)
    for job in ("sync", "invoice"):
        missed = [seconds(slot) for slot in slots if (job, slot) not in ran]
        assert not missed, f"{len(missed)} of {len(slots)} slots of {job} never ran: {missed}"


@issue27
@pytest.mark.parametrize("candidates", [None, 2])
def test_2_jitter_never_pushes_a_claim_past_the_misfire_grace(candidates: int | None) -> None:
    """``every("10s", misfire_grace_ms=200)`` with the default jitter (500 ms) on two
    instances: every slot is claimed within its 200 ms horizon (issue 27 saw 19 of 58
    slots missed: both instances drew a jitter past the horizon). Unranked
    (``candidates=None``) the random jitter is clamped to half the horizon; ranked, the
    claim window is."""
    random.seed(2)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    async def main() -> None:
        schedulers = [make(store, f"i{n}", candidates=candidates) for n in range(2)]
        for scheduler in schedulers:
            scheduler.every("job", "10s", misfire_grace_ms=200)(recorder.handler(100))
            await scheduler.start()
        await asyncio.sleep(600)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    started = {run.slot: run.start for run in recorder.executions}
    slots = range(BASE_MS + 20_000, BASE_MS + 600_000, 10_000)
    missed = [seconds(slot) for slot in slots if slot not in started]
    assert not missed, f"{len(missed)} of {len(slots)} slots missed: {missed}"
    assert all(start <= slot + 200 for slot, start in started.items())


@issue27
def test_3_stop_never_hands_over_a_handler_that_returned_while_its_finish_is_retried() -> None:
    """A's handler returns, its finish write fails once (retried 50 ms later), and A
    stops 20 ms after the return with no grace: the run is recorded ``success`` and
    runs once (issue 27 saw A's attempt handed over, recorded ``interrupted``, and run
    again by B)."""
    random.seed(3)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    link = FaultyBackend(store)
    slot = BASE_MS + 10_000

    async def main() -> list[RunRecord]:
        a = make(link, "a", jitter_ms=0, **FAST)
        b = make(store, "b", jitter_ms=0, **FAST)
        for scheduler in (a, b):
            scheduler.every("job", "10s")(recorder.handler(1000))
        await a.start()
        await asyncio.sleep(10.26)  # A alone claims the slot at 10 s; B backs it up
        await b.start()
        await asyncio.sleep(0.64)
        link.once("finish", fail=True)  # the handler returns at 11 s
        await asyncio.sleep(0.12)
        await a.stop(grace_ms=0)
        await asyncio.sleep(2)
        await b.stop()
        return await history(store)

    records = run_virtual(main)
    assert link.injected["finish:failed"] == 1
    runs = [run for run in recorder.executions if run.slot == slot]
    assert [(r.instance, r.completed) for r in runs] == [("a", True)], describe(runs)
    found = sorted((r.attempt, str(r.status), r.instance_id) for r in records if r.slot == slot)
    assert found == [(1, "success", "a")], found


class _CountingHandler(logging.Handler):
    """Counts the WARNING records about each job (no record is kept)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_job: Counter[str | None] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.by_job[getattr(record, "job", None)] += 1


@pytest.fixture
def warnings_per_job() -> Iterator[_CountingHandler]:
    engine = logging.getLogger("anarchon")
    handler = _CountingHandler()
    level, propagate = engine.level, engine.propagate
    engine.setLevel(logging.WARNING)
    engine.propagate = False  # a million records would swamp pytest's log capture
    engine.addHandler(handler)
    yield handler
    engine.removeHandler(handler)
    engine.setLevel(level)
    engine.propagate = propagate


@issue27
def test_4_a_forward_clock_step_skips_the_backlog_and_reports_it_once_per_job(
    warnings_per_job: _CountingHandler,
) -> None:
    """50 jobs every second; the host's clock (the store's too) steps 1 h forward.
    The first slot after the step runs within its horizon, and the slots the step
    left behind are reported at most once per job (issue 27 saw one ``abandoned``
    warning per slot (720,000 for 200 jobs) and the first run 11 s late; on virtual time
    the replay costs no time, so the flood is what shows here)."""
    random.seed(4)
    recorder = Recorder()
    clock = LoopClock(BASE_MS)
    store = MemoryBackend(clock=clock)
    jobs = [f"job{n}" for n in range(50)]
    step_ms = 3_600_000

    async def main() -> int:
        scheduler = make(store, "one", clock=clock, **FAST)
        for job in jobs:
            scheduler.every(job, "1s")(recorder.handler(10))
        await scheduler.start()
        await asyncio.sleep(3.5)
        warnings_per_job.by_job.clear()
        clock.offset_ms += step_ms
        stepped_at = clock()
        await asyncio.sleep(3)
        await scheduler.stop()
        return stepped_at

    stepped_at = run_virtual(main)
    first = (stepped_at // 1000 + 1) * 1000  # the first slot after the step
    started = {(run.job, run.slot): run.start for run in recorder.executions}
    late = [job for job in jobs if started.get((job, first), first + 10_000) > first + 1000]
    assert not late, f"{len(late)} job(s) did not run {first} within its 1 s horizon: {late[:5]}"
    flooded = {job: n for job, n in warnings_per_job.by_job.items() if job and n > 1}
    assert not flooded, (
        f"{len(flooded)} job(s) logged more than one warning after the step, e.g. "
        f"{dict(list(flooded.items())[:3])}"
    )


@issue27
def test_4b_a_clock_stepped_back_then_corrected_claims_again_at_once() -> None:
    """The same defect the other way (found by the deployment simulation, seed 231):
    one instance's clock steps 1 min back, and is corrected 0.5 s later. Every slot
    from a second after the correction runs (on main the slot loop slept through the
    step, a minute of loop time, since it had computed its wait before the step)."""
    random.seed(4)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    clock = LoopClock(BASE_MS)

    async def main() -> None:
        scheduler = make(store, "one", clock=clock, **FAST)
        scheduler.every("tick", "250ms")(recorder.handler(10))
        await scheduler.start()
        await asyncio.sleep(3.55)
        clock.offset_ms -= 60_000
        await asyncio.sleep(0.5)
        clock.offset_ms += 60_000
        await asyncio.sleep(6)
        await scheduler.stop()

    run_virtual(main)
    ran = {run.slot for run in recorder.executions}
    slots = range(BASE_MS + 5000, BASE_MS + 10_000, 250)
    missed = [seconds(slot) for slot in slots if slot not in ran]
    assert not missed, f"{len(missed)} of {len(slots)} slots after the correction missed: {missed}"


@issue27
def test_5_a_catch_up_run_never_starts_beside_the_live_run_of_its_job() -> None:
    """``overlap="skip"``, every 10 s, an 8 s handler, ``catch_up="all"``. The only
    instance stops after the slot of 20 s (the slot of 30 s is missed) and a new one
    starts 100 ms before the slot of 40 s, its first store read (catch-up's) answered
    500 ms late: the catch-up run of 30 s must not run beside the scheduled run of 40 s
    (issue 27 saw them run side by side)."""
    random.seed(5)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)

    def define(scheduler: Scheduler) -> Scheduler:
        scheduler.every("job", "10s", overlap="skip", catch_up="all")(recorder.handler(8000))
        return scheduler

    async def main() -> None:
        first = define(make(store, "first", jitter_ms=0, **FAST))
        await first.start()
        await asyncio.sleep(29)
        await first.stop()
        link = FaultyBackend(store)
        link.once("other", delay_ms=500)  # catch-up's read of the last recorded slot
        restarted = define(make(link, "restarted", jitter_ms=0, **FAST))
        await asyncio.sleep(39.9 - 29)
        await restarted.start()
        await asyncio.sleep(25)
        await restarted.stop()
        assert link.injected["other:delayed"] == 1

    run_virtual(main)
    origins = {(run.slot, run.attempt): run for run in recorder.executions}
    assert (BASE_MS + 30_000, 1) in origins, describe(recorder.executions)  # caught up
    runs = sorted(recorder.executions, key=lambda run: run.start)
    beside = [
        (a, b)
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
        if a.end is not None and b.start < a.end
    ]
    assert not beside, "runs of one job side by side:\n" + describe(beside)


@issue27
def test_6_instances_stopping_gracefully_leave_the_ranking_at_once() -> None:
    """Six instances (one candidate per run) with runs in flight; five stop gracefully
    (a 10 s grace) while their runs go on. The survivor runs every one-second slot that
    comes due a registry period after the stop (issue 27 saw slots missed: survivors
    ranked the stopping instances, which claim nothing, until their registry entries
    expired one lease later)."""
    random.seed(6)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    options: dict[str, Any] = {
        "heartbeat_ms": 100,
        "lease_ms": 3000,
        "candidates": 1,
        "jitter_ms": 0,
    }

    async def main() -> int:
        schedulers = [make(store, f"i{n}", **options) for n in range(6)]
        for scheduler in schedulers:
            scheduler.every("tick", "1s")(recorder.handler(10))
            scheduler.every("batch", "200ms", overlap="allow")(recorder.handler(3000))
            await scheduler.start()
        await asyncio.sleep(5.3)
        busy = {run.instance for run in recorder.executions if run.end is None}
        going = [s for s in schedulers if s.instance_id in busy][:5]
        assert len(going) == 5, busy  # every one of them has a run in flight
        stopped_at = recorder.clock()
        stops = [asyncio.ensure_future(s.stop(grace_ms=10_000)) for s in going]
        await asyncio.sleep(4)
        await asyncio.gather(*stops, *(s.stop() for s in schedulers if s not in going))
        return stopped_at

    stopped_at = run_virtual(main)
    ran = {run.slot for run in recorder.executions if run.job == "tick"}
    slots = range((stopped_at + 200) // 1000 * 1000 + 1000, stopped_at + 4000, 1000)
    missed = [seconds(slot) for slot in slots if slot not in ran]
    assert not missed, f"{len(missed)} of {len(slots)} slots after the stop missed: {missed}"


@issue27
def test_7_a_replica_started_after_a_slot_is_not_ranked_for_it() -> None:
    """Found by the deployment simulation (seed 171), beside issue 27's six: replicas
    that start a few milliseconds after a slot (a scale-up, a deploy) must not be
    ranked for it, since their slot loops begin with the next slot. One replica runs
    a job every second (one candidate per run, jitter up to 250 ms); five times, three
    new replicas start 5 ms after a slot and leave 2 s later. Every slot runs (on main,
    the old replica read the registry during its jitter, ranked the newcomers above
    itself, and nobody claimed the slot)."""
    random.seed(7)
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    options: dict[str, Any] = {**FAST, "candidates": 1, "jitter_ms": 500}

    async def main() -> None:
        old = make(store, "old", **options)
        old.every("tick", "1s")(recorder.handler(10))
        await old.start()
        await asyncio.sleep(2.005)
        for wave in range(5):
            new = [make(store, f"new-{wave}-{n}", **options) for n in range(3)]
            for scheduler in new:
                scheduler.every("tick", "1s")(recorder.handler(10))
                await scheduler.start()
            await asyncio.sleep(2)
            await asyncio.gather(*(s.stop(grace_ms=0) for s in new))
            await asyncio.sleep(1)
        await old.stop()

    run_virtual(main)
    ran = {run.slot for run in recorder.executions}
    slots = range(BASE_MS + 2000, BASE_MS + 16_000, 1000)
    missed = [seconds(slot) for slot in slots if slot not in ran]
    assert not missed, f"{len(missed)} of {len(slots)} slots missed: {missed}"
