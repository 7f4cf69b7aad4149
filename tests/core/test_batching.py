"""The runs an instance claims at one instant leave as one store request, and the
finishes of runs that end together as one; a batch lost on the way is retried and
every run is still recorded once. On virtual time, against the in-memory store.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from virtual import BASE_MS, Recorder, run_virtual

from anarchon_core import Scheduler
from anarchon_core.backend import Claim, ClaimRequest, FinishRequest
from anarchon_core.backends import MemoryBackend
from anarchon_core.faults import Faults, FaultyBackend
from anarchon_core.records import HistoryQuery, Status
from anarchon_core.testing import LoopClock

JOBS = 50


class BatchCounter(MemoryBackend):
    """Counts the store requests and how many runs each carried."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock=clock)
        self.claim_batches: list[int] = []
        self.finish_batches: list[int] = []

    async def claim(self, request: ClaimRequest) -> Claim:
        self.claim_batches.append(1)
        return await super().claim(request)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        self.claim_batches.append(len(requests))
        return [await MemoryBackend.claim(self, r) for r in requests]

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        self.finish_batches.append(len(requests))
        return await super().finish_many(requests)


def run(faults: Faults | None = None, seconds: float = 5.0) -> tuple[BatchCounter, Recorder]:
    recorder = Recorder()
    store = BatchCounter(recorder.clock)

    async def main() -> None:
        link = FaultyBackend(store, {"finish": faults} if faults else None, seed=7)
        scheduler = Scheduler(link, instance_id="solo", jitter_ms=200, clock=LoopClock(BASE_MS))
        for n in range(JOBS):
            scheduler.every(f"job{n}", "1s")(recorder.handler(100))
        await scheduler.start()
        await asyncio.sleep(seconds)
        await scheduler.stop(grace_ms=1000)

    run_virtual(main)
    return store, recorder


def test_the_runs_of_one_instant_are_claimed_and_finished_in_one_request_each() -> None:
    store, recorder = run()
    slots = {r.slot for r in recorder.executions}
    assert len(recorder.executions) == JOBS * len(slots) and len(slots) >= 4
    assert store.claim_batches == [JOBS] * len(slots), store.claim_batches
    assert store.finish_batches == [JOBS] * len(slots), store.finish_batches


def test_a_failed_finish_batch_is_retried_and_every_run_recorded_once() -> None:
    store, recorder = run(Faults(fail=0.3, lose=0.3))
    assert len(store.finish_batches) > len({r.slot for r in recorder.executions})

    async def history() -> Counter[tuple[str, int, Status]]:
        records = await store.history(HistoryQuery(limit=10_000))
        return Counter((r.job, r.slot, r.status) for r in records)

    records = run_virtual(history)
    ran = {(r.job, r.slot) for r in recorder.executions if r.completed}
    assert ran and all(records[job, slot, Status.SUCCESS] == 1 for job, slot in ran)
    assert not [key for key, count in records.items() if key[2] == Status.RUNNING]
