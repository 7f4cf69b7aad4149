"""The lease contract (``anarchon_core/backend.py``), proved identically on every store.

Each test is a module-level ``async def test_…(backend)``: ``backend`` is an open,
empty store that the test module's conftest provides, and the
:mod:`anarchon_core.conformance.plugin` runs the test on that store's event loop.
``from anarchon_core.conformance.contract import *`` brings exactly the tests
(``__all__``) into a test module, where pytest collects them.

Backends judge time by their own clock, so the tests use real time: leases that
must stay live are long (a minute), leases that must die are short and followed by
a sleep well past them. Slots are taken from the store's ``now_ms``.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from dataclasses import replace
from typing import Any

import pytest

from anarchon_core.backend import (
    MAX_ERROR_CHARS,
    Backend,
    Claim,
    ClaimRequest,
    DueRun,
    FinishRequest,
    Lease,
    TakeoverRequest,
    overlap_reason,
)
from anarchon_core.errors import ConfigurationError
from anarchon_core.records import (
    HistoryQuery,
    Origin,
    Outcome,
    RunRecord,
    Status,
    history_key,
)

JOB = "sync"
HOUR = 3_600_000
LIVE_MS = 60_000  # a lease that outlives the test
SHORT_MS = 50  # a lease that expire() outlives
RETRY_MS = 100


async def expire(ms: int = SHORT_MS) -> None:
    """Sleep well past a lease or retry delay of ``ms``."""
    await asyncio.sleep(ms / 1000 + 0.06)


def claim_request(
    slot: int,
    *,
    job: str = JOB,
    token: str | None = None,
    origin: Origin = Origin.SCHEDULE,
    lease_ms: int = LIVE_MS,
    horizon_ms: int = HOUR,
    skip_overlap: bool = True,
    instance_id: str = "host-a:1:aaaaaa",
    version: int | None = None,
) -> ClaimRequest:
    """A claim of ``slot`` (by default of job ``JOB``, a fresh token, a live lease)."""
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=origin,
        token=token or secrets.token_hex(8),
        instance_id=instance_id,
        lease_ms=lease_ms,
        horizon_ms=horizon_ms,
        skip_overlap=skip_overlap,
        fingerprint="every:10s",
        version=version,
    )


def takeover_request(
    slot: int,
    attempt: int,
    *,
    job: str = JOB,
    token: str | None = None,
    lease_ms: int = LIVE_MS,
    horizon_ms: int = HOUR,
    max_attempts: int = 3,
    skip_overlap: bool = True,
    instance_id: str = "host-b:2:bbbbbb",
) -> TakeoverRequest:
    """A takeover of ``slot`` after ``attempt`` (by another instance than ``claim_request``)."""
    return TakeoverRequest(
        job=job,
        slot=slot,
        attempt=attempt,
        token=token or secrets.token_hex(8),
        instance_id=instance_id,
        lease_ms=lease_ms,
        horizon_ms=horizon_ms,
        max_attempts=max_attempts,
        skip_overlap=skip_overlap,
    )


async def win(backend: Backend, slot: int, **kwargs: Any) -> Lease:
    """Claim ``slot`` and insist on winning it; the lease the runner would hold."""
    request = claim_request(slot, **kwargs)
    claim = await backend.claim(request)
    assert claim == Claim(Outcome.WON, 1, claim.store_now)
    return Lease(request.job, slot, 1, request.token)


async def take(backend: Backend, lease: Lease, **kwargs: Any) -> Lease:
    """Take over the attempt after ``lease`` and insist on winning it."""
    request = takeover_request(lease.slot, lease.attempt, job=lease.job, **kwargs)
    claim = await backend.take_over(request)
    assert (claim.outcome, claim.attempt) == (Outcome.WON, lease.attempt + 1)
    return Lease(lease.job, lease.slot, claim.attempt, request.token)


async def history_pages(backend: Backend, query: HistoryQuery) -> list[list[RunRecord]]:
    """Every page of ``query``: each continues after the previous page's last record.

    Only the last page may be short (a short page is how a reader knows it is the last).
    """
    pages = [await backend.history(query)]
    while len(pages[-1]) == query.limit:
        last = pages[-1][-1]
        pages.append(await backend.history(replace(query, before=history_key(last))))
    assert all(len(page) == query.limit for page in pages[:-1])
    return pages


async def records(backend: Backend, job: str | None = None) -> list[RunRecord]:
    """Every history record (of ``job``), newest first."""
    return await backend.history(HistoryQuery(job=job, limit=1000))


async def record(backend: Backend, lease: Lease) -> RunRecord:
    """The one history record of ``lease``'s attempt."""
    (found,) = [
        r
        for r in await records(backend, lease.job)
        if (r.slot, r.attempt) == (lease.slot, lease.attempt)
    ]
    return found


