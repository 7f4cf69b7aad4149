"""Cluster-wide operations (issue 6), proved identically on every store.

Pause/resume, manual runs ("run now"), cancel and the instance registry are part of
the backend contract (``anarchon_core/backend.py``). Every lease store must pass every
test here; a claim-only store that does not implement an operation is skipped (a
lease store that lacks one fails). The tests, the helpers and the time conventions
are those of :mod:`anarchon_core.conformance.contract`: module-level
``async def test_…(backend)`` functions, real time, long leases that stay live, short
ones that die. ``from anarchon_core.conformance.operations import *`` brings exactly
the tests (``__all__``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from anarchon_core.backend import Backend, DueRun, InstanceInfo, Lease
from anarchon_core.conformance.contract import (
    HOUR,
    JOB,
    LIVE_MS,
    RETRY_MS,
    SHORT_MS,
    claim_request,
    expire,
    record,
    records,
    take,
    takeover_request,
    win,
)
from anarchon_core.records import Origin, Outcome, RunRecord, Status

ME = "operator@laptop"
_LEASE_OPS = ("heartbeat", "finish", "release", "due_runs", "take_over", "last_scheduled_slot")


def needs(backend: Backend, *operations: str) -> None:
    """Skip for a claim-only backend that lacks one of ``operations``; fail for a lease one."""
    missing = [op for op in operations if getattr(type(backend), op) is getattr(Backend, op)]
    if not missing:
        return
    if backend.capabilities.lease:
        pytest.fail(f"{backend.name} is a lease backend but does not implement {missing}")
    pytest.skip(f"{backend.name} is claim-only and does not offer {', '.join(missing)}")


def needs_manual_runs(backend: Backend) -> None:
    """Skip (claim-only) or fail (lease) unless ``backend`` offers manual runs."""
    needs(backend, "trigger", "cancel", *_LEASE_OPS)


async def start(backend: Backend, slot: int, **kwargs: Any) -> Lease:
    """Start the pending manual request at ``slot`` (take_over from attempt 0) and win it."""
    request = takeover_request(slot, 0, **kwargs)
    claim = await backend.take_over(request)
    assert (claim.outcome, claim.attempt) == (Outcome.WON, 1)
    return Lease(request.job, slot, 1, request.token)


def manual(slot: int, job: str = JOB) -> DueRun:
    """The due run of a pending manual request at ``slot``."""
    return DueRun(job, slot, 0, Origin.MANUAL, "manual")


def keys(rows: list[RunRecord]) -> list[tuple[str, int, int, Status]]:
    """Each record's (job, slot, attempt, status)."""
    return [(r.job, r.slot, r.attempt, r.status) for r in rows]


# -- pause and resume ------------------------------------------------------------------
async def test_paused_jobs_lists_what_is_paused(backend: Backend) -> None:
    needs(backend, "set_paused", "paused_jobs")
    assert await backend.paused_jobs() == set()
    await backend.set_paused("a", True)
    await backend.set_paused("b", True)
    await backend.set_paused("b", True)  # idempotent
    assert await backend.paused_jobs() == {"a", "b"}
    await backend.set_paused("a", False)
    await backend.set_paused("never-paused", False)
    assert await backend.paused_jobs() == {"b"}


async def test_pause_records_each_slot_once_and_resume_does_not_replay(backend: Backend) -> None:
    needs(backend, "set_paused", *_LEASE_OPS)
    now = await backend.now_ms()
    await backend.set_paused(JOB, True)
    requests = [claim_request(now - 2000, instance_id=f"host:{i}:000000") for i in range(8)]
    claims = await asyncio.gather(*(backend.claim(r) for r in requests))
    assert sorted(c.outcome for c in claims) == [Outcome.PAUSED] + [Outcome.TAKEN] * 7
    assert all(c.attempt == 0 for c in claims)
    assert (await backend.claim(claim_request(now - 1000))).outcome == Outcome.PAUSED
    # a paused slot is a recorded slot: catch-up does not count it as missed
    assert await backend.last_scheduled_slot(JOB) == now - 1000
    assert await backend.due_runs([JOB]) == []
    await backend.set_paused(JOB, False)
    assert (await backend.claim(claim_request(now - 2000))).outcome == Outcome.TAKEN
    await win(backend, now)
    assert keys(await records(backend)) == [
        (JOB, now, 1, Status.RUNNING),
        (JOB, now - 1000, 0, Status.PAUSED),
        (JOB, now - 2000, 0, Status.PAUSED),
    ]


