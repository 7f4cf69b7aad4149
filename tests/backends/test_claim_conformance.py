"""The claim contract every store keeps, lease or claim-only, proved on each the same way.

The lease stores also pass the whole contract (``test_conformance.py``); the claim-only
ones (Redis ``stream-id`` and ``script``, RabbitMQ, NATS) promise only this part: one
winner per ``(job, slot)`` however many instances claim it, judged against the slot's
horizon and the early tolerance. Each test opens several store objects on one URL, as
separate instances would, so that the contention crosses connections.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from claim_requests import claim_only_request
from registry import CLAIM_ONLY_URLS, LEASE_URLS, load_store_modules

from anarchon_core.backend import Backend, ClaimRequest
from anarchon_core.backends import backend_from_url
from anarchon_core.records import Outcome

load_store_modules()

STORES = {**LEASE_URLS, **CLAIM_ONLY_URLS}
HOUR = 3_600_000


def request(
    slot: int, job: str, *, token: str | None = None, horizon_ms: int = HOUR
) -> ClaimRequest:
    """A claim every store takes: the lease (ignored by claim-only stores) outlives the test."""
    return claim_only_request(slot, token, job, horizon_ms=horizon_ms, lease_ms=60_000)


@pytest.fixture(params=sorted(STORES))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with STORES[request.param](tmp_path) as url:
        yield url


@asynccontextmanager
async def instances(url: str, count: int) -> AsyncIterator[list[Backend]]:
    """``count`` opened store objects on ``url``: what ``count`` instances would hold."""
    async with AsyncExitStack() as stack:
        stores = []
        for _ in range(count):
            store = backend_from_url(url)
            await store.open()
            stack.push_async_callback(store.close)
            stores.append(store)
        yield stores


async def test_every_run_has_exactly_one_winner_across_instances(url: str) -> None:
    async with instances(url, 4) as stores:
        slot = await stores[0].now_ms()
        jobs = [f"contended.{n}" for n in range(10)]
        claims = [(job, store) for job in jobs for store in stores * 3]
        answers = await asyncio.gather(*(s.claim(request(slot, job)) for job, s in claims))
    won = Counter(
        job for (job, _), a in zip(claims, answers, strict=True) if a.outcome == Outcome.WON
    )
    assert won == Counter(jobs), "each run won exactly once"
    assert {a.outcome for a in answers} == {Outcome.WON, Outcome.TAKEN}
    assert {a.attempt for a in answers if a.outcome == Outcome.WON} == {1}


async def test_each_slot_and_each_job_is_a_run_of_its_own(url: str) -> None:
    """Slots in increasing order, as the engine claims them (a Redis ``stream-id`` stream
    refuses an id older than its top entry: an earlier slot claimed later is abandoned)."""
    async with instances(url, 2) as (a, b):
        now = await a.now_ms()
        first = [
            await a.claim(request(now - i * 1000, job)) for job in ("j1", "j2") for i in (2, 1)
        ]
        again = [
            await b.claim(request(now - i * 1000, job)) for job in ("j1", "j2") for i in (2, 1)
        ]
    assert [c.outcome for c in first] == [Outcome.WON] * 4
    assert [c.outcome for c in again] == [Outcome.TAKEN] * 4


async def test_a_repeated_claim_is_never_a_second_winner(url: str) -> None:
    """The same token again (an ambiguous retry) is recognised (``won``) or refused
    (``taken``: RabbitMQ cannot read its claim back); another token is refused either way."""
    async with instances(url, 2) as (a, b):
        slot = await a.now_ms()
        assert (await a.claim(request(slot, "job", token="t1"))).outcome == Outcome.WON
        repeat = await b.claim(request(slot, "job", token="t1"))
        assert repeat.outcome in (Outcome.WON, Outcome.TAKEN)
        other = await b.claim(request(slot, "job", token="t2"))
        assert other.outcome == Outcome.TAKEN


async def test_a_slot_past_its_horizon_or_too_early_is_not_won(url: str) -> None:
    async with instances(url, 1) as (store,):
        now = await store.now_ms()
        late = await store.claim(request(now - 5_000, "job", horizon_ms=4_000))
        early = await store.claim(request(now + 60_000, "job"))
        within = await store.claim(request(now - 3_000, "job", horizon_ms=4_000))
    assert late.outcome == Outcome.EXPIRED
    assert early.outcome == Outcome.EARLY
    assert within.outcome == Outcome.WON


async def test_batched_claims_have_one_winner_per_run_across_instances(url: str) -> None:
    """Every instance sends all the runs due at one instant as one ``claim_many``."""
    async with instances(url, 4) as stores:
        slot = await stores[0].now_ms()
        jobs = [f"batched.{n}" for n in range(20)]
        batches = await asyncio.gather(
            *(s.claim_many([request(slot, job) for job in jobs]) for s in stores)
        )
    assert all(len(answers) == len(jobs) for answers in batches)
    won = Counter(
        job
        for answers in batches
        for job, a in zip(jobs, answers, strict=True)
        if a.outcome == Outcome.WON
    )
    assert won == Counter(jobs), "each run won exactly once"
    assert {a.outcome for answers in batches for a in answers} == {Outcome.WON, Outcome.TAKEN}


async def test_a_batched_claim_is_answered_as_each_claim_alone(url: str) -> None:
    """Answers come back in request order, each as a single claim would get it: a won
    run, a run held by another token, a repeat of the winner's token, and too early."""
    async with instances(url, 2) as (a, b):
        now = await a.now_ms()
        held = request(now, "alone.held", token="holder")
        assert (await b.claim(held)).outcome == Outcome.WON
        fresh = request(now, "alone.fresh", token="fresh")
        answers = await a.claim_many(
            [
                fresh,
                request(now, "alone.held", token="other"),
                request(now + 60_000, "alone.early"),
            ]
        )
        assert [c.outcome for c in answers] == [Outcome.WON, Outcome.TAKEN, Outcome.EARLY]
        (again,) = await b.claim_many([fresh])
        assert again.outcome in (Outcome.WON, Outcome.TAKEN), "never a second winner"
        assert await a.claim_many([]) == []