# -- the claim ---------------------------------------------------------------------
async def test_now_ms_is_epoch_milliseconds(backend: Backend) -> None:
    assert abs(await backend.now_ms() - time.time() * 1000) < 5000


async def test_first_claim_wins_and_records_running(backend: Backend) -> None:
    now = await backend.now_ms()
    claim = await backend.claim(claim_request(now, instance_id="me:1:abcdef"))
    assert (claim.outcome, claim.attempt) == (Outcome.WON, 1)
    assert claim.store_now is not None and abs(claim.store_now - now) < 5000
    (rec,) = await records(backend)
    assert (rec.job, rec.slot, rec.attempt, rec.origin) == (JOB, now, 1, Origin.SCHEDULE)
    assert (rec.status, rec.instance_id) == (Status.RUNNING, "me:1:abcdef")
    assert rec.claimed_at == rec.started_at == claim.store_now
    assert (rec.finished_at, rec.error, rec.meta) == (None, None, {})


async def test_concurrent_claims_have_one_winner_per_run(backend: Backend) -> None:
    now = await backend.now_ms()
    slots = [now - 1000 * k for k in range(10)]
    requests = [
        claim_request(slot, instance_id=f"host:{i}:000000", skip_overlap=False)
        for slot in slots
        for i in range(12)
    ]
    claims = await asyncio.gather(*(backend.claim(r) for r in requests))
    for slot in slots:
        outcomes = sorted(
            c.outcome for r, c in zip(requests, claims, strict=True) if r.slot == slot
        )
        assert outcomes == [Outcome.TAKEN] * 11 + [Outcome.WON]
    assert all(c.attempt == 0 for c in claims if c.outcome == Outcome.TAKEN)
    assert sorted(r.slot for r in await records(backend)) == sorted(slots)


async def test_losing_claim_writes_nothing(backend: Backend) -> None:
    now = await backend.now_ms()
    await win(backend, now)
    before = await records(backend)
    claim = await backend.claim(claim_request(now, instance_id="loser:1:000000"))
    assert (claim.outcome, claim.attempt) == (Outcome.TAKEN, 0)
    assert await records(backend) == before


async def test_repeated_claim_with_same_token_wins_again(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now)
    again = await backend.claim(claim_request(now, token=lease.token))
    assert (again.outcome, again.attempt) == (Outcome.WON, 1)
    assert len(await records(backend)) == 1


async def test_repeated_claim_after_its_lease_expired_is_lapsed(backend: Backend) -> None:
    """The repeat must not start an attempt a backup may already be taking over."""
    now = await backend.now_ms()
    lease = await win(backend, now, lease_ms=SHORT_MS)
    await expire()
    before = await records(backend)
    again = await backend.claim(claim_request(now, token=lease.token, lease_ms=SHORT_MS))
    assert (again.outcome, again.attempt) == (Outcome.LAPSED, 0)
    assert await records(backend) == before  # nothing written
    assert await backend.due_runs([JOB]) == [DueRun(JOB, now, 1, Origin.SCHEDULE, "expired")]
    await take(backend, lease)


async def test_repeated_claim_of_a_finished_run_is_lapsed(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now)
    assert await backend.finish(lease, Status.SUCCESS)
    again = await backend.claim(claim_request(now, token=lease.token))
    assert (again.outcome, again.attempt) == (Outcome.LAPSED, 0)
    assert [r.status for r in await records(backend)] == [Status.SUCCESS]


async def test_claim_past_horizon_is_expired_and_writes_nothing(backend: Backend) -> None:
    now = await backend.now_ms()
    claim = await backend.claim(claim_request(now - 10_000, horizon_ms=5_000))
    assert claim.outcome == Outcome.EXPIRED
    assert await records(backend) == []
    await win(backend, now - 10_000, horizon_ms=HOUR)  # nothing blocks a later claim


async def test_early_claim_is_refused_and_writes_nothing(backend: Backend) -> None:
    now = await backend.now_ms()
    claim = await backend.claim(claim_request(now + 10_000))
    assert claim.outcome == Outcome.EARLY
    assert await records(backend) == []
    await win(backend, now + 500)  # within the one-second tolerance