async def test_pause_does_not_touch_a_run_in_flight(backend: Backend) -> None:
    needs(backend, "set_paused", *_LEASE_OPS)
    lease = await win(backend, await backend.now_ms())
    await backend.set_paused(JOB, True)
    assert await backend.heartbeat([lease], LIVE_MS) == [True]
    assert await backend.finish(lease, Status.SUCCESS)
    assert (await record(backend, lease)).status == Status.SUCCESS


# -- trigger: the manual request -----------------------------------------------------
async def test_trigger_records_a_pending_manual_run_at_the_store_now(backend: Backend) -> None:
    needs_manual_runs(backend)
    before = await backend.now_ms()
    slot = await backend.trigger(JOB, ME)
    after = await backend.now_ms()
    assert before <= slot <= after
    assert await records(backend) == []  # nothing ran yet
    assert await backend.due_runs([JOB, "other"]) == [manual(slot)]
    assert await backend.due_runs(["other"]) == []
    assert await backend.last_scheduled_slot(JOB) is None
    assert (await backend.claim(claim_request(slot))).outcome == Outcome.TAKEN


async def test_trigger_pressed_twice_or_at_once_asks_once(backend: Backend) -> None:
    needs_manual_runs(backend)
    slots = await asyncio.gather(*(backend.trigger(JOB, f"instance-{i}") for i in range(8)))
    assert len(set(slots)) == 1
    await asyncio.sleep(0.01)
    assert await backend.trigger(JOB, ME) == slots[0]
    other = await backend.trigger("other", ME)  # one pending request per job
    assert sorted(await backend.due_runs([JOB, "other"]), key=lambda d: d.job) == [
        manual(other, "other"),
        manual(slots[0]),
    ]
    assert await records(backend) == []


async def test_trigger_takes_the_next_free_millisecond(backend: Backend) -> None:
    needs_manual_runs(backend)
    now = await backend.now_ms()
    first, count = now + 300, 200  # scheduled runs of every millisecond around the trigger
    block = range(first, first + count)
    await asyncio.gather(*(win(backend, s, skip_overlap=False) for s in block))
    while await backend.now_ms() < first + 20:
        await asyncio.sleep(0.005)
    before = await backend.now_ms()
    slot = await backend.trigger(JOB, ME)
    after = await backend.now_ms()
    assert slot not in block
    if before in block and after in block:  # as intended (unless the store was slow)
        assert slot == block.stop
    else:
        assert slot == block.stop or before <= slot <= after
    assert await backend.due_runs([JOB]) == [manual(slot)]
    assert len(await records(backend)) == count  # the scheduled runs are untouched


async def test_manual_run_starts_once_on_one_instance(backend: Backend) -> None:
    needs_manual_runs(backend)
    slot = await backend.trigger(JOB, ME)
    requests = [takeover_request(slot, 0, instance_id=f"host:{i}:000000") for i in range(8)]
    claims = await asyncio.gather(*(backend.take_over(r) for r in requests))
    assert sorted(c.outcome for c in claims) == [Outcome.TAKEN] * 7 + [Outcome.WON]
    ((won, request),) = [(c, r) for c, r in zip(claims, requests, strict=True) if c.attempt]
    assert won.attempt == 1
    (rec,) = await records(backend)
    assert (rec.slot, rec.attempt, rec.origin, rec.status) == (
        slot,
        1,
        Origin.MANUAL,
        Status.RUNNING,
    )
    assert rec.instance_id == request.instance_id
    assert rec.claimed_at == rec.started_at == won.store_now and rec.finished_at is None
    assert await backend.due_runs([JOB]) == []
    again = await backend.take_over(request)  # ambiguous repeat: the same token won
    assert (again.outcome, again.attempt) == (Outcome.WON, 1)
    assert (await backend.take_over(takeover_request(slot, 0))).outcome == Outcome.TAKEN
    lease = Lease(JOB, slot, 1, request.token)
    assert await backend.heartbeat([lease], LIVE_MS) == [True]
    assert await backend.finish(lease, Status.SUCCESS, meta={"by": ME})
    rec = await record(backend, lease)
    assert (rec.status, rec.meta, rec.origin) == (Status.SUCCESS, {"by": ME}, Origin.MANUAL)
    assert len(await records(backend)) == 1


async def test_a_started_request_is_no_longer_pending(backend: Backend) -> None:
    needs_manual_runs(backend)
    first = await backend.trigger(JOB, ME)
    await start(backend, first, skip_overlap=False)
    await asyncio.sleep(0.01)
    second = await backend.trigger(JOB, ME)
    assert second > first
    assert await backend.due_runs([JOB]) == [manual(second)]


