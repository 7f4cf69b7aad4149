"""The protocol under random faults: five instances on one in-memory store, virtual time.

One seed decides everything: each instance's clock offset (up to ±lease/2) and the
faults of its link (delayed replies up to two leases, lost replies after the store
applied the call, calls failing before they are sent), link cuts, and crashes (the
process dies: its handlers end at once and it never reaches the store again) with
restarts under a new instance id. A storm of faults is followed by a calm stretch
with every instance up and every link healthy; then everything stops.

:func:`simulate` returns a :class:`Report` of what broke the promises:

- two attempts of one run executing at once (``concurrent``), apart from those where
  the earlier attempt had been told to stop and ignored it (``ignored_fence``, allowed:
  a handler deaf to cancellation outlives its lease);
- a handler of a scheduled run started after its slot's horizon (``late``), by the
  store's (true) time, whatever the starting instance's own clock says (restarted
  instances catch up with the default ``catch_up="latest"``: a catch-up run's horizon is
  the catch-up window);
- a slot of the calm stretch with no run (``missed``);
- a run of the stored definition ``stored`` whose slot is not one of the definition in
  force when the store decided its claim (``superseded``): an operator changes,
  disables, removes and re-adds it during the storm, straight on the store;
- history that disagrees with what ran (``untrue``): ``success`` for an attempt whose
  handler did not complete, an attempt that ran with no record, a run left
  ``running``. An ``interrupted`` attempt whose handler did complete, but whose finish
  never reached the store before a backup took over, is counted apart
  (``unrecorded_finish``): the store cannot know it ran.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

from virtual import BASE_MS, Execution, Recorder, run_virtual

from anarchon_core import MemoryBackend, RunContext, Scheduler
from anarchon_core.definitions import Definition
from anarchon_core.records import HistoryQuery, RunRecord, Status
from anarchon_core.schedules import Every, Schedule
from anarchon_core.testing import Faults, FaultyBackend, LoopClock

INSTANCES = 5
HEARTBEAT_MS = 100
LEASE_MS = 300
STORM_S = 4.0
CALM_S = 3.0
#: Slots in the first part of the calm stretch may still wait on the storm's runs.
SETTLE_MS = 1500
#: (name, interval ms, handler ms, ignores cancellation)
JOBS = (
    ("fast", 200, 60, False),
    ("slow", 1000, 450, False),
    ("deaf", 1000, 250, True),
)
#: The stored definition's schedules the operator switches between (ms), and its last.
STORED_EVERY = (300, 500, 700)
STORED_FINAL_MS = 400


@dataclass
class Report:
    seed: int
    concurrent: list[tuple[Execution, Execution]] = field(default_factory=list)
    ignored_fence: int = 0
    late: list[Execution] = field(default_factory=list)
    missed: list[tuple[str, int]] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    untrue: list[str] = field(default_factory=list)
    unrecorded_finish: int = 0
    executions: int = 0
    takeovers: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    runs: list[Execution] = field(default_factory=list)
    #: The calm stretch, store-clock ms.
    calm_from: int = 0
    calm_to: int = 0
    #: The stored definition's changes: (store time, the schedule in force or None).
    definitions: list[tuple[int, Schedule | None]] = field(default_factory=list)

    @property
    def broken(self) -> bool:
        return bool(self.concurrent or self.late or self.missed or self.untrue or self.superseded)

    def explain(self) -> str:
        lines = [f"seed {self.seed} (replay: ANARCHON_SIM_SEED={self.seed})"]
        lines += [f"  concurrent: {a} | {b}" for a, b in self.concurrent]
        lines += [f"  late start: {run}" for run in self.late]
        lines += [f"  missed: {job}@{slot}" for job, slot in self.missed]
        lines += [f"  superseded: {why}" for why in self.superseded]
        lines += [f"  untrue history: {text}" for text in self.untrue]
        return "\n".join(lines)


@dataclass
class Instance:
    name: str
    offset_ms: int
    link: FaultyBackend
    scheduler: Scheduler


def simulate(seed: int) -> Report:
    rng = random.Random(seed)
    random.seed(seed)  # the engines' jitter and sweep pacing
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    storm = Faults(
        delay=rng.uniform(0.02, 0.15),
        max_delay_ms=2 * LEASE_MS,
        lose=rng.uniform(0.0, 0.08),
        fail=rng.uniform(0.0, 0.08),
    )
    report = Report(seed)
    jitter = rng.choice((0, 40))
    candidates = rng.choice((1, 2, None))

    def make(name: str, offset: int, faults: Faults | None = storm) -> Instance:
        link = FaultyBackend(
            store, faults, seed=rng.randrange(2**32), reply_timeout_ms=rng.choice((50, 150))
        )
        scheduler = Scheduler(
            link,
            instance_id=name,
            heartbeat_ms=HEARTBEAT_MS,
            lease_ms=LEASE_MS,
            jitter_ms=jitter,
            max_attempts=5,
            candidates=candidates,
            clock=LoopClock(BASE_MS, offset),
        )
        for job, every, work, deaf in JOBS:
            scheduler.every(job, f"{every}ms")(recorder.handler(work, ignores_cancel=deaf))
        stored = recorder.handler(60)

        async def target(ctx: RunContext) -> None:
            await stored(ctx)

        scheduler.add_target("t", target)
        return Instance(name, offset, link, scheduler)

    version = 0

    async def change(schedule: Schedule | None, enabled: bool = True) -> None:
        """The operator's change of the stored definition, on a healthy link."""
        nonlocal version
        if schedule is None:
            if version:
                await store.write_definition("stored", None, expected=version)
                version = 0
        else:
            body = Definition.create("stored", schedule, "t", enabled=enabled).body()
            version = await store.write_definition("stored", body, expected=version)
        report.definitions.append((recorder.clock(), schedule if enabled else None))

    async def main() -> list[RunRecord]:
        hosts = [rng.randint(-LEASE_MS // 2, LEASE_MS // 2) for _ in range(INSTANCES)]
        live = [make(f"i{n}", hosts[n]) for n in range(INSTANCES)]
        generation = Counter[int]()
        for instance in live:
            await instance.scheduler.start()
        await change(Every(f"{rng.choice(STORED_EVERY)}ms"))
        dying: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        storm_end = loop.time() + STORM_S
        while loop.time() < storm_end:
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            n = rng.randrange(INSTANCES)
            instance = live[n]
            roll = rng.random()
            if roll < 0.35:
                instance.link.cut(rng.uniform(50, 2 * LEASE_MS))
            elif roll < 0.55 and instance.name not in recorder.dead:
                recorder.kill(instance.name)
                instance.link.cut(None)
                dying.append(asyncio.ensure_future(instance.scheduler.stop(grace_ms=0)))
            elif instance.name in recorder.dead:
                generation[n] += 1
                live[n] = make(f"i{n}.{generation[n]}", hosts[n])
                await live[n].scheduler.start()
            if rng.random() < 0.3:
                what = rng.random()
                every = Every(f"{rng.choice(STORED_EVERY)}ms")
                if what < 0.6:
                    await change(every)
                elif what < 0.8:
                    await change(every, enabled=False)
                else:
                    await change(None)
        await change(Every(f"{STORED_FINAL_MS}ms"))
        for n, instance in enumerate(live):  # the calm: every instance up, every link healthy
            report.faults.update(instance.link.injected)
            if instance.name not in recorder.dead:  # a dead one's link stays cut
                instance.link.set_faults(None)
                instance.link.mend()
            else:
                generation[n] += 1
                live[n] = make(f"i{n}.{generation[n]}", hosts[n], None)
                await live[n].scheduler.start()
        report.calm_from = recorder.clock()
        await asyncio.sleep(CALM_S)
        report.calm_to = recorder.clock()
        await asyncio.gather(*(i.scheduler.stop(grace_ms=1000) for i in live), *dying)
        return await store.history(HistoryQuery(limit=100_000))

    records = run_virtual(main)
    _judge(report, recorder, records)
    return report


def _judge(report: Report, recorder: Recorder, records: list[RunRecord]) -> None:
    runs = report.runs = recorder.executions
    report.executions = len(runs)
    report.takeovers = sum(1 for r in records if r.attempt >= 2)
    for first, second in recorder.overlapping():
        told = first.told_to_stop_at
        if first.ignores_cancel and told is not None and told <= second.start:
            report.ignored_fence += 1
        else:
            report.concurrent.append((first, second))
    intervals = {job: every for job, every, _, _ in JOBS} | {"stored": max(STORED_EVERY)}
    for run in runs:  # a catch-up run's horizon is the catch-up window: never late here
        if run.origin == "schedule" and run.start > run.slot + intervals[run.job]:
            report.late.append(run)
    by_attempt = {(r.job, r.slot, r.attempt): r for r in records}
    ran = {(run.job, run.slot, run.attempt): run for run in runs}
    for key, run in ran.items():
        record = by_attempt.get(key)
        if record is None:
            report.untrue.append(f"{run} ran with no record")
        elif record.instance_id != run.instance:
            report.untrue.append(f"{run} ran, recorded for {record.instance_id}")
    for key, record in by_attempt.items():
        run = ran.get(key)
        if record.status == Status.RUNNING:
            report.untrue.append(f"{record} still running at the end")
        elif record.status == Status.SUCCESS and (run is None or not run.completed):
            report.untrue.append(f"{record} success, but its handler did not complete: {run}")
        elif record.status == Status.FAILED and run is None:
            report.untrue.append(f"{record} failed, but its handler never ran")
        elif record.status == Status.INTERRUPTED and run is not None and run.completed:
            report.unrecorded_finish += 1
    _judge_stored(report, runs, by_attempt)
    started = {(run.job, run.slot) for run in runs}
    nothing_ran = {(r.job, r.slot) for r in records if r.status in (Status.SKIPPED, Status.PAUSED)}
    for job, every, _, _ in (*JOBS, ("stored", STORED_FINAL_MS, 0, False)):
        first = (report.calm_from + SETTLE_MS) // every * every + every
        for slot in range(first, report.calm_to - every - LEASE_MS, every):
            if (job, slot) not in started and (job, slot) not in nothing_ran:
                report.missed.append((job, slot))


def _judge_stored(
    report: Report, runs: list[Execution], by_attempt: dict[tuple[str, int, int], RunRecord]
) -> None:
    """Each first attempt of the stored job claimed a slot of the definition in force
    when the store decided it (a change at that very instant may order either way)."""
    for run in runs:
        if run.job != "stored" or run.attempt != 1:
            continue
        record = by_attempt.get((run.job, run.slot, 1))
        if record is None or record.claimed_at is None:
            continue  # reported as untrue
        decided = record.claimed_at
        candidates = [s for t, s in report.definitions if t == decided]
        before = [s for t, s in report.definitions if t < decided]
        candidates.append(before[-1] if before else None)
        if not any(
            s is not None and run.slot in s.slots_between(run.slot - 1, run.slot)
            for s in candidates
        ):
            report.superseded.append(f"{run} claimed at {decided}, definitions {candidates}")