async def test_paused_job_records_one_paused_record(backend: Backend) -> None:
    set_paused = backend.set_paused
    now = await backend.now_ms()
    await set_paused(JOB, True)
    request = claim_request(now)
    claim = await backend.claim(request)
    assert (claim.outcome, claim.attempt) == (Outcome.PAUSED, 0)
    (rec,) = await records(backend)
    assert (rec.slot, rec.attempt, rec.status, rec.started_at) == (now, 0, Status.PAUSED, None)
    assert rec.finished_at is not None
    assert (await backend.claim(claim_request(now))).outcome == Outcome.TAKEN
    assert (await backend.claim(request)).outcome == Outcome.TAKEN  # nothing ran: no WON
    await win(backend, now, job="other")  # pausing is per job
    await set_paused(JOB, False)
    await win(backend, now - 1000, skip_overlap=False)
    assert len(await records(backend, JOB)) == 2


# -- overlap -----------------------------------------------------------------------
async def test_slot_overlapping_a_live_run_is_skipped_once(backend: Backend) -> None:
    now = await backend.now_ms()
    await win(backend, now - 1000)
    claim = await backend.claim(claim_request(now))
    assert (claim.outcome, claim.attempt) == (Outcome.SKIPPED, 0)
    assert (await backend.claim(claim_request(now))).outcome == Outcome.TAKEN
    (rec,) = [r for r in await records(backend) if r.slot == now]
    assert (rec.attempt, rec.status, rec.started_at) == (0, Status.SKIPPED, None)
    assert rec.finished_at is not None
    assert rec.error == overlap_reason(now - 1000)  # the run it overlapped, by its slot


async def test_a_skipped_record_names_the_earliest_live_run(backend: Backend) -> None:
    now = await backend.now_ms()
    await win(backend, now - 2000, skip_overlap=False)
    await win(backend, now - 1000, skip_overlap=False)
    await backend.claim_many([claim_request(now)])
    (rec,) = [r for r in await records(backend) if r.slot == now]
    assert (rec.status, rec.error) == (Status.SKIPPED, overlap_reason(now - 2000))


async def test_overlap_allowed_when_skip_overlap_is_false(backend: Backend) -> None:
    now = await backend.now_ms()
    await win(backend, now - 1000)
    await win(backend, now, skip_overlap=False)


async def test_no_overlap_after_lease_expired_or_finished(backend: Backend) -> None:
    now = await backend.now_ms()
    await win(backend, now - 2000, lease_ms=SHORT_MS)
    await expire()
    lease = await win(backend, now - 1000)
    assert await backend.finish(lease, Status.SUCCESS)
    await win(backend, now)


async def test_other_jobs_do_not_overlap(backend: Backend) -> None:
    now = await backend.now_ms()
    await win(backend, now, job="a")
    await win(backend, now, job="b")


# -- heartbeats --------------------------------------------------------------------
async def test_heartbeat_extends_the_lease(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now - 1000, lease_ms=SHORT_MS)
    assert await backend.heartbeat([lease], LIVE_MS) == [True]
    await expire()
    assert await backend.due_runs([JOB]) == []
    taken = await backend.take_over(takeover_request(lease.slot, 1))
    assert taken.outcome == Outcome.TAKEN
    assert (await backend.claim(claim_request(now))).outcome == Outcome.SKIPPED


async def test_heartbeat_verdicts_are_per_lease_and_stale_tokens_change_nothing(
    backend: Backend,
) -> None:
    now = await backend.now_ms()
    a = await win(backend, now, job="a", lease_ms=SHORT_MS)
    b = await win(backend, now, job="b", lease_ms=SHORT_MS)
    stale = Lease("a", now, 1, "not-the-token")
    unknown = Lease("c", now, 1, "no-such-run")
    assert await backend.heartbeat([a, stale, b, unknown], LIVE_MS) == [True, False, True, False]
    assert await backend.heartbeat([], LIVE_MS) == []
    await expire()
    assert await backend.heartbeat([stale], LIVE_MS) == [False]
    assert await backend.due_runs(["a", "b"]) == []


