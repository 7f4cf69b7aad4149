"""The helpers users get for their own tests: run_once, ManualClock, the scheduler fixture."""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core import ConfigurationError, RunContext, Scheduler, Status
from anarchon_core.backend import ClaimRequest, Lease
from anarchon_core.records import HistoryQuery, Origin, Outcome
from anarchon_core.testing import ManualClock, MemoryBackend, run_once


def test_run_once_gives_a_real_ctx(scheduler: Scheduler) -> None:
    @scheduler.every("report", "1h")
    def report(ctx: RunContext) -> str:
        ctx.meta["rows"] = 3
        return f"{ctx.job}@{ctx.slot}#{ctx.attempt}"

    result = run_once(scheduler, "report", slot=7_200_000)
    assert result.value == "report@7200000#1"
    assert result.ctx.meta == {"rows": 3}
    assert result.ctx.origin == Origin.MANUAL
    assert result.ctx.scheduled_at.hour == 2


def test_run_once_runs_async_handlers_and_propagates_errors(scheduler: Scheduler) -> None:
    @scheduler.every("boom", "1h")
    async def boom(ctx: RunContext) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"attempt {ctx.attempt}")

    with pytest.raises(ValueError, match="attempt 2"):
        run_once(scheduler, "boom", attempt=2)
    with pytest.raises(ConfigurationError, match="no job named 'nope'"):
        run_once(scheduler, "nope")


def test_manual_clock_steps_lease_expiry() -> None:
    clock = ManualClock(start_ms=1_000_000)
    backend = MemoryBackend(clock=clock)

    async def main() -> None:
        request = ClaimRequest("j", 1_000_000, Origin.SCHEDULE, "tok", "a", 3000, 60_000, True)
        assert (await backend.claim(request)).outcome == Outcome.WON
        assert await backend.due_runs({"j"}) == []
        clock.advance("3s")
        due = await backend.due_runs({"j"})
        assert [(d.slot, d.reason) for d in due] == [(1_000_000, "expired")]
        assert not await backend.finish(Lease("j", 1_000_000, 1, "other"), Status.SUCCESS)
        records = await backend.history(HistoryQuery(job="j"))
        assert records[0].status == Status.RUNNING

    asyncio.run(main())
    with pytest.raises(ConfigurationError, match="only moves forward"):
        clock.advance(-1)


def test_scheduler_fixture_is_on_memory(scheduler: Scheduler) -> None:
    assert isinstance(scheduler.backend, MemoryBackend)
    assert scheduler.instance_id == "test"


def test_run_once_runs_sync_handlers_off_the_event_loop_thread(scheduler: Scheduler) -> None:
    """As the scheduler does: a sync handler never blocks (or sees) the event loop."""
    import threading

    seen: list[tuple[str, bool]] = []

    @scheduler.every("where", "1m")
    def where(ctx: RunContext) -> None:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((threading.current_thread().name, on_loop))

    run_once(scheduler, "where")
    assert seen and seen[0][0] != threading.main_thread().name and not seen[0][1]