async def test_manual_run_follows_the_lease_rules(backend: Backend) -> None:
    needs_manual_runs(backend)
    slot = await backend.trigger(JOB, ME)
    first = await start(backend, slot, lease_ms=SHORT_MS)
    await expire()
    assert await backend.due_runs([JOB]) == [DueRun(JOB, slot, 1, Origin.MANUAL, "expired")]
    second = await take(backend, first)
    assert await backend.heartbeat([first, second], LIVE_MS) == [False, True]
    assert not await backend.finish(first, Status.SUCCESS)
    assert await backend.finish(second, Status.FAILED, error="boom", retry_in_ms=RETRY_MS)
    await expire(RETRY_MS)
    assert await backend.due_runs([JOB]) == [DueRun(JOB, slot, 2, Origin.MANUAL, "retry")]
    third = await take(backend, second)
    assert await backend.finish(third, Status.SUCCESS)
    assert [(r.attempt, r.origin, r.status) for r in await records(backend)] == [
        (3, Origin.MANUAL, Status.SUCCESS),
        (2, Origin.MANUAL, Status.FAILED),
        (1, Origin.MANUAL, Status.INTERRUPTED),
    ]
    assert await backend.last_scheduled_slot(JOB) is None


async def test_manual_run_waits_for_a_live_run_of_the_job(backend: Backend) -> None:
    needs_manual_runs(backend)
    now = await backend.now_ms()
    live = await win(backend, now - 1000)
    slot = await backend.trigger(JOB, ME)  # a pending request blocks no slot
    await win(backend, now - 500, job="other")
    blocked = await backend.take_over(takeover_request(slot, 0))
    assert blocked.outcome == Outcome.BLOCKED
    assert await backend.due_runs([JOB]) == [manual(slot)]  # still pending
    assert len(await records(backend, JOB)) == 1  # nothing written
    assert await backend.finish(live, Status.SUCCESS)
    await start(backend, slot)
    skipped = await backend.claim(claim_request(slot + 1))  # the manual run is live
    assert skipped.outcome == Outcome.SKIPPED


async def test_manual_run_may_overlap_when_allowed(backend: Backend) -> None:
    needs_manual_runs(backend)
    await win(backend, await backend.now_ms() - 1000)
    slot = await backend.trigger(JOB, ME)
    await start(backend, slot, skip_overlap=False)


async def test_pending_request_past_its_horizon_ends_interrupted(backend: Backend) -> None:
    needs_manual_runs(backend)
    slot = await backend.trigger(JOB, ME)
    await expire()
    claim = await backend.take_over(takeover_request(slot, 0, horizon_ms=SHORT_MS))
    assert (claim.outcome, claim.attempt) == (Outcome.EXPIRED, 0)
    (rec,) = await records(backend)
    assert (rec.slot, rec.attempt, rec.origin, rec.status) == (
        slot,
        0,
        Origin.MANUAL,
        Status.INTERRUPTED,
    )
    assert rec.instance_id == ME and rec.started_at is None and rec.finished_at is not None
    assert rec.error  # says why nothing ran
    assert await backend.due_runs([JOB]) == []
    assert (await backend.take_over(takeover_request(slot, 0))).outcome == Outcome.TAKEN
    assert not await backend.cancel(JOB, slot)
    assert await backend.trigger(JOB, ME) != slot  # a new request


async def test_trigger_is_allowed_while_paused(backend: Backend) -> None:
    needs_manual_runs(backend)
    needs(backend, "set_paused")
    now = await backend.now_ms()
    await backend.set_paused(JOB, True)
    slot = await backend.trigger(JOB, ME)
    lease = await start(backend, slot)
    assert await backend.finish(lease, Status.SUCCESS)
    assert (await backend.claim(claim_request(now + 500))).outcome == Outcome.PAUSED


async def test_manual_runs_never_move_the_catch_up_anchor(backend: Backend) -> None:
    needs_manual_runs(backend)
    now = await backend.now_ms()
    lease = await win(backend, now - 1000)
    assert await backend.finish(lease, Status.SUCCESS)
    slot = await backend.trigger(JOB, ME)
    assert await backend.last_scheduled_slot(JOB) == now - 1000
    assert await backend.finish(await start(backend, slot), Status.SUCCESS)
    assert await backend.last_scheduled_slot(JOB) == now - 1000


