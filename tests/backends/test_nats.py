"""What the NATS JetStream backend promises: URLs, key encoding, one winner per run under
contention, ambiguous claims read back, outcomes and history, the claim horizon, a bucket
that expires its entries, race-free creation, the layout version, clear errors at start,
claim-only refusals, a scheduler that survives its server restarting, and the job
definitions in a bucket of their own (the shared suite proves their contract).

Tests on the shared server use their own random bucket (``stores_nats``), deleted after;
tests that restart a server or need authentication start their own ``nats-server``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import pytest
from claim_processes import claim_from_processes, opened, run_through_outage
from claim_requests import claim_only_request, now_ms
from nats.js import api
from services import free_port
from stores_nats import NATS_URL, NatsServer, delete_bucket, fresh_bucket, nats_server, require_nats

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import SCHEMA_VERSION, ClaimRequest, Lease
from anarchon_core.backends import backend_from_url
from anarchon_core.backends import nats as nats_backend
from anarchon_core.backends.nats import NatsBackend, decode_job, encode_job
from anarchon_core.cli import main as cli_main
from anarchon_core.conformance import history_pages
from anarchon_core.errors import (
    BackendError,
    BackendUnavailable,
    CapabilityError,
    ConfigurationError,
    ConflictError,
    SchemaVersionError,
)
from anarchon_core.records import HistoryQuery, Outcome, Status

HOUR = 3_600_000
NATS_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")


def request(
    slot: int, token: str | None = None, job: str = "job", horizon_ms: int = HOUR
) -> ClaimRequest:
    return claim_only_request(slot, token, job, horizon_ms=horizon_ms)


@pytest.fixture
def bucket() -> Iterator[str]:
    require_nats()
    name = fresh_bucket()
    yield name
    delete_bucket(name)


@pytest.fixture
def open_store(bucket: str) -> Callable[..., Any]:
    """``async with open_store(**options) as store``: an open backend on the test's bucket."""

    def make(url: str = NATS_URL, **params: str) -> AbstractAsyncContextManager[NatsBackend]:
        query = "&".join(f"{k}={v}" for k, v in {"bucket": bucket, **params}.items())
        return opened(NatsBackend(f"{url}/?{query}"))

    return make


async def stream_info(bucket: str, url: str = NATS_URL) -> api.StreamInfo:
    nc = await nats.connect(url)
    try:
        return await nc.jetstream().stream_info(f"KV_{bucket}")
    finally:
        await nc.close()


