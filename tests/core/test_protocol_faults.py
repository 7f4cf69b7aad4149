"""Slow and lost store replies never let two attempts of one run execute at once.

Each scenario is scripted with :class:`FaultyBackend` on the in-memory store, on
virtual time (``tests/core/virtual.py``): the timings are exact, and a second of
protocol costs milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from virtual import BASE_MS, Recorder, describe, run_virtual

from anarchon_core import Backend, MemoryBackend, Scheduler, Status
from anarchon_core.backend import ClaimRequest
from anarchon_core.records import HistoryQuery, Origin, RunRecord
from anarchon_core.testing import Faults, FaultyBackend, LoopClock

SLOT = BASE_MS + 10_000  # the first slot of every("10s") for a scheduler started at 0
LEASE = {"heartbeat_ms": 100, "lease_ms": 300, "jitter_ms": 0}


async def history(store: MemoryBackend) -> list[tuple[int, str, str | None]]:
    records: list[RunRecord] = await store.history(HistoryQuery(limit=100))
    return sorted((r.attempt, str(r.status), r.instance_id) for r in records)


def scheduler(store: MemoryBackend | FaultyBackend, name: str, recorder: Recorder) -> Scheduler:
    s = Scheduler(store, instance_id=name, clock=LoopClock(BASE_MS), **LEASE)  # type: ignore[arg-type]
    s.every("job", "10s")(recorder.handler(1000))
    return s


Found = list[tuple[int, str, str | None]]


def two_instances(
    link: FaultyBackend, inject: Callable[[], None], *, b_after_s: float = 0.26
) -> tuple[Recorder, Found, Counter[str]]:
    """A, behind ``link``, claims the slot with ``inject``'s faults (called 10 ms
    before it); B starts ``b_after_s`` later and backs A up. Returns what ran, the
    history and A's counters."""
    recorder = Recorder()
    store = link.inner

    async def main() -> tuple[Found, Counter[str]]:
        a = scheduler(link, "a", recorder)
        b = scheduler(store, "b", recorder)  # type: ignore[arg-type]
        await a.start()
        await asyncio.sleep((SLOT - BASE_MS) / 1000 - 0.01)
        inject()
        await asyncio.sleep(b_after_s)
        await b.start()
        await asyncio.sleep(2.0)
        await a.stop()
        await b.stop()
        return await history(store), Counter(a.stats)  # type: ignore[arg-type]

    found, stats = run_virtual(main)
    return recorder, found, stats


def faulty_link(**options: Any) -> FaultyBackend:
    return FaultyBackend(MemoryBackend(clock=LoopClock(BASE_MS)), **options)


def test_a_claim_answered_past_its_fence_deadline_starts_nothing() -> None:
    """The store commits A's claim and answers 600 ms later, after B took the run over
    (lease 300 ms): A must not start attempt 1 beside B's attempt 2."""
    link = faulty_link(reply_timeout_ms=50)
    recorder, found, stats = two_instances(link, lambda: link.once("claim", delay_ms=600))
    assert link.injected["claim:delayed"] == 1
    assert not recorder.overlapping(), describe(recorder.overlapping())
    ran = [(run.attempt, run.instance) for run in recorder.executions if run.slot == SLOT]
    assert len(ran) == 1 and ran[0][0] == 2  # a backup's (B's, or A's own sweep's)
    assert found == [(1, "interrupted", "a"), (2, "success", ran[0][1])]
    assert stats["not_started_fence"] == 1


def test_a_claim_retried_after_its_lease_expired_is_lapsed_and_starts_nothing() -> None:
    """A's claim commits, its reply is lost and the link stays down past the lease's
    expiry (300 ms): the retry with the same token is answered LAPSED and starts
    nothing; a backup runs attempt 2. (A's sweep is kept failing, so that its own
    takeover cannot overtake the retry.)"""
    link = faulty_link(faults={"sweep": Faults(fail=1.0)}, reply_timeout_ms=120)

    def inject() -> None:
        link.once("claim", lose=True)  # applied at the slot, "answered" at +120 ms
        asyncio.get_running_loop().call_later(0.02, link.cut, 330)  # the retry at +170 too

    # B starts once the retry at +390 ms found the lease lapsed.
    recorder, found, stats = two_instances(link, inject, b_after_s=0.45)
    assert link.injected["claim:lost"] == 1 and link.injected["claim:cut"] == 1
    assert stats["claim_lapsed"] == 1, stats
    ran = [(run.attempt, run.instance) for run in recorder.executions if run.slot == SLOT]
    assert ran == [(2, "b")]
    assert found == [(1, "interrupted", "a"), (2, "success", "b")]


def test_a_retry_answered_won_after_the_first_sends_fence_deadline_starts_nothing() -> None:
    """The lost reply's retry lands while the lease still lives (the store answers
    WON), but later than the self-fence window after the first send: counted from the
    retry, A would run into B's takeover."""
    recorder = Recorder()
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    link = FaultyBackend(store, reply_timeout_ms=180)

    async def main() -> Counter[str]:
        a = scheduler(link, "a", recorder)
        await a.start()
        await asyncio.sleep((SLOT - BASE_MS) / 1000 - 0.01)
        link.once("claim", lose=True)  # answered at +180 ms, retried at +230 ms
        await asyncio.sleep(1.0)
        await a.stop()
        return Counter(a.stats)

    stats = run_virtual(main)
    assert stats["claim_won"] == 1
    assert stats["not_started_fence"] == 1
    ran = [(run.attempt, run.instance) for run in recorder.executions if run.slot == SLOT]
    assert ran == [(2, "a")]  # its own sweep took the lapsed attempt over


