"""A property on virtual time: whatever sequence of adds, changes, removals, disables and
enables the store receives, three instances never run a slot of a definition that was
removed or superseded when the slot was claimed, never run a slot twice, and run every
slot of the current definition from one heartbeat after its change on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from virtual import BASE_MS, Recorder, run_virtual

from anarchon_core import MemoryBackend, RunContext, Scheduler
from anarchon_core.definitions import Definition
from anarchon_core.schedules import Every, Schedule
from anarchon_core.testing import LoopClock

HEARTBEAT_MS = 100
#: An instance follows a change within one heartbeat (and one store read).
FOLLOW_MS = 2 * HEARTBEAT_MS
END_MS = 12_000

EVERY = ["300ms", "500ms", "700ms", "1s"]


@dataclass(frozen=True)
class Step:
    at_ms: int  # after BASE_MS; halfway between two slots (every slot is on 100 ms), so a
    # claim and a change never fall on one instant of the (float) loop clock
    kind: str  # put, remove, disable
    every: str


steps = st.lists(
    st.builds(
        Step,
        st.integers(0, 100).map(lambda n: 100 * n + 50),
        st.sampled_from(["put", "put", "remove", "disable"]),
        st.sampled_from(EVERY),
    ),
    min_size=1,
    max_size=8,
).map(lambda xs: sorted(xs, key=lambda s: s.at_ms))


def simulate(plan: list[Step]) -> tuple[Recorder, list[tuple[int, Schedule | None]]]:
    """Run the plan; return what ran and the definition's history: (commit time, the
    schedule then in force, or None while removed or disabled)."""
    recorder = Recorder()
    store = MemoryBackend(clock=recorder.clock)
    history: list[tuple[int, Schedule | None]] = [(0, None)]

    async def main() -> None:
        schedulers = []
        for i in range(3):
            scheduler = Scheduler(
                store,
                instance_id=f"i{i}",
                heartbeat_ms=HEARTBEAT_MS,
                lease_ms=3 * HEARTBEAT_MS,
                clock=LoopClock(BASE_MS),
                catch_up="none",
            )
            work = recorder.handler(50)

            async def run(ctx: RunContext, work: Any = work) -> None:
                await work(ctx)

            scheduler.add_target("t", run)
            schedulers.append(scheduler)
            await scheduler.start()
        version = 0
        for step in plan:
            await asyncio.sleep((BASE_MS + step.at_ms - recorder.clock()) / 1000)
            if step.kind == "remove":
                if version:
                    await store.write_definition("job", None, expected=version)
                    version = 0
                    history.append((recorder.clock() - BASE_MS, None))
                continue
            definition = Definition.create(
                "job", Every(step.every), "t", enabled=step.kind == "put"
            )
            version = await store.write_definition("job", definition.body(), expected=version)
            schedule = definition.schedule if step.kind == "put" else None
            history.append((recorder.clock() - BASE_MS, schedule))
        await asyncio.sleep((BASE_MS + END_MS - recorder.clock()) / 1000)
        await asyncio.gather(*(s.stop() for s in schedulers))

    run_virtual(main)
    return recorder, history


def in_force(history: list[tuple[int, Schedule | None]], at: int) -> Schedule | None:
    current = None
    for since, schedule in history:
        if since <= at:
            current = schedule
    return current


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=steps)
def test_no_removed_or_superseded_slot_runs_and_each_slot_runs_once(plan: list[Step]) -> None:
    recorder, history = simulate(plan)
    runs = [r for r in recorder.executions if r.job == "job"]
    slots = [r.slot - BASE_MS for r in runs]
    assert len(slots) == len(set(slots)), "a slot ran twice"
    for run in runs:
        slot, started = run.slot - BASE_MS, run.start - BASE_MS
        schedule = in_force(history, started)
        assert schedule is not None, f"slot {slot} ran at {started} while removed: {plan}"
        assert run.slot in schedule.slots_between(run.slot - 1, run.slot), (
            f"slot {slot} (started {started}) is not a slot of {schedule!r}, in force: {plan}"
        )
    # Liveness: from one follow bound after each change to the next change, every slot
    # of the definition in force runs (the stop ends the run at END_MS).
    bounds = [*history[1:], (END_MS - 500, None)]
    for (since, schedule), (until, _) in zip(history, bounds[: len(history)], strict=True):
        if schedule is None:
            continue
        due = schedule.slots_between(BASE_MS + since + FOLLOW_MS, BASE_MS + until - 1)
        missing = sorted(set(due) - {r.slot for r in runs})
        assert not missing, f"slots {missing} of {schedule!r} (from {since}) did not run"