# -- URLs and keys -----------------------------------------------------------------------
def test_factory_builds_it_from_a_nats_url() -> None:
    store = backend_from_url("nats://alice:s3cret@n1:4222,n2/?bucket=jobs&ttl=2h&margin=30s")
    assert isinstance(store, NatsBackend)
    assert store.capabilities.lease is False
    assert store.capabilities.store_clock is False
    assert store.capabilities.finish is True
    assert (store.bucket, store.ttl_ms, store.margin_ms) == ("jobs", 7_200_000, 30_000)
    assert store.describe() == "nats://alice:***@n1:4222,n2:4222/?bucket=jobs&ttl=2h&margin=30s"
    token = backend_from_url("nats://t0ken@localhost")
    assert token.describe() == "nats://***@localhost:4222/?bucket=anarchon"
    assert NatsBackend().stream == "KV_anarchon"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nats://", "a host is missing"),
        ("nats://host:99999", "is not valid"),
        ("nats://host/path", "is not valid"),
        ("nats://host/?bucket=a.b", "NATS bucket 'a.b' is not valid"),
        ("nats://host/?bucket=", "NATS bucket '' is not valid"),
        ("nats://host/?stream=x", "unknown option 'stream'; accepted: bucket"),
        ("nats://host/?bucket=a&bucket=b", "repeats option 'bucket'"),
        ("nats://host/?ttl=30s&margin=1m", "it must exceed the margin"),
        ("nats://host/?ttl=24", "a bare number has no unit"),
        ("nats://host/?replicas=7", "give 1 to 5"),
        ("nats://u:hunter2@host/?replicas=x", "give 1 to 5"),
    ],
)
def test_bad_urls_are_refused_with_the_accepted_form(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        backend_from_url(url)
    assert "hunter2" not in str(info.value)


ODD_NAMES = ["a", "a.b", "a:b", "a-b", "a_b", "a..b", "a.", "ns:job.", "A.b:c-d_e", "0", "x" * 200]


@pytest.mark.parametrize("job", ODD_NAMES)
def test_job_names_become_valid_nats_keys(job: str) -> None:
    key = NatsBackend().run_key(job, -(10**15))
    assert NATS_KEY.fullmatch(key) and not key.startswith(".") and not key.endswith(".")
    prefix, encoded, slot = key.split(".")
    assert (prefix, decode_job(encoded), slot) == ("c", job, str(-(10**15)))


def test_key_encoding_is_one_to_one() -> None:
    rng = random.Random(7)
    alphabet = "ab.:_-"
    names = {
        "a" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(3000)
    }
    assert len({encode_job(n) for n in names}) == len(names)
    with pytest.raises(ConfigurationError, match="job name in the store"):
        encode_job("no spaces")


# -- the claim --------------------------------------------------------------------------
async def test_exactly_one_winner_under_heavy_contention(open_store: Callable[..., Any]) -> None:
    slot = now_ms() // 1000 * 1000
    jobs = [f"contended.{n}" for n in range(40)]
    async with open_store() as a, open_store() as b, open_store() as c, open_store() as d:
        claims = [store.claim(request(slot, job=job)) for job in jobs for store in (a, b, c, d) * 5]
        answers = await asyncio.gather(*claims)
    owners = [j for j in jobs for _ in range(20)]
    won = Counter(job for job, a in zip(owners, answers, strict=True) if a.outcome == Outcome.WON)
    assert won == Counter(jobs), "every run won exactly once"
    assert {a.outcome for a in answers} == {Outcome.WON, Outcome.TAKEN}


async def test_odd_but_valid_names_claim_their_own_key(open_store: Callable[..., Any]) -> None:
    slot = now_ms()
    async with open_store() as store:
        first = [await store.claim(request(slot, job=name)) for name in ODD_NAMES]
        again = [await store.claim(request(slot, job=name)) for name in ODD_NAMES]
        assert [c.outcome for c in first] == [Outcome.WON] * len(ODD_NAMES)
        assert [c.outcome for c in again] == [Outcome.TAKEN] * len(ODD_NAMES)
        records = await store.history(HistoryQuery(limit=1000))
        assert sorted(r.job for r in records) == sorted(ODD_NAMES)


async def test_an_ambiguous_claim_is_read_back_by_its_token(
    open_store: Callable[..., Any],
) -> None:
    """A claim whose answer was lost is retried with its token: the entry tells who won."""
    slot = now_ms()
    async with open_store() as store:
        assert (await store.claim(request(slot, token="mine"))).outcome == Outcome.WON
        store._ambiguous["mine"] = None  # as if the acknowledgement had been lost
        again = await store.claim(request(slot, token="mine"))
        assert (again.outcome, again.attempt) == (Outcome.WON, 1)
        store._ambiguous["other"] = None
        assert (await store.claim(request(slot, token="other"))).outcome == Outcome.TAKEN
        assert not store._ambiguous
        # Without a lost answer, a repeated claim is simply taken (one round trip).
        assert (await store.claim(request(slot, token="mine"))).outcome == Outcome.TAKEN


async def test_horizon_early_claims_and_the_bucket_age_bound_it(
    open_store: Callable[..., Any],
) -> None:
    now = now_ms()
    async with open_store(ttl="10s", margin="2s") as store:
        assert (await store.claim(request(now - 5_000, horizon_ms=4_000))).outcome == (
            Outcome.EXPIRED
        )
        assert (await store.claim(request(now + 60_000))).outcome == Outcome.EARLY
        # An hour of horizon is cut to max age - margin: the entry must outlive it.
        assert store.horizon_ms(HOUR) == 8_000
        assert (await store.claim(request(now - 9_000))).outcome == Outcome.EXPIRED
        assert (await store.claim(request(now - 7_000))).outcome == Outcome.WON
        assert await store.history(HistoryQuery()) != []


async def test_entries_expire_with_the_bucket_max_age(
    open_store: Callable[..., Any], bucket: str
) -> None:
    """Nothing piles up: JetStream deletes entries older than the bucket's max age."""
    async with open_store(ttl="1s", margin="0s") as store:
        assert (await store.claim(request(now_ms(), horizon_ms=500))).outcome == Outcome.WON
        assert len(await store.history(HistoryQuery())) == 1
        deadline = time.monotonic() + 6
        while await store.history(HistoryQuery()):
            assert time.monotonic() < deadline, "the entry did not expire"
            await asyncio.sleep(0.2)
    assert (await stream_info(bucket)).state.messages == 0


# -- batched claims ---------------------------------------------------------------------------
async def test_batches_from_three_stores_have_one_winner_per_run(
    open_store: Callable[..., Any], bucket: str
) -> None:
    """Three instances send the same 200 runs, each as one ``claim_many``, at once; each
    run's entry holds its winner's token."""
    slot = now_ms()
    jobs = [f"batch.{n}" for n in range(200)]
    sent = [[request(slot, job=job) for job in jobs] for _ in range(3)]
    async with open_store() as a, open_store() as b, open_store() as c:
        batches = await asyncio.gather(
            *(s.claim_many(requests) for s, requests in zip((a, b, c), sent, strict=True))
        )
        keys = [a.run_key(job, slot) for job in jobs]
    winners: dict[str, list[str]] = {job: [] for job in jobs}
    for requests, answers in zip(sent, batches, strict=True):
        for r, answer in zip(requests, answers, strict=True):
            if answer.outcome == Outcome.WON:
                winners[r.job].append(r.token)
    assert all(len(tokens) == 1 for tokens in winners.values()), "every run won exactly once"
    assert {x.outcome for answers in batches for x in answers} == {Outcome.WON, Outcome.TAKEN}
    nc = await nats.connect(NATS_URL)
    try:
        kv = await nc.jetstream().key_value(bucket)
        stored = [json.loads((await kv.get(key)).value or b"{}")["token"] for key in keys]
    finally:
        await nc.close()
    assert stored == [winners[job][0] for job in jobs]


async def test_a_failed_batch_retried_with_its_tokens_wins_only_its_own_runs(
    open_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One create's answer is lost: the batch fails as a whole; the retry with the same
    tokens answers won for every run it created (known locally, or read back) and
    taken for the runs another instance holds."""
    slot = now_ms()
    jobs = [f"retry.{n}" for n in range(30)]
    mine = [request(slot, job=job) for job in jobs]
    async with open_store() as a, open_store() as b:
        theirs = await b.claim_many([request(slot, job=job) for job in jobs[:5]])
        assert {c.outcome for c in theirs} == {Outcome.WON}
        create_many = a._create_many

        async def lossy(creates: list[tuple[str, dict[str, Any]]]) -> list[Any]:
            results = await create_many(creates)
            results[10] = TimeoutError("the acknowledgement was lost")  # it was created
            return results

        monkeypatch.setattr(a, "_create_many", lossy)
        with pytest.raises(BackendUnavailable, match="a retry reads back"):
            await a.claim_many(mine)
        monkeypatch.undo()
        again = await a.claim_many(mine)
        assert [c.outcome for c in again] == [Outcome.TAKEN] * 5 + [Outcome.WON] * 25
        assert not a._ambiguous
        others = await b.claim_many([request(slot, job=job) for job in jobs])
        assert {c.outcome for c in others} == {Outcome.TAKEN}, "never a second winner"
        lease = Lease(jobs[10], slot, 1, mine[10].token)
        assert await a.finish(lease, Status.SUCCESS), "the read-back run is finished by its token"


async def test_a_batch_keeps_at_most_max_in_flight_creates_unanswered(
    open_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nats_backend, "MAX_IN_FLIGHT", 8)
    send, peak = nats_backend._Pipeline.send, [0]

    async def counting(self: Any, *args: Any) -> Any:
        future = await send(self, *args)
        peak[0] = max(peak[0], len(self._pending))
        return future

    monkeypatch.setattr(nats_backend._Pipeline, "send", counting)
    slot = now_ms()
    async with open_store() as store:
        answers = await store.claim_many([request(slot, job=f"w.{n}") for n in range(100)])
        assert [c.outcome for c in answers] == [Outcome.WON] * 100
        repeat = await store.claim_many([request(slot, job=f"w.{n}") for n in range(100)])
        assert [c.outcome for c in repeat] == [Outcome.TAKEN] * 100
    assert peak[0] == 8, "pipelined, and never more than MAX_IN_FLIGHT unanswered"


# -- outcomes and history -------------------------------------------------------------------
async def test_finish_records_the_outcome_fenced_by_token(open_store: Callable[..., Any]) -> None:
    slot = now_ms()
    async with open_store() as store, open_store() as other:
        assert (await store.claim(request(slot, token="tok", job="a"))).outcome == Outcome.WON
        lease = Lease("a", slot, 1, "tok")
        assert await store.finish(Lease("a", slot, 1, "stale"), Status.SUCCESS) is False
        assert await store.finish(lease, Status.FAILED, error="boom", meta={"k": 1})
        assert await store.finish(lease, Status.FAILED) is True  # a repeat is accepted
        assert await other.finish(lease, Status.SUCCESS) is False  # but never changed
        assert (await other.claim(request(slot, token="x", job="b"))).outcome == Outcome.WON
        assert await store.finish(Lease("b", slot, 1, "x"), Status.SUCCESS)  # no cached rev
        assert await store.finish(Lease("zzz", slot, 1, "x"), Status.SUCCESS) is False
        [b, a] = await store.history(HistoryQuery())  # one slot: job descending
    assert (a.job, a.status, a.error, a.meta, a.attempt) == (
        "a",
        Status.FAILED,
        "boom",
        {"k": 1},
        1,
    )
    assert a.finished_at is not None and a.claimed_at is not None and a.started_at == a.claimed_at
    assert (b.job, b.status, b.instance_id) == ("b", Status.SUCCESS, "worker:x")


async def test_history_filters_and_orders(open_store: Callable[..., Any]) -> None:
    base = now_ms() // 1000 * 1000 - 10_000
    async with open_store() as store:
        for n in range(5):
            for job in ("x", "y:z"):
                await store.claim(request(base + n * 1000, token=f"{job}{n}", job=job))
        await store.finish(Lease("x", base + 1000, 1, "x1"), Status.SUCCESS)
        everything = await store.history(HistoryQuery(limit=100))
        assert [(r.slot, r.job) for r in everything[:3]] == [
            (base + 4000, "y:z"),
            (base + 4000, "x"),
            (base + 3000, "y:z"),
        ]
        assert len(await store.history(HistoryQuery(job="y:z"))) == 5
        assert [r.slot for r in await store.history(HistoryQuery(status=Status.SUCCESS))] == [
            base + 1000
        ]
        window = await store.history(HistoryQuery(since=base + 1000, until=base + 3000))
        assert sorted({r.slot for r in window}) == [base + 1000, base + 2000]
        assert len(await store.history(HistoryQuery(limit=3))) == 3
        assert await store.history(HistoryQuery(job="nobody")) == []
        for query in (HistoryQuery(), HistoryQuery(job="x"), HistoryQuery(since=base + 2000)):
            whole = await store.history(replace(query, limit=100))
            for limit in (1, 2, 3):
                pages = await history_pages(store, replace(query, limit=limit))
                assert [r for page in pages for r in page] == whole, (query, limit)
        assert await store.prune(now_ms()) == 0


def test_exactly_one_winner_across_processes(bucket: str) -> None:
    """Four processes, each with its own connection, claim the same 300 runs at once."""
    jobs = [f"mp.{n}" for n in range(300)]
    url = f"{NATS_URL}/?bucket={bucket}"
    won = claim_from_processes(url, jobs, processes=4, horizon_ms=HOUR)
    assert won == Counter(jobs), "every run won exactly once"


# -- job definitions --------------------------------------------------------------------
def versioned(slot: int, job: str, version: int) -> ClaimRequest:
    return replace(request(slot, job=job), version=version)


async def test_definitions_live_in_a_bucket_of_their_own_that_never_expires(
    open_store: Callable[..., Any], bucket: str
) -> None:
    async with open_store(ttl="10s", margin="2s") as store:
        info = await stream_info(f"{bucket}_definitions")
        assert info.config.description == f"anarchon job definitions, layout {SCHEMA_VERSION}"
        assert not info.config.max_age, "the claim bucket's ttl must not drop definitions"
        assert info.config.max_msgs_per_subject == 1
        assert not info.config.allow_direct, "reads are served by the stream's leader"
        version = await store.write_definition("billing:sync.daily", "{}", expected=0)
        nc = await nats.connect(NATS_URL)
        try:
            kv = await nc.jetstream().key_value(f"{bucket}_definitions")
            entry = await kv.get("d.billing=3Async=2Edaily")
        finally:
            await nc.close()
        assert (entry.revision, entry.value) == (version, b"{}")
        assert await store.definitions_version() == version


async def test_a_store_of_the_previous_release_gains_the_definitions_bucket(bucket: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().create_key_value(
            api.KeyValueConfig(
                bucket=bucket, description="anarchon claim records, layout 1", history=1, ttl=3600
            )
        )
    finally:
        await nc.close()
    async with opened(NatsBackend(f"{NATS_URL}/?bucket={bucket}")) as store:
        assert await store.definitions_version() == 0
        assert await store.write_definition("job", "{}", expected=0) == 1


async def test_a_foreign_or_newer_definitions_bucket_is_refused(bucket: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        js = nc.jetstream()
        await js.create_key_value(api.KeyValueConfig(bucket=f"{bucket}_definitions", ttl=30))
        with pytest.raises(BackendError, match="is not an anarchon definitions bucket"):
            await NatsBackend(f"{NATS_URL}/?bucket={bucket}").open()
        await js.delete_key_value(f"{bucket}_definitions")
        await js.create_key_value(
            api.KeyValueConfig(
                bucket=f"{bucket}_definitions", description="anarchon job definitions, layout 99"
            )
        )
        with pytest.raises(SchemaVersionError, match="layout 99, written by a newer anarchon"):
            await NatsBackend(f"{NATS_URL}/?bucket={bucket}").open()
    finally:
        await nc.close()


async def test_a_tombstone_is_no_version_and_a_purge_is_a_removal(
    open_store: Callable[..., Any], bucket: str
) -> None:
    async with open_store() as store:
        v1 = await store.write_definition("job", "{}", expected=0)
        gone = await store.write_definition("job", None, expected=v1)
        # The tombstone's revision names no definition: an edit or removal "at" it conflicts.
        with pytest.raises(ConflictError) as edit:
            await store.write_definition("job", "{}", expected=gone)
        assert edit.value.current == 0
        with pytest.raises(ConflictError):
            await store.write_definition("job", None, expected=gone)
        assert await store.definitions_version() == gone
        # An operator's purge (nats kv purge) reads as a removal, and the name is free again.
        again = await store.write_definition("job", "{}", expected=0)
        nc = await nats.connect(NATS_URL)
        try:
            kv = await nc.jetstream().key_value(f"{bucket}_definitions")
            await kv.purge("d.job")
        finally:
            await nc.close()
        (purged,) = await store.definitions_since(again)
        assert (purged.job, purged.body) == ("job", None) and purged.version > again
        assert await store.write_definition("job", "{}", expected=0) > purged.version


async def test_a_reader_polling_while_others_write_misses_no_change(
    open_store: Callable[..., Any],
) -> None:
    """Read with ``definitions_since(seen)`` while 200 edits of 20 jobs land: the last
    body read of every job is the one stored (no watcher "done" signal is trusted)."""
    async with open_store() as writer, open_store() as other, open_store() as reader:
        seen, view = 0, {}

        async def write(n: int, store: NatsBackend) -> None:
            for i in range(10):
                await store.write_definition(f"job-{n}", json.dumps({"i": i}), expected=None)

        async def poll() -> None:
            nonlocal seen
            for d in await reader.definitions_since(seen):
                view[d.job] = d.body
                seen = max(seen, d.version)

        writes = asyncio.gather(*(write(n, (writer, other)[n % 2]) for n in range(20)))
        while not writes.done():
            await poll()
            await asyncio.sleep(0)
        await writes
        await poll()
        stored = {d.job: d.body for d in await writer.definitions_since(0)}
        assert view == stored and len(stored) == 20
        assert seen == await reader.definitions_version()


async def test_only_a_claim_with_a_version_reads_the_definition(
    open_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = now_ms()
    async with open_store() as store:
        va = await store.write_definition("a", "{}", expected=0)
        vb = await store.write_definition("b", "{}", expected=0)
        assert store._definitions is not None
        reads: list[str] = []
        read = store._definitions.get

        async def counted(key: str, *args: Any, **kwargs: Any) -> Any:
            reads.append(key)
            return await read(key, *args, **kwargs)

        monkeypatch.setattr(store._definitions, "get", counted)
        assert (await store.claim(request(slot, job="a"))).outcome == Outcome.WON
        assert reads == []
        assert (await store.claim(versioned(slot + 1, "a", va))).outcome == Outcome.WON
        assert reads == ["d.a"]
        reads.clear()
        answers = await store.claim_many(
            [versioned(slot + 2, "a", va), versioned(slot + 2, "b", vb), request(slot + 3, job="b")]
        )
        assert [a.outcome for a in answers] == [Outcome.WON] * 3
        assert sorted(reads) == ["d.a", "d.b"]


async def test_a_batched_stale_claim_is_decided_at_its_place_in_the_batch(
    open_store: Callable[..., Any],
) -> None:
    slot = now_ms()
    async with open_store() as store:
        v1 = await store.write_definition("job", "{}", expected=0)
        v2 = await store.write_definition("job", "{}", expected=v1)
        answers = await store.claim_many(
            [
                versioned(slot, "job", v1),  # stale, and the run does not exist yet
                versioned(slot, "job", v2),  # won
                versioned(slot, "job", v1),  # stale, after a claim that created the run
                versioned(slot + 1, "job", v1),
            ]
        )
        assert [a.outcome for a in answers] == [
            Outcome.STALE,
            Outcome.WON,
            Outcome.TAKEN,
            Outcome.STALE,
        ]
        assert [r.slot for r in await store.history(HistoryQuery())] == [slot]


async def test_the_version_check_is_a_read_before_the_create_not_one_step(
    open_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented gap: a change committed between the claim's read of the definition
    and its create is not seen, and that one claim of the old version wins."""
    slot = now_ms()
    async with open_store() as store, open_store() as editor:
        v1 = await store.write_definition("job", "{}", expected=0)
        read = store._held_versions

        async def read_then_edit(jobs: Any) -> dict[str, int]:
            held = await read(jobs)
            await editor.write_definition("job", '{"new": 1}', expected=v1)
            return held

        monkeypatch.setattr(store, "_held_versions", read_then_edit)
        assert (await store.claim(versioned(slot, "job", v1))).outcome == Outcome.WON
        monkeypatch.undo()
        assert (await store.claim(versioned(slot + 1, "job", v1))).outcome == Outcome.STALE


# -- start: bucket, layout, errors ------------------------------------------------------------
async def test_concurrent_first_starts_create_the_bucket_once(bucket: str) -> None:
    stores = [NatsBackend(f"{NATS_URL}/?bucket={bucket}&ttl={n + 1}h") for n in range(8)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        info = await stream_info(bucket)
        assert info.config.description == f"anarchon claim records, layout {SCHEMA_VERSION}"
        assert info.config.max_msgs_per_subject == 1
        assert info.config.max_age is not None
        assert {s.horizon_ms(100 * HOUR) for s in stores} == {info.config.max_age * 1000 - 60_000}
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_newer_layout_or_a_foreign_bucket_is_refused(bucket: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        js = nc.jetstream()
        await js.create_key_value(
            api.KeyValueConfig(bucket=bucket, description="anarchon claim records, layout 99")
        )
        with pytest.raises(SchemaVersionError, match="layout 99, written by a newer anarchon"):
            await NatsBackend(f"{NATS_URL}/?bucket={bucket}").open()
        await js.delete_key_value(bucket)
        await js.create_key_value(api.KeyValueConfig(bucket=bucket, history=5))
        with pytest.raises(BackendError, match="is not an anarchon claim bucket"):
            await NatsBackend(f"{NATS_URL}/?bucket={bucket}").open()
        await js.delete_key_value(bucket)
        await js.create_key_value(api.KeyValueConfig(bucket=bucket, ttl=30))
        with pytest.raises(ConfigurationError, match="not longer than the margin"):
            await NatsBackend(f"{NATS_URL}/?bucket={bucket}").open()
    finally:
        await nc.close()


async def test_unreachable_server_is_unavailable_at_open() -> None:
    store = backend_from_url(f"nats://127.0.0.1:{free_port()}")
    with pytest.raises(BackendUnavailable, match="cannot be reached: ConnectionRefusedError"):
        await store.open()
    with pytest.raises(BackendUnavailable, match="is not open"):
        await store.claim(request(now_ms()))
    await store.close()


async def test_wrong_credentials_and_missing_jetstream_are_clear_errors(tmp_path: Path) -> None:
    with nats_server(tmp_path, user="anarchon", password="right") as server:
        wrong = backend_from_url(f"nats://anarchon:wrong@127.0.0.1:{server.port}")
        with pytest.raises(BackendError, match="refused the credentials") as info:
            await wrong.open()
        assert "wrong" not in str(info.value) and "anarchon:***@" in str(info.value)
        ok = backend_from_url(f"nats://anarchon:right@127.0.0.1:{server.port}")
        await ok.open()
        assert (await ok.claim(request(now_ms()))).outcome == Outcome.WON
        await ok.close()
    plain = tmp_path / "plain"
    plain.mkdir()
    with nats_server(plain, jetstream=False) as server:
        store = backend_from_url(server.url)
        with pytest.raises(BackendError, match="JetStream is not enabled"):
            await store.open()


# -- the scheduler on NATS ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"catch_up": "all"}, "catch_up='all' needs a lease backend"),
        ({"overlap": "skip"}, "overlap='skip' needs a lease backend"),
        ({"max_attempts": 2}, "max_attempts=2 allows takeovers"),
    ],
)
async def test_lease_only_options_are_refused(
    bucket: str, options: dict[str, Any], message: str
) -> None:
    scheduler = Scheduler(f"{NATS_URL}/?bucket={bucket}")
    scheduler.every("job", "1h", lambda ctx: None, **options)
    with pytest.raises(CapabilityError, match=message) as info:
        await scheduler.start()
    assert f"the nats backend (nats://127.0.0.1:4222/?bucket={bucket}) is claim-only" in str(
        info.value
    )
    assert "sqlite://, postgresql://, redis://?strategy=lease" in str(info.value)


async def test_history_shows_claimed_then_the_outcome(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{NATS_URL}/?bucket={bucket}"
    scheduler = Scheduler(url, instance_id="solo", jitter_ms=0, namespace="svc")
    gate = asyncio.Event()

    @scheduler.every("ok", "200ms")
    async def ok(ctx: RunContext) -> None:
        ctx.meta["n"] = 1

    @scheduler.every("bad", "200ms")
    async def bad(ctx: RunContext) -> None:
        raise ValueError("nope")

    @scheduler.every("slow", "200ms", timeout_ms=5_000)
    async def slow(ctx: RunContext) -> None:
        await gate.wait()

    await scheduler.start()
    try:
        deadline = time.monotonic() + 5
        while True:
            statuses = {(r.job, r.status) for r in await scheduler.history(limit=1000)}
            if {("svc:ok", Status.SUCCESS), ("svc:bad", Status.FAILED)} <= statuses and (
                "svc:slow",
                Status.CLAIMED,
            ) in statuses:
                break
            assert time.monotonic() < deadline, statuses
            await asyncio.sleep(0.05)
    finally:
        gate.set()
        await scheduler.stop()
    loop = asyncio.get_running_loop()
    code = await loop.run_in_executor(
        None, cli_main, ["history", "--backend", url, "--job", "svc:bad", "--json", "--limit", "1"]
    )
    assert code == 0
    [line] = capsys.readouterr().out.splitlines()  # JSON lines, one per record
    record = json.loads(line)
    assert (record["status"], record["instance_id"], record["attempt"]) == ("failed", "solo", 1)
    assert "ValueError: nope" in record["error"]


async def test_scheduler_survives_a_server_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three schedulers run a job every 200 ms while their own server restarts."""
    server = NatsServer(tmp_path).start()
    try:
        loop = asyncio.get_running_loop()
        runs = await run_through_outage(
            f"{server.url}/?bucket=resilience&timeout=1s",
            lambda: loop.run_in_executor(None, server.restart, 0.5),
            caplog,
            wait_s=15,
            start_s=15,
        )
        async with opened(NatsBackend(f"{server.url}/?bucket=resilience")) as reader:
            recorded = await reader.history(HistoryQuery(limit=10_000))
    finally:
        server.stop()
    assert "reconnected to NATS" in caplog.text
    # Every run's claim, from before the restart too, is still in the bucket, by its runner.
    assert {(r.instance_id, r.slot) for r in recorded} >= set(runs)


async def test_acknowledged_claims_survive_a_killed_server(tmp_path: Path) -> None:
    """``kill -9`` of the server process loses no acknowledged claim (file storage)."""
    server = NatsServer(tmp_path).start()
    try:
        async with opened(NatsBackend(f"{server.url}/?bucket=durable")) as store:
            slot = now_ms()
            for n in range(50):
                assert (await store.claim(request(slot, job=f"j{n}"))).outcome == Outcome.WON
        server.kill()
        server.start()
        async with opened(NatsBackend(f"{server.url}/?bucket=durable")) as store:
            answers = [await store.claim(request(slot, job=f"j{n}")) for n in range(50)]
            assert {a.outcome for a in answers} == {Outcome.TAKEN}
    finally:
        server.stop()
