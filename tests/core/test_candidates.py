"""k candidates per run: the ranking, the roles, and a cluster on virtual time that
claims each slot at most k + 1 times, runs it once, and loses no slot when candidates die.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import pytest
from virtual import BASE_MS, Recorder, run_virtual

from anarchon_core import Scheduler
from anarchon_core.backend import Claim, ClaimRequest
from anarchon_core.backends import MemoryBackend
from anarchon_core.engine.candidates import (
    MAX_CANDIDATES,
    Candidates,
    Role,
    check_candidates,
    unit_interval,
)
from anarchon_core.errors import ConfigurationError
from anarchon_core.faults import FaultyBackend
from anarchon_core.testing import LoopClock

IDS = [f"host-{n}:1:abc" for n in range(7)]
HEARTBEAT_MS = 100
LEASE_MS = 300
FP = "fp-1"


def holding(
    ids: Sequence[str], jobs: Sequence[str] = ("job",), fp: str = FP
) -> dict[str, dict[str, str]]:
    """A registry read in which every instance of ``ids`` holds ``jobs`` as ``fp``."""
    return {i: dict.fromkeys(jobs, fp) for i in ids}


def views(
    k: int | None, ids: Sequence[str] = IDS, jobs: Sequence[str] = ("job",)
) -> list[Candidates]:
    """Every instance's view of the same registry, read at 0."""
    out = []
    for me in ids:
        view = Candidates(k, me, stale_after_ms=LEASE_MS)
        view.update(holding(ids, jobs), 0)
        out.append(view)
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_run_has_k_candidates_and_one_watcher(k: int) -> None:
    cluster = views(k, jobs=["orders:sync"])
    for slot in range(0, 400_000, 1000):
        roles = Counter(view.turn("orders:sync", FP, slot, 0).role for view in cluster)
        assert roles == {Role.CANDIDATE: k, Role.WATCHER: 1, Role.NONE: len(IDS) - k - 1}


def test_the_turns_follow_the_shared_ranking() -> None:
    cluster = views(2)
    ranking = cluster[0].ranking("job", FP, 42_000)
    assert sorted(ranking) == sorted(IDS)
    assert all(view.ranking("job", FP, 42_000) == ranking for view in cluster)
    by_id = {view.me: view.turn("job", FP, 42_000, 0) for view in cluster}
    assert [by_id[i].role for i in ranking] == [Role.CANDIDATE] * 2 + [Role.WATCHER] + [
        Role.NONE
    ] * 4
    assert [by_id[i].rank for i in ranking[:3]] == [0, 1, 2]


def test_the_load_is_spread_over_every_instance() -> None:
    jobs = [f"job{j}" for j in range(13)]
    cluster = views(1, jobs=jobs)
    won = Counter(
        view.me
        for slot in range(0, 7_000_000, 1000)
        for view in cluster
        if view.turn(f"job{slot % 13}", FP, slot, 0).role == Role.CANDIDATE
    )
    assert set(won) == set(IDS)
    assert max(won.values()) < 1.2 * min(won.values()), won


def test_without_a_fresh_view_every_instance_claims_unranked() -> None:
    never = Candidates(2, IDS[0], stale_after_ms=LEASE_MS)
    assert never.turn("job", FP, 0, 0).role == Role.UNRANKED
    unset = Candidates(None, IDS[0], stale_after_ms=LEASE_MS)
    unset.update(holding(IDS), 0)
    assert all(unset.turn("job", FP, s, 0).role == Role.UNRANKED for s in range(0, 10**5, 1000))
    stale = views(1)
    assert {v.turn("job", FP, 0, LEASE_MS + 1).role for v in stale} == {Role.UNRANKED}
    few = views(3, IDS[:3])
    assert {v.turn("job", FP, 0, 0).role for v in few} == {Role.CANDIDATE}


def test_instances_that_do_not_hold_the_job_are_not_ranked_for_it() -> None:
    """Other services on the store (or replicas without the job) never take a run's
    turns: two holders of a job among five instances are both its candidates."""
    entries = holding(IDS[:2], ["a:tick"]) | holding(IDS[2:], ["b:other"])
    for me in IDS[:2]:
        view = Candidates(2, me, stale_after_ms=LEASE_MS)
        view.update(entries, 0)
        for slot in range(0, 100_000, 1000):
            assert view.turn("a:tick", FP, slot, 0).role == Role.CANDIDATE
        assert set(view.ranking("a:tick", FP, 0)) == set(IDS[:2])


def test_differing_definitions_make_every_holder_claim() -> None:
    """A rolling deploy that changes a job: old and new replicas cannot agree on a
    ranking, so each claims (after a jitter) rather than trust one."""
    entries = holding(IDS[:3], fp="old") | holding(IDS[3:], fp="new")
    for me, fp in [(IDS[0], "old"), (IDS[5], "new")]:
        view = Candidates(1, me, stale_after_ms=LEASE_MS)
        view.update(entries, 0)
        assert view.turn("job", fp, 0, 0).role == Role.UNRANKED
        assert view.ranking("job", fp, 0) == []