async def test_prune_keeps_a_pending_request(backend: Backend) -> None:
    needs_manual_runs(backend)
    slot = await backend.trigger(JOB, ME)
    assert await backend.prune(slot + HOUR) == 0
    assert await backend.due_runs([JOB]) == [manual(slot)]
    await start(backend, slot)


# -- cancel ----------------------------------------------------------------------------
async def test_cancel_a_running_run_fences_its_runner(backend: Backend) -> None:
    needs_manual_runs(backend)
    now = await backend.now_ms()
    lease = await win(backend, now - 1000, lease_ms=SHORT_MS)
    assert await backend.cancel(JOB, lease.slot)
    rec = await record(backend, lease)
    assert rec.status == Status.CANCELLED and rec.finished_at is not None
    # the runner cannot un-cancel: every write it sends is rejected and changes nothing
    assert await backend.heartbeat([lease], LIVE_MS) == [False]
    assert not await backend.finish(lease, Status.SUCCESS)
    assert not await backend.finish(lease, Status.FAILED, retry_in_ms=0)
    assert not await backend.release(lease)
    assert await record(backend, lease) == rec
    # no backup takes it over, not even once the lease would have expired
    await expire()
    assert await backend.due_runs([JOB]) == []
    assert (await backend.take_over(takeover_request(lease.slot, 1))).outcome == Outcome.TAKEN
    assert (await backend.claim(claim_request(lease.slot))).outcome == Outcome.TAKEN
    assert not await backend.cancel(JOB, lease.slot)  # already ended
    await win(backend, now)  # a cancelled run is not live: the next slot runs
    assert len(await records(backend)) == 2


async def test_cancel_a_run_whose_runner_died(backend: Backend) -> None:
    needs_manual_runs(backend)
    lease = await win(backend, await backend.now_ms(), lease_ms=SHORT_MS)
    await expire()
    assert await backend.cancel(JOB, lease.slot)
    assert (await record(backend, lease)).status == Status.CANCELLED
    assert await backend.due_runs([JOB]) == []


async def test_cancel_after_a_takeover_ends_the_current_attempt(backend: Backend) -> None:
    needs_manual_runs(backend)
    first = await win(backend, await backend.now_ms(), lease_ms=SHORT_MS)
    await expire()
    second = await take(backend, first)
    assert await backend.cancel(JOB, first.slot)
    assert [(r.attempt, r.status) for r in await records(backend)] == [
        (2, Status.CANCELLED),
        (1, Status.INTERRUPTED),
    ]
    assert await backend.heartbeat([first, second], LIVE_MS) == [False, False]
    assert not await backend.finish(second, Status.SUCCESS)


async def test_cancel_a_released_run_prevents_the_takeover(backend: Backend) -> None:
    needs_manual_runs(backend)
    lease = await win(backend, await backend.now_ms())
    assert await backend.release(lease)
    assert await backend.cancel(JOB, lease.slot)
    assert (await record(backend, lease)).status == Status.INTERRUPTED  # its end stands
    assert await backend.due_runs([JOB]) == []
    assert (await backend.take_over(takeover_request(lease.slot, 1))).outcome == Outcome.TAKEN


async def test_cancel_a_pending_request(backend: Backend) -> None:
    needs_manual_runs(backend)
    slot = await backend.trigger(JOB, ME)
    assert await backend.cancel(JOB, slot)
    (rec,) = await records(backend)
    assert (rec.slot, rec.attempt, rec.origin, rec.status) == (
        slot,
        0,
        Origin.MANUAL,
        Status.CANCELLED,
    )
    assert rec.instance_id == ME and rec.started_at is None and rec.finished_at is not None
    assert await backend.due_runs([JOB]) == []
    assert (await backend.take_over(takeover_request(slot, 0))).outcome == Outcome.TAKEN
    assert not await backend.cancel(JOB, slot)
    await asyncio.sleep(0.01)
    fresh = await backend.trigger(JOB, ME)  # a new request, not the cancelled one
    assert fresh > slot
    assert await backend.due_runs([JOB]) == [manual(fresh)]


async def test_cancel_a_run_waiting_for_its_retry(backend: Backend) -> None:
    needs_manual_runs(backend)
    lease = await win(backend, await backend.now_ms())
    assert await backend.finish(lease, Status.FAILED, error="boom", retry_in_ms=RETRY_MS)
    assert await backend.cancel(JOB, lease.slot)
    await expire(RETRY_MS)
    assert await backend.due_runs([JOB]) == []
    assert (await backend.take_over(takeover_request(lease.slot, 1))).outcome == Outcome.TAKEN
    (rec,) = await records(backend)
    assert (rec.attempt, rec.status, rec.error) == (1, Status.FAILED, "boom")  # it stands


