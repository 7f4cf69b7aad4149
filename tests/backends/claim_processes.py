"""What the claim-only backends' tests (NATS, RabbitMQ) share: opening a store for a block,
processes racing for the same runs, and schedulers riding out an outage of their server.

Each test module passes the URL of its isolated store and states what it expects of it;
the mechanics (spawned processes behind a barrier, schedulers across an outage, and
the no-second-run checks of the latter) are written once, here.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from multiprocessing.synchronize import Barrier
from typing import Any, TypeVar

import pytest
from claim_requests import claim_only_request, now_ms

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import Backend
from anarchon_core.backends import backend_from_url
from anarchon_core.records import Outcome

B = TypeVar("B", bound=Backend)


@asynccontextmanager
async def opened(store: B) -> AsyncIterator[B]:
    """``store``, open for the block and closed after it."""
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _claim_worker(
    url: str, slot: int, jobs: list[str], horizon_ms: int, barrier: Barrier, results: Any
) -> None:
    """One process: open its own store, wait for the others, claim every run once."""

    async def main() -> list[str]:
        async with opened(backend_from_url(url)) as store:
            await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
            requests = [claim_only_request(slot, job=job, horizon_ms=horizon_ms) for job in jobs]
            answers = await asyncio.gather(*(store.claim(r) for r in requests))
            return [job for job, a in zip(jobs, answers, strict=True) if a.outcome == Outcome.WON]

    results.put(asyncio.run(main()))


def claim_from_processes(
    url: str, jobs: list[str], *, processes: int, horizon_ms: int
) -> Counter[str]:
    """Spawned processes, each with its own connection, claim the same runs (``jobs`` at
    one slot, now) at once; returns how often each run was won."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    slot = now_ms()
    procs = [
        ctx.Process(target=_claim_worker, args=(url, slot, jobs, horizon_ms, barrier, results))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    won = Counter(job for _ in procs for job in results.get(timeout=60))
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    results.close()
    results.join_thread()
    return won


async def run_through_outage(
    url: str,
    outage: Callable[[], Awaitable[object]],
    caplog: pytest.LogCaptureFixture,
    wait_s: float = 10,
    *,
    start_s: float = 10,
) -> list[tuple[str, int]]:
    """Three schedulers run a job every 200 ms across ``outage``; returns (instance, slot).

    The job must run 3 times within ``start_s``, 5 more within ``wait_s`` of the outage's
    end, and never twice in one slot; no engine loop may crash.
    """
    runs: list[tuple[str, int]] = []
    schedulers = []
    for n in range(3):
        scheduler = Scheduler(url, instance_id=f"i{n}", jitter_ms=40)

        @scheduler.every("tick", "200ms")
        async def tick(ctx: RunContext) -> None:
            runs.append((ctx.instance_id, ctx.slot))

        schedulers.append(scheduler)

    async def ran(count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(runs) < count:
            assert time.monotonic() < deadline, f"only {len(runs)} runs"
            await asyncio.sleep(0.02)

    caplog.set_level(logging.INFO)
    for scheduler in schedulers:
        await scheduler.start()
    try:
        await ran(3, start_s)
        await outage()
        before = len(runs)
        await ran(before + 5, wait_s)
    finally:
        for scheduler in schedulers:
            await scheduler.stop()
    assert "engine loop crashed" not in caplog.text
    slots = Counter(slot for _, slot in runs)
    assert max(slots.values()) == 1, "no slot ran twice"
    return runs