def test_an_instance_not_yet_in_its_own_view_claims_unranked() -> None:
    view = Candidates(1, "me", stale_after_ms=LEASE_MS)
    view.update(holding(["a", "b"]), 0)
    assert view.turn("job", FP, 0, 0).role == Role.UNRANKED


def test_a_view_reports_departures() -> None:
    view = Candidates(1, "me", stale_after_ms=LEASE_MS)
    assert view.update(holding(["me", "a", "b"]), 0) == set()  # no earlier view
    assert view.instances == {"me", "a", "b"}
    assert view.update(holding(["me", "b"]), 100) == {"a"}
    assert view.update(holding(["b"]), 10_000) == set()  # the earlier view was stale
    assert view.instances == {"b"}


@pytest.mark.parametrize("bad", [0, -1, MAX_CANDIDATES + 1, 1.5, "2", True])
def test_a_bad_candidate_count_is_refused_with_the_accepted_form(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"candidates=.* give an int from 1 to 1000"):
        Scheduler("memory://", candidates=bad)  # type: ignore[arg-type]
    assert check_candidates(None) is None and check_candidates(3) == 3


def test_the_unit_interval_is_fixed_per_seed_and_slot() -> None:
    draws = [unit_interval(12345, slot) for slot in range(0, 10_000_000, 1000)]
    assert all(0 <= d < 1 for d in draws)
    assert draws == [unit_interval(12345, slot) for slot in range(0, 10_000_000, 1000)]
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02


class CountingBackend(MemoryBackend):
    """Counts the claims the store decides (a batch counts each of its requests)."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(clock=clock)
        self.claims: Counter[tuple[str, int]] = Counter()
        self.requests = 0

    async def claim(self, request: ClaimRequest) -> Claim:
        self.claims[request.job, request.slot] += 1
        return await super().claim(request)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        self.requests += 1
        return [await self.claim(r) for r in requests]


def cluster_run(
    k: int | None, *, instances: int = 6, jobs: int = 10, kill: int = 0, seconds: float = 8.0
) -> tuple[CountingBackend, Recorder, list[int], int]:
    """``instances`` schedulers with ``jobs`` jobs every second share a store; ``kill``
    of them die (no hand-over, no unregister) at half time. Returns the store, the
    executions, the slots judged and when the kill happened (store ms)."""
    recorder = Recorder()
    store = CountingBackend(recorder.clock)

    async def main() -> tuple[list[int], int]:
        links = [FaultyBackend(store) for _ in range(instances)]
        schedulers = []
        for n, link in enumerate(links):
            scheduler = Scheduler(
                link,
                instance_id=f"i{n}",
                heartbeat_ms=HEARTBEAT_MS,
                lease_ms=LEASE_MS,
                jitter_ms=100,
                candidates=k,
                clock=LoopClock(BASE_MS),
            )
            for j in range(jobs):
                scheduler.every(f"job{j}", "1s")(recorder.handler(50))
            schedulers.append(scheduler)
            await scheduler.start()
        await asyncio.sleep(seconds / 2)
        killed_at = recorder.clock()
        dying = []
        for n in range(kill):
            recorder.kill(f"i{n}")
            links[n].cut(None)
            dying.append(asyncio.ensure_future(schedulers[n].stop(grace_ms=0)))
        await asyncio.sleep(seconds / 2)
        end = recorder.clock()
        await asyncio.gather(*(s.stop(grace_ms=1000) for s in schedulers[kill:]), *dying)
        first = BASE_MS + 2000  # after the first registry reads
        return list(range(first, end - 1000, 1000)), killed_at

    slots, killed_at = run_virtual(main)
    return store, recorder, slots, killed_at


@pytest.mark.parametrize("k", [1, 2, None])
def test_each_slot_runs_once_with_at_most_k_plus_one_claims(k: int | None) -> None:
    store, recorder, slots, _ = cluster_run(k)
    runs = Counter((r.job, r.slot) for r in recorder.executions)
    for slot in slots:
        for j in range(10):
            assert runs[f"job{j}", slot] == 1, (f"job{j}", slot)
            claims = store.claims[f"job{j}", slot]
            assert claims == (6 if k is None else k + 1), (f"job{j}", slot, claims)
    assert store.requests < len(store.claims), "the jobs due at one instant are claimed together"


@pytest.mark.parametrize("k", [1, 2])
def test_no_slot_is_lost_when_its_candidates_and_watcher_die(k: int) -> None:
    """k + 1 of 6 instances die at once: every run they were the candidates and the
    watcher of is claimed by a survivor once they leave the registry (within
    lease_ms + heartbeat_ms, well inside the slots' one-second horizon)."""
    _, recorder, slots, killed_at = cluster_run(k, kill=k + 1, seconds=10.0)
    completed = {(r.job, r.slot) for r in recorder.executions if r.completed}
    dead = {f"i{n}" for n in range(k + 1)}
    for slot in slots:
        for j in range(10):
            assert (f"job{j}", slot) in completed, (f"job{j}", slot, killed_at)
    after = [r for r in recorder.executions if r.slot > killed_at]
    assert after and not {r.instance for r in after} & dead