async def test_cancel_answers_false_for_missing_or_ended_runs(backend: Backend) -> None:
    needs_manual_runs(backend)
    now = await backend.now_ms()
    assert not await backend.cancel(JOB, now)
    done = await win(backend, now - 3000)
    assert await backend.finish(done, Status.SUCCESS)
    assert not await backend.cancel(JOB, done.slot)
    live = await win(backend, now - 2000)
    skipped = await backend.claim(claim_request(now - 1000))
    assert skipped.outcome == Outcome.SKIPPED
    assert not await backend.cancel(JOB, now - 1000)
    assert not await backend.cancel("other", live.slot)
    before = await records(backend)
    assert await backend.heartbeat([live], LIVE_MS) == [True]
    assert await records(backend) == before


# -- the instance registry -----------------------------------------------------------
def instance(instance_id: str, **changes: Any) -> InstanceInfo:
    """An instance with two jobs and a target, as a scheduler registers it: the digest of
    its job set (store name → fingerprint); ``changes`` replace fields."""
    fields: dict[str, Any] = {
        "instance_id": instance_id,
        "host": "web-1",
        "pid": 4242,
        "version": "0.1.0",
        "started_at": 1_700_000_000_000,
        "last_seen": 0,
        "jobs": {"sync": "0f3a9c1e5b7d2a64", "billing:report.daily": "9d2e4b6a8c0f1e3d"},
        "targets": ("reports.send",),
    }
    fields.update(changes)
    return InstanceInfo(**fields)


async def test_registered_instances_are_listed_by_id(backend: Backend) -> None:
    needs(backend, "register", "unregister", "instances")
    assert await backend.instances() == []
    before = await backend.now_ms()
    await backend.register(instance("web-2:7:bbbbbb", host="web-2", jobs={}), LIVE_MS)
    await backend.register(instance("web-1:7:aaaaaa"), LIVE_MS)
    after = await backend.now_ms()
    live = await backend.instances()
    assert [i.instance_id for i in live] == ["web-1:7:aaaaaa", "web-2:7:bbbbbb"]
    for info in live:
        assert before <= info.last_seen <= after  # the store's clock, not the caller's 0
    first = live[0]
    assert first == instance("web-1:7:aaaaaa", last_seen=first.last_seen)
    assert (live[1].host, live[1].jobs) == ("web-2", {})


async def test_register_again_refreshes_the_instance(backend: Backend) -> None:
    needs(backend, "register", "unregister", "instances")
    await backend.register(instance("web-1:7:aaaaaa"), LIVE_MS)
    (first,) = await backend.instances()
    await asyncio.sleep(0.01)
    changed = instance("web-1:7:aaaaaa", version="0.2.0", jobs={"sync": "7b1c3e5a9f2d4c6e"})
    await backend.register(changed, LIVE_MS)
    (second,) = await backend.instances()
    assert second == instance(
        "web-1:7:aaaaaa", version="0.2.0", jobs=changed.jobs, last_seen=second.last_seen
    )
    assert second.last_seen > first.last_seen


async def test_unregister_removes_the_instance(backend: Backend) -> None:
    needs(backend, "register", "unregister", "instances")
    await backend.register(instance("a:1:000000"), LIVE_MS)
    await backend.register(instance("b:1:000000"), LIVE_MS)
    await backend.unregister("a:1:000000")
    await backend.unregister("never-registered")
    assert [i.instance_id for i in await backend.instances()] == ["b:1:000000"]


async def test_instances_expire_unless_refreshed(backend: Backend) -> None:
    needs(backend, "register", "unregister", "instances")
    await backend.register(instance("dead:1:000000"), SHORT_MS)
    await backend.register(instance("live:1:000000"), SHORT_MS)
    await asyncio.sleep(SHORT_MS / 2000)
    await backend.register(instance("live:1:000000"), LIVE_MS)  # its heartbeat-paced refresh
    await expire()
    assert [i.instance_id for i in await backend.instances()] == ["live:1:000000"]
    await backend.register(instance("dead:1:000000"), LIVE_MS)  # back after a pause
    assert len(await backend.instances()) == 2


#: What ``from anarchon_core.conformance.operations import *`` brings: the tests, no helper.
__all__ = [name for name in dict(globals()) if name.startswith("test_")]