def test_a_lost_reply_retried_in_time_runs_the_attempt() -> None:
    """A lost reply retried well within the window (answered 70 ms after the first
    send, with 130 ms left) runs attempt 1 normally."""
    link = faulty_link(reply_timeout_ms=20)
    recorder, found, stats = two_instances(link, lambda: link.once("claim", lose=True))
    assert link.injected["claim:lost"] == 1
    ran = [(run.attempt, run.instance) for run in recorder.executions if run.slot == SLOT]
    assert ran == [(1, "a")]
    assert found == [(1, str(Status.SUCCESS), "a")]
    assert stats["claim_won"] == 1


@pytest.mark.parametrize(("call", "grace_ms"), [("claim", 0), ("takeover", None)])
def test_a_stop_that_cuts_off_a_won_request_gives_its_lease_back(
    call: str, grace_ms: int | None
) -> None:
    """A stops (with no grace for a claim, whose answer a grace would wait for) while its
    claim, or its takeover of a dead runner's run, is in flight: the store has applied
    it and answers WON 200 ms later. The stop reads the answer and releases the lease,
    so that B takes the run over at once instead of after the 3-s lease (which would
    also make B skip the job's next slots as overlapping)."""
    recorder = Recorder()
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    link = FaultyBackend(store)
    lease_ms = 3000

    def make(backend: Backend, name: str) -> Scheduler:
        clock = LoopClock(BASE_MS)
        s = Scheduler(backend, instance_id=name, clock=clock, heartbeat_ms=100, lease_ms=lease_ms)
        s.every("job", "10s", jitter_ms=0)(recorder.handler(5000))
        return s

    async def main() -> tuple[Found, float]:
        a, b = make(link, "a"), make(store, "b")
        link.once(call, delay_ms=200)  # type: ignore[arg-type]
        if call == "claim":
            await a.start()
        else:  # a runner that dies at once: A's sweep takes its run over
            await store.open()
            await asyncio.sleep((SLOT - BASE_MS) / 1000)
            await store.claim(dead_runners_claim(SLOT, lease_ms=300))
            await a.start()  # its next slot is SLOT + 10 s
        while not link.injected[f"{call}:delayed"]:
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        stop_at = loop.time()
        await a.stop(grace_ms)
        stopped_in = loop.time() - stop_at
        await b.start()
        await asyncio.sleep(1.0)
        await b.stop()
        return await history(store), stopped_in

    found, stopped_in = run_virtual(main)
    assert not recorder.overlapping(), describe(recorder.overlapping())
    ran = [(run.attempt, run.instance) for run in recorder.executions]
    first = 1 if call == "claim" else 2  # the attempt A won
    assert ran == [(first + 1, "b")], ran  # within B's first sweeps, not after 3 s
    assert (first, "interrupted", "a") in found, found
    assert 0.19 <= stopped_in <= 0.25  # the answer's wait, and the release


def test_a_claim_in_flight_at_a_graceful_stop_runs_within_the_grace() -> None:
    """With a grace, the stop waits for the answer of a claim already sent (200 ms
    late here) and runs what it won like any run in flight; B then finds it done."""
    recorder = Recorder()
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    link = FaultyBackend(store)

    def make(backend: Backend, name: str) -> Scheduler:
        s = Scheduler(backend, instance_id=name, clock=LoopClock(BASE_MS), heartbeat_ms=1000)
        s.every("job", "10s", jitter_ms=0)(recorder.handler(500))
        return s

    async def main() -> Found:
        a, b = make(link, "a"), make(store, "b")
        link.once("claim", delay_ms=200)
        await a.start()
        while not link.injected["claim:delayed"]:
            await asyncio.sleep(0.005)
        await a.stop(grace_ms=2000)
        await b.start()
        await asyncio.sleep(1.0)
        await b.stop()
        return await history(store)

    found = run_virtual(main)
    assert [(run.attempt, run.instance, run.completed) for run in recorder.executions] == [
        (1, "a", True)
    ]
    assert found == [(1, str(Status.SUCCESS), "a")]


def dead_runners_claim(slot: int, *, lease_ms: int) -> ClaimRequest:
    return ClaimRequest(
        job="job",
        slot=slot,
        origin=Origin.SCHEDULE,
        token="dead-runner",
        instance_id="dead",
        lease_ms=lease_ms,
        horizon_ms=10_000,
        skip_overlap=True,
        fingerprint="",
    )


def test_a_host_clock_off_by_more_than_the_early_tolerance_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryBackend(clock=LoopClock(BASE_MS))

    async def main(offset: int) -> None:
        a = Scheduler(store, instance_id=f"a{offset}", clock=LoopClock(BASE_MS, offset), **LEASE)  # type: ignore[arg-type]
        a.every("job", "1s")(Recorder().handler(10))
        await a.start()
        await asyncio.sleep(3.0)
        await a.stop()

    for offset, warned in ((-1500, True), (1500, True), (400, False)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="anarchon"):
            run_virtual(lambda offset=offset: main(offset))  # type: ignore[misc]
        skews = [r for r in caplog.records if "store clock skew" in r.getMessage()]
        assert skews, offset
        assert f"{-offset:+d} ms" in skews[0].getMessage()
        assert (skews[0].levelno == logging.WARNING) == warned, skews[0].getMessage()