async def test_heartbeat_is_rejected_after_finish(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    assert await backend.finish(lease, Status.SUCCESS)
    assert await backend.heartbeat([lease], LIVE_MS) == [False]


# -- finish ------------------------------------------------------------------------
async def test_finish_records_the_outcome(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    meta = {"task_id": "abc", "n": 3, "ratio": 0.5, "ok": True, "none": None, "list": [1, "x"]}
    assert await backend.finish(lease, Status.SUCCESS, meta=meta)
    rec = await record(backend, lease)
    assert (rec.status, rec.error, rec.meta) == (Status.SUCCESS, None, meta)
    assert rec.finished_at is not None and rec.started_at is not None
    assert rec.finished_at >= rec.started_at
    assert await backend.due_runs([JOB]) == []


async def test_batched_claims_keep_pause_and_overlap_in_request_order(backend: Backend) -> None:
    """A batch is decided request by request: a run won early in the batch makes a
    later slot of its job ``SKIPPED``; a paused job's run is ``PAUSED``."""
    now = await backend.now_ms()
    await backend.set_paused("paused", True)
    requests = [
        claim_request(now - 1000, job="busy"),
        claim_request(now, job="busy"),
        claim_request(now, job="paused"),
        claim_request(now, job="free"),
    ]
    answers = await backend.claim_many(requests)
    assert [a.outcome for a in answers] == [
        Outcome.WON,
        Outcome.SKIPPED,
        Outcome.PAUSED,
        Outcome.WON,
    ]
    assert [a.attempt for a in answers] == [1, 0, 0, 1]


async def test_batched_finishes_are_fenced_each_by_its_token(backend: Backend) -> None:
    now = await backend.now_ms()
    first = await win(backend, now, job="one")
    second = await win(backend, now, job="two")
    stale = Lease(second.job, second.slot, second.attempt, "not-the-token")
    answers = await backend.finish_many(
        [
            FinishRequest(first, Status.SUCCESS, meta={"n": 1}),
            FinishRequest(stale, Status.FAILED, error="boom"),
        ]
    )
    assert answers == [True, False]
    assert (await record(backend, first)).status == Status.SUCCESS
    assert (await record(backend, second)).status == Status.RUNNING
    assert await backend.finish_many(
        [FinishRequest(second, Status.FAILED, error="late", retry_in_ms=RETRY_MS)]
    ) == [True]
    assert await backend.finish_many([FinishRequest(first, Status.SUCCESS)]) == [True]
    assert await backend.finish_many([]) == []


async def test_finish_is_fenced_by_token(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    stale = Lease(lease.job, lease.slot, lease.attempt, "not-the-token")
    assert not await backend.finish(stale, Status.FAILED, error="boom")
    assert (await record(backend, lease)).status == Status.RUNNING
    assert await backend.heartbeat([lease], LIVE_MS) == [True]


async def test_finish_is_idempotent_for_the_same_token_and_status(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    assert await backend.finish(lease, Status.FAILED, error="boom")
    first = await record(backend, lease)
    assert await backend.finish(lease, Status.FAILED, error="boom")
    assert not await backend.finish(lease, Status.SUCCESS)
    assert await record(backend, lease) == first


async def test_error_text_is_bounded(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    assert await backend.finish(lease, Status.FAILED, error="x" * (MAX_ERROR_CHARS * 3))
    error = (await record(backend, lease)).error
    assert error is not None and len(error) == MAX_ERROR_CHARS and error.endswith("…")


async def test_meta_round_trips(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    meta = {"nested": {"a": [1, 2, {"b": None}]}, "unicode": "ζ✓", "big": 2**53}
    assert await backend.finish(lease, Status.SUCCESS, meta=meta)
    assert (await record(backend, lease)).meta == meta


# -- release (hand-over on stop) -------------------------------------------------------
async def test_release_hands_the_run_over_at_once(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now, origin=Origin.CATCH_UP)
    assert await backend.release(lease)
    rec = await record(backend, lease)
    assert rec.status == Status.INTERRUPTED and rec.finished_at is not None and rec.error
    assert await backend.due_runs([JOB]) == [DueRun(JOB, now, 1, Origin.CATCH_UP, "expired")]
    # the released runner is fenced
    assert await backend.heartbeat([lease], LIVE_MS) == [False]
    assert not await backend.finish(lease, Status.SUCCESS)
    assert not await backend.release(lease)
    second = await take(backend, lease)
    assert (await record(backend, lease)).status == Status.INTERRUPTED
    rec2 = await record(backend, second)
    assert (rec2.status, rec2.origin, rec2.instance_id) == (
        Status.RUNNING,
        Origin.CATCH_UP,
        "host-b:2:bbbbbb",
    )


async def test_release_is_fenced_by_token(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    assert not await backend.release(Lease(lease.job, lease.slot, 1, "not-the-token"))
    assert (await record(backend, lease)).status == Status.RUNNING
    assert await backend.due_runs([JOB]) == []


# -- takeover ----------------------------------------------------------------------
async def test_takeover_is_compare_and_set(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now, lease_ms=SHORT_MS)
    await expire()
    assert await backend.due_runs([JOB]) == [DueRun(JOB, now, 1, Origin.SCHEDULE, "expired")]
    requests = [takeover_request(now, 1, instance_id=f"backup:{i}:000000") for i in range(8)]
    claims = await asyncio.gather(*(backend.take_over(r) for r in requests))
    assert sorted(c.outcome for c in claims) == [Outcome.TAKEN] * 7 + [Outcome.WON]
    (won,) = [c for c in claims if c.outcome == Outcome.WON]
    assert won.attempt == 2
    assert [(r.attempt, r.status) for r in await records(backend)] == [
        (2, Status.RUNNING),
        (1, Status.INTERRUPTED),
    ]
    assert await backend.due_runs([JOB]) == []
    late = await backend.take_over(takeover_request(now, 1))
    assert late.outcome == Outcome.TAKEN
    assert (await record(backend, lease)).error  # says why attempt 1 ended


async def test_takeover_repeated_with_same_token_wins_again(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms(), lease_ms=SHORT_MS)
    await expire()
    request = takeover_request(lease.slot, 1)
    assert (await backend.take_over(request)).attempt == 2
    again = await backend.take_over(request)
    assert (again.outcome, again.attempt) == (Outcome.WON, 2)
    assert len(await records(backend)) == 2


async def test_takeover_repeated_after_its_lease_expired_is_lapsed(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms(), lease_ms=SHORT_MS)
    await expire()
    request = takeover_request(lease.slot, 1, lease_ms=SHORT_MS)
    assert (await backend.take_over(request)).attempt == 2
    await expire()
    before = await records(backend)
    again = await backend.take_over(request)
    assert (again.outcome, again.attempt) == (Outcome.LAPSED, 0)
    assert await records(backend) == before  # nothing written
    due = await backend.due_runs([JOB])
    assert due == [DueRun(JOB, lease.slot, 2, Origin.SCHEDULE, "expired")]
    third = await take(backend, Lease(JOB, lease.slot, 2, request.token))
    assert third.attempt == 3
    assert [(r.attempt, r.status) for r in await records(backend)] == [
        (3, Status.RUNNING),
        (2, Status.INTERRUPTED),
        (1, Status.INTERRUPTED),
    ]


async def test_takeover_is_taken_while_the_lease_is_live(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    before = await records(backend)
    assert (await backend.take_over(takeover_request(lease.slot, 1))).outcome == Outcome.TAKEN
    assert (await backend.take_over(takeover_request(lease.slot, 2))).outcome == Outcome.TAKEN
    missing = takeover_request(lease.slot - 1000, 1)
    assert (await backend.take_over(missing)).outcome == Outcome.TAKEN
    assert await records(backend) == before
    assert await backend.heartbeat([lease], LIVE_MS) == [True]


async def test_takeover_at_max_attempts_ends_the_run_interrupted(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms(), lease_ms=SHORT_MS)
    await expire()
    claim = await backend.take_over(takeover_request(lease.slot, 1, max_attempts=1))
    assert (claim.outcome, claim.attempt) == (Outcome.EXHAUSTED, 0)
    (rec,) = await records(backend)
    assert rec.status == Status.INTERRUPTED and rec.finished_at is not None
    assert await backend.due_runs([JOB]) == []
    assert await backend.heartbeat([lease], LIVE_MS) == [False]
    assert (await backend.take_over(takeover_request(lease.slot, 1))).outcome == Outcome.TAKEN


async def test_takeover_past_the_horizon_ends_the_run_interrupted(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now - 5000, lease_ms=SHORT_MS)
    await expire()
    claim = await backend.take_over(takeover_request(lease.slot, 1, horizon_ms=1000))
    assert claim.outcome == Outcome.EXPIRED
    assert (await record(backend, lease)).status == Status.INTERRUPTED
    assert await backend.due_runs([JOB]) == []


async def test_takeover_is_blocked_by_another_live_run(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now - 1000, lease_ms=SHORT_MS)
    await expire()
    await win(backend, now)  # the lease above expired: no overlap
    blocked = await backend.take_over(takeover_request(lease.slot, 1))
    assert blocked.outcome == Outcome.BLOCKED
    assert (await record(backend, lease)).status == Status.RUNNING  # nothing written
    assert await backend.due_runs([JOB]) == [DueRun(JOB, lease.slot, 1, Origin.SCHEDULE, "expired")]
    await take(backend, lease, skip_overlap=False)


async def test_stale_runner_is_fenced_after_takeover(backend: Backend) -> None:
    old = await win(backend, await backend.now_ms(), lease_ms=SHORT_MS)
    await expire()
    new = await take(backend, old)
    assert await backend.heartbeat([old, new], LIVE_MS) == [False, True]
    assert not await backend.finish(old, Status.SUCCESS)
    assert not await backend.release(old)
    assert await backend.finish(new, Status.FAILED, error="boom")
    assert not await backend.finish(old, Status.FAILED, error="late")
    rec_old, rec_new = await record(backend, old), await record(backend, new)
    assert (rec_old.status, rec_new.status, rec_new.error) == (
        Status.INTERRUPTED,
        Status.FAILED,
        "boom",
    )


# -- retries -----------------------------------------------------------------------
async def test_failed_run_with_retry_is_continued_after_the_delay(backend: Backend) -> None:
    now = await backend.now_ms()
    lease = await win(backend, now, origin=Origin.CATCH_UP)
    assert await backend.finish(lease, Status.FAILED, error="boom", retry_in_ms=RETRY_MS)
    assert await backend.finish(lease, Status.FAILED, error="boom", retry_in_ms=RETRY_MS)
    assert (await record(backend, lease)).status == Status.FAILED
    assert await backend.due_runs([JOB]) == []
    assert await backend.heartbeat([lease], LIVE_MS) == [False]
    early = await backend.take_over(takeover_request(now, 1))
    assert early.outcome == Outcome.TAKEN
    await expire(RETRY_MS)
    assert await backend.due_runs([JOB]) == [DueRun(JOB, now, 1, Origin.CATCH_UP, "retry")]
    second = await take(backend, lease)
    assert (await record(backend, second)).origin == Origin.CATCH_UP
    assert (await record(backend, lease)).status == Status.FAILED  # the failure stands
    assert await backend.finish(second, Status.SUCCESS)
    assert [r.status for r in await records(backend)] == [Status.SUCCESS, Status.FAILED]


async def test_retry_beyond_max_attempts_ends_the_run_failed(backend: Backend) -> None:
    lease = await win(backend, await backend.now_ms())
    assert await backend.finish(lease, Status.FAILED, retry_in_ms=0)
    claim = await backend.take_over(takeover_request(lease.slot, 1, max_attempts=1))
    assert claim.outcome == Outcome.EXHAUSTED
    assert (await record(backend, lease)).status == Status.FAILED
    assert await backend.due_runs([JOB]) == []


async def test_due_runs_only_lists_the_given_jobs(backend: Backend) -> None:
    now = await backend.now_ms()
    for job in ("a", "b", "c"):
        await win(backend, now, job=job, lease_ms=SHORT_MS)
    await win(backend, now - 1000, job="a", skip_overlap=False)  # live: not due
    await expire()
    due = await backend.due_runs(frozenset({"a", "c", "unknown"}))
    assert sorted(due, key=lambda d: d.job) == [
        DueRun("a", now, 1, Origin.SCHEDULE, "expired"),
        DueRun("c", now, 1, Origin.SCHEDULE, "expired"),
    ]
    assert await backend.due_runs([]) == []


# -- catch-up anchor and history --------------------------------------------------------
async def test_last_scheduled_slot_ignores_manual_runs(backend: Backend) -> None:
    assert await backend.last_scheduled_slot(JOB) is None
    now = await backend.now_ms()
    await win(backend, now - 3000, origin=Origin.CATCH_UP, skip_overlap=False)
    assert await backend.last_scheduled_slot(JOB) == now - 3000
    await win(backend, now - 2000, skip_overlap=False)
    await win(backend, now, origin=Origin.MANUAL, skip_overlap=False)
    assert await backend.last_scheduled_slot(JOB) == now - 2000
    skipped = await backend.claim(claim_request(now - 1000))  # any status counts
    assert skipped.outcome == Outcome.SKIPPED
    assert await backend.last_scheduled_slot(JOB) == now - 1000
    assert await backend.last_scheduled_slot("other") is None


async def test_history_order_and_filters(backend: Backend) -> None:
    now = await backend.now_ms()
    s1, s2, s3 = now - 3000, now - 2000, now - 1000
    a1 = await win(backend, s1, job="a", lease_ms=SHORT_MS)
    b1 = await win(backend, s1, job="b")
    await win(backend, s2, job="b", skip_overlap=False)
    a3 = await win(backend, s3, job="a", skip_overlap=False)
    await expire()
    a1_2 = await take(backend, a1, skip_overlap=False)
    assert await backend.finish(a1_2, Status.SUCCESS)
    assert await backend.finish(b1, Status.FAILED, error="boom")
    assert await backend.finish(a3, Status.SUCCESS)

    def keys(rows: list[RunRecord]) -> list[tuple[int, str, int]]:
        return [(r.slot, r.job, r.attempt) for r in rows]

    everything = [(s3, "a", 1), (s2, "b", 1), (s1, "b", 1), (s1, "a", 2), (s1, "a", 1)]
    assert keys(await backend.history(HistoryQuery())) == everything
    assert keys(await backend.history(HistoryQuery(limit=2))) == everything[:2]
    after = HistoryQuery(before=(s1, "b", 1))
    assert keys(await backend.history(after)) == everything[3:]
    assert keys(await backend.history(HistoryQuery(before=(s1, "a", 2)))) == everything[4:]
    assert keys(await backend.history(HistoryQuery(before=(s1, "c", 0)))) == everything[2:]
    assert keys(await backend.history(HistoryQuery(before=(s1, "a", 1)))) == []
    assert keys(await backend.history(HistoryQuery(limit=0))) == []
    assert keys(await backend.history(HistoryQuery(job="a"))) == [
        (s3, "a", 1),
        (s1, "a", 2),
        (s1, "a", 1),
    ]
    success = await backend.history(HistoryQuery(status=Status.SUCCESS))
    assert keys(success) == [(s3, "a", 1), (s1, "a", 2)]
    window = await backend.history(HistoryQuery(since=s1, until=s3))  # since <= slot < until
    assert keys(window) == everything[1:]
    narrow = HistoryQuery(job="a", status=Status.INTERRUPTED, since=s1, until=s1 + 1, limit=5)
    assert keys(await backend.history(narrow)) == [(s1, "a", 1)]
    assert await backend.history(HistoryQuery(job="nobody")) == []


async def test_history_pages_with_a_cursor_without_repeats_or_gaps(backend: Backend) -> None:
    now = await backend.now_ms()
    s1, s2, s3, s4 = now - 4000, now - 3000, now - 2000, now - 1000
    statuses = itertools.cycle((Status.SUCCESS, Status.FAILED))
    made: list[Lease] = []  # every attempt recorded

    async def attempt(lease: Lease, *, open_: bool) -> Lease:
        """Note ``lease``; finish it now with the next status unless it stays open."""
        made.append(lease)
        if not open_:
            assert await backend.finish(lease, next(statuses))
        return lease

    # Three jobs over three slots; b's runs and every run of s2 get more attempts.
    round1 = []
    for slot in (s1, s2, s3):
        for job in ("a", "b", "c"):
            more = job == "b" or slot == s2
            lease_ms = SHORT_MS if more else LIVE_MS
            lease = await win(backend, slot, job=job, lease_ms=lease_ms, skip_overlap=False)
            round1.append(await attempt(lease, open_=more))
    await expire()
    round2 = []
    for lease in round1[1::3] + round1[3:6:2]:  # b's runs, then a's and c's at s2
        lease_ms = LIVE_MS if lease.job == "b" else SHORT_MS
        lease = await take(backend, lease, lease_ms=lease_ms, skip_overlap=False)
        round2.append(await attempt(lease, open_=lease.job != "b" or lease.slot == s3))
    await expire()
    for lease in round2[3:]:
        await attempt(await take(backend, lease, skip_overlap=False), open_=lease.job == "c")
    skipped = await backend.claim(claim_request(s4, job="b"))  # b's run at s3 is live
    assert (skipped.outcome, skipped.attempt) == (Outcome.SKIPPED, 0)
    made.append(Lease("b", s4, 0, ""))

    everything = await backend.history(HistoryQuery(limit=1000))
    expected = sorted(((lease.slot, lease.job, lease.attempt) for lease in made), reverse=True)
    assert [history_key(r) for r in everything] == expected
    assert {r.status for r in everything} == {
        Status.SUCCESS,
        Status.FAILED,
        Status.INTERRUPTED,
        Status.RUNNING,
        Status.SKIPPED,
    }
    for query in (
        HistoryQuery(),
        HistoryQuery(job="a"),
        HistoryQuery(status=Status.INTERRUPTED),
        HistoryQuery(since=s2),
        HistoryQuery(job="b", since=s2, until=s4),
        HistoryQuery(status=Status.SUCCESS, since=s1 + 1),
    ):
        whole = await backend.history(replace(query, limit=1000))
        assert whole == [r for r in everything if query.matches(r)]
        assert len(whole) >= 2
        for limit in (1, 2, 3):
            pages = await history_pages(backend, replace(query, limit=limit))
            assert [r for page in pages for r in page] == whole, (query, limit)

    # A run recorded while a reader pages sorts before the reader's cursor.
    query = HistoryQuery(limit=2)
    page = await backend.history(query)
    await win(backend, now, job="a", skip_overlap=False)
    later = await history_pages(backend, replace(query, before=history_key(page[-1])))
    assert [r for p in [page, *later] for r in p] == everything
    assert (await backend.history(query))[0].slot == now


async def test_prune_keeps_latest_and_unfinished_records(backend: Backend) -> None:
    now = await backend.now_ms()

    async def done(job: str, slot: int, origin: Origin = Origin.SCHEDULE) -> None:
        lease = await win(backend, slot, job=job, origin=origin, skip_overlap=False)
        assert await backend.finish(lease, Status.SUCCESS)

    await win(backend, now - 5000, job="a", skip_overlap=False)  # still running
    await done("a", now - 4000)
    await done("a", now - 3000)
    await done("a", now - 2000)  # a's latest
    await done("b", now - 4500)  # b's only record
    await done("c", now - 4000)
    await done("c", now - 3000)  # c's latest scheduled run: catch-up's anchor
    await done("c", now - 1000, Origin.MANUAL)  # c's latest record
    await done("d", now - 4000, Origin.MANUAL)  # d has no scheduled run at all
    await done("d", now - 3000, Origin.MANUAL)
    assert await backend.prune(now - 2500) == 4
    left = {(r.job, r.slot) for r in await records(backend)}
    assert left == {
        ("a", now - 5000),
        ("a", now - 2000),
        ("b", now - 4500),
        ("c", now - 3000),
        ("c", now - 1000),
        ("d", now - 3000),
    }
    assert await backend.last_scheduled_slot("c") == now - 3000
    assert await backend.prune(now + 1000) == 0  # what is left is kept at any age


async def _finished_history(backend: Backend, jobs: list[str], now: int) -> None:
    """Three finished runs of each job, 4 s, 3 s and 2 s ago."""
    for job in jobs:
        for age in (4000, 3000, 2000):
            lease = await win(backend, now - age, job=job, skip_overlap=False)
            assert await backend.finish(lease, Status.SUCCESS)


async def _slots_by_job(backend: Backend) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in await records(backend):
        counts[r.job] = counts.get(r.job, 0) + 1
    return counts


async def test_prune_with_jobs_leaves_other_jobs_history(backend: Backend) -> None:
    """Services sharing a store each prune their own jobs (the engine passes ``jobs``)."""
    now = await backend.now_ms()
    names = ["billing:sync", "billing:report", "shop:sync", "plain"]
    await _finished_history(backend, names, now)
    assert await backend.prune(now, jobs=["billing:sync", "plain"]) == 4
    assert await _slots_by_job(backend) == {
        "billing:sync": 1,  # each pruned job keeps its latest record
        "billing:report": 3,
        "shop:sync": 3,
        "plain": 1,
    }
    assert await backend.prune(now, jobs=[]) == 0  # no jobs: nothing
    assert await backend.prune(now, jobs={"no-such-job"}) == 0
    assert len(await records(backend)) == 8


async def test_prune_with_namespace_leaves_other_namespaces_history(backend: Backend) -> None:
    now = await backend.now_ms()
    # "bill" is a prefix of "billing" and "bill_ing" holds a LIKE wildcard: neither is in
    # namespace "bill", whose store names all start with "bill:".
    names = ["bill:sync", "bill:a:b", "billing:sync", "bill_ing:sync", "bill", "shop:bill:x"]
    await _finished_history(backend, names, now)
    assert await backend.prune(now, namespace="bill") == 4
    counts = await _slots_by_job(backend)
    assert counts == {
        "bill:sync": 1,
        "bill:a:b": 1,
        "billing:sync": 3,
        "bill_ing:sync": 3,
        "bill": 3,
        "shop:bill:x": 3,
    }
    assert await backend.prune(now, namespace="nobody") == 0
    assert await backend.prune(now) == 8  # no scope: every job (anarchon prune --all)
    assert set((await _slots_by_job(backend)).values()) == {1}


async def test_prune_scope_is_validated(backend: Backend) -> None:
    now = await backend.now_ms()
    with pytest.raises(ConfigurationError, match="not both"):
        await backend.prune(now, jobs=["a"], namespace="b")
    with pytest.raises(ConfigurationError, match="may not contain ':'"):
        await backend.prune(now, namespace="a:b")
    with pytest.raises(ConfigurationError, match="collection of store names"):
        await backend.prune(now, jobs="sync")


#: What ``from anarchon_core.conformance.contract import *`` brings: the tests, no helper.
__all__ = [name for name in dict(globals()) if name.startswith("test_")]
