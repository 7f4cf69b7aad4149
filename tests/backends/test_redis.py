"""What only the Redis backend promises: URLs, strategies, its key layout, and resilience.

The lease strategy also passes the whole shared conformance suite (``[redis]`` and
``[valkey]`` in ``test_conformance.py``). Tests that change server-wide state (script
cache, restarts) use a throwaway server of their own, never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis_servers import (
    Server,
    delete_prefix,
    free_port,
    fresh_prefix,
    glob_escape,
    redis_binary,
    shared_redis_url,
    valkey_url,
    with_params,
)
from services import service_unreachable

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import (
    DEFINITION_BACKENDS,
    SCHEMA_VERSION,
    ClaimRequest,
    InstanceInfo,
    Lease,
    StoredDefinition,
    overlap_reason,
)
from anarchon_core.backends import backend_from_url
from anarchon_core.backends.redis import (
    RedisBackend,
    RedisIdmpBackend,
    RedisLeaseBackend,
    RedisScriptBackend,
    RedisStreamIdBackend,
)
from anarchon_core.backends.redis._base import MAX_BATCH
from anarchon_core.backends.redis._streams import IDMP_PRODUCER, idmp_xadd_command
from anarchon_core.conformance import history_pages, takeover_request
from anarchon_core.errors import (
    BackendError,
    BackendUnavailable,
    CapabilityError,
    ConfigurationError,
    SchemaVersionError,
)
from anarchon_core.records import HistoryQuery, Origin, Outcome, Status
from anarchon_core.redact import brief

HOUR = 3_600_000
CLAIM_ONLY = ["script", "stream-id"]
#: Names the core rejects at definition time; stored safely if given to a backend directly.
ODD_NAMES = [
    "it's",
    'say "hi"',
    "a b",
    "*",
    "%s%d",
    "'; DROP TABLE anarchon_runs; --",
    "x}:run:1",
    "{tag}",
    "ζ✓",
]


def request(
    slot: int,
    *,
    job: str = "job",
    token: str | None = None,
    horizon_ms: int = HOUR,
    version: int | None = None,
) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token or secrets.token_hex(8),
        instance_id="host:1:abcdef",
        lease_ms=60_000,
        horizon_ms=horizon_ms,
        skip_overlap=False,
        fingerprint="every:1s",
        version=version,
    )


@asynccontextmanager
async def opened(
    strategy: str = "lease", *, url: str | None = None, prefix: str | None = None
) -> AsyncIterator[RedisBackend]:
    """An open backend under a fresh prefix, whose keys are deleted afterwards."""
    url = url or shared_redis_url()
    prefix = prefix or fresh_prefix()
    backend = RedisBackend(with_params(url, strategy=strategy, prefix=prefix))
    try:
        await backend.open()
        yield backend
    finally:
        await backend.close()
        delete_prefix(url, prefix)


def keys_of(url: str, prefix: str) -> set[str]:
    with sync_redis.Redis.from_url(url, decode_responses=True) as client:
        return set(client.scan_iter(match=glob_escape(prefix) + ":*", count=1000))


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A throwaway server with AOF (``appendfsync always``) on its own port and directory."""
    binary = redis_binary()
    if binary is None:
        service_unreachable("a throwaway Redis", "no redis-server or valkey-server binary")
    server = Server(binary, tmp_path / "redis", appendonly=True).start()
    try:
        yield server
    finally:
        server.stop()


# -- URLs and construction (no server) -----------------------------------------------
@pytest.mark.parametrize(
    ("url", "cls", "prefix"),
    [
        ("redis://127.0.0.1:6379/0", RedisLeaseBackend, "anarchon"),
        ("redis://h/0?strategy=lease&prefix=app", RedisLeaseBackend, "app"),
        ("rediss://h:6380/2?strategy=script", RedisScriptBackend, "anarchon"),
        ("redis://h?strategy=stream-id&prefix=a%20b", RedisStreamIdBackend, "a b"),
        ("redis://h?strategy=idmp&socket_timeout=2", RedisIdmpBackend, "anarchon"),
    ],
)
def test_url_forms(url: str, cls: type[RedisBackend], prefix: str) -> None:
    backend = backend_from_url(url)
    assert type(backend) is cls and isinstance(backend, RedisBackend)
    assert backend.prefix == prefix
    assert f"strategy={cls.strategy}" in backend.describe()


def test_constructor_picks_the_strategy_class() -> None:
    backend = RedisBackend("redis://h/0", strategy="stream-id", prefix="p")
    assert type(backend) is RedisStreamIdBackend
    assert backend.describe() == "redis://h/0?strategy=stream-id&prefix=p"
    assert type(RedisBackend("redis://h/0?strategy=script", strategy="script")) is (
        RedisScriptBackend
    )


def test_credentials_are_masked() -> None:
    backend = backend_from_url("redis://user:s3cret@h:6379/0?strategy=script")
    assert "s3cret" not in backend.describe() and "***" in backend.describe()
    with pytest.raises(ConfigurationError) as err:
        backend_from_url("redis://user:s3cret@h:6379/0?strategy=nope")
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "kwargs", "named"),
    [
        ("redis://h/0?strategy=lock", {}, "'lock'"),
        ("redis://h/0?colour=blue", {}, "colour"),
        ("redis://h/0?prefix=a&prefix=b", {}, "'prefix' is given twice"),
        ("redis://h/0?strategy=script", {"strategy": "lease"}, "given twice"),
        ("redis://h/0?prefix={app}", {}, "'{app}'"),
        ("redis://h/0?prefix=", {}, "''"),
        ("redis://h/0?prefix=a%0Ab", {}, "'a\\nb'"),
        ("redis://h/0?prefix=" + "x" * 101, {}, "1-100"),
        ("http://h/0", {}, "redis://"),
        ("redis:///0", {}, "redis://"),
        ("redis://h:port/0", {}, "redis://"),
    ],
)
def test_bad_urls_are_refused_naming_the_value(
    url: str, kwargs: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        RedisBackend(url, **kwargs)
    assert named in str(err.value)


def test_prefix_given_in_code_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="hash tag"):
        RedisBackend("redis://h/0", prefix="a}b")


def test_claim_only_strategies_refuse_lease_operations() -> None:
    lease = Lease("job", 1000, 1, "token")
    for strategy in ("script", "stream-id", "idmp"):
        backend = RedisBackend("redis://h/0", strategy=strategy)
        assert not backend.capabilities.lease and backend.capabilities.store_clock
        assert backend.capabilities.finish == (strategy == "script")
        with pytest.raises(CapabilityError, match=f"strategy={strategy}"):
            asyncio.run(backend.heartbeat([lease], 1000))
    assert RedisBackend("redis://h/0").capabilities.lease


def test_claim_only_strategies_refuse_definitions_naming_the_stores_that_keep_them() -> None:
    for strategy in ("script", "stream-id", "idmp"):
        backend = RedisBackend("redis://h/0", strategy=strategy)
        for call in (
            backend.definitions_version(),
            backend.definitions_since(0),
            backend.write_definition("job", "{}", expected=0),
        ):
            with pytest.raises(CapabilityError, match=f"strategy={strategy}") as err:
                asyncio.run(call)
            assert DEFINITION_BACKENDS in str(err.value)


def test_idmp_command_construction() -> None:
    fields = {"token": "t", "instance": "i"}
    command = idmp_xadd_command("app:{job}:stream", 1_700_000_000_000, fields)
    assert command == [
        "XADD",
        "app:{job}:stream",
        "IDMP",
        IDMP_PRODUCER,
        "1700000000000",
        "*",
        "token",
        "t",
        "instance",
        "i",
    ]


def test_odd_job_names_are_rejected_at_definition() -> None:
    scheduler = Scheduler("redis://127.0.0.1:6379/0?strategy=lease")
    for name in [*ODD_NAMES, "", "x" * 201]:
        with pytest.raises(ConfigurationError) as err:
            scheduler.every(name, "1s", lambda ctx: None)
        assert brief(name) in str(err.value)
    with pytest.raises(ConfigurationError):
        Scheduler("redis://127.0.0.1:6379/0", namespace="bad ns")


# -- the store: layout, versions, scripts ------------------------------------------------
async def test_key_layout_and_lease_ttl() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix) as backend:
        now = await backend.now_ms()
        claim = await backend.claim(request(now, token="tok"))
        assert claim.outcome == Outcome.WON
        base = f"{prefix}:{{job}}:"
        assert keys_of(url, prefix) == {
            f"{prefix}:layout",
            f"{prefix}:jobs",
            f"{base}run:{now}",
            f"{base}lease:{now}",
            f"{base}open",
            f"{base}slots",
            f"{base}job",
        }
        with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
            assert raw.hgetall(f"{prefix}:layout") == {
                "version": str(SCHEMA_VERSION),
                "strategy": "lease",
            }
            assert raw.get(f"{base}lease:{now}") == "tok"
            assert 0 < raw.pttl(f"{base}lease:{now}") <= 60_000  # the server's TTL is the lease
            assert raw.pttl(f"{base}run:{now}") == -1  # the run record never expires
            run = raw.hgetall(f"{base}run:{now}")
            assert (run["state"], run["attempt"], run["token"], run["1:status"]) == (
                "running",
                "1",
                "tok",
                "running",
            )
            assert await backend.finish(Lease("job", now, 1, "tok"), Status.SUCCESS)
            assert not raw.exists(f"{base}lease:{now}")
            assert raw.hget(f"{base}run:{now}", "1:status") == "success"
            assert raw.smembers(f"{base}open") == set()


async def test_expired_lease_leaves_the_run_record() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix) as backend:
        now = await backend.now_ms()
        claim = await backend.claim(
            ClaimRequest("job", now, Origin.SCHEDULE, "tok", "i", 50, HOUR, False)
        )
        assert claim.outcome == Outcome.WON
        await asyncio.sleep(0.15)
        assert f"{prefix}:{{job}}:lease:{now}" not in keys_of(url, prefix)
        assert [d.slot for d in await backend.due_runs(["job"])] == [now]
        (record,) = await backend.history(HistoryQuery(job="job"))
        assert record.status == Status.RUNNING


async def test_newer_layout_is_refused() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix):
        pass
    with sync_redis.Redis.from_url(url) as raw:
        raw.hset(f"{prefix}:layout", "version", SCHEMA_VERSION + 1)
    try:
        with pytest.raises(SchemaVersionError, match=f"layout version {SCHEMA_VERSION + 1}"):
            async with opened(url=url, prefix=prefix):
                pass
        with sync_redis.Redis.from_url(url) as raw:
            raw.hset(f"{prefix}:layout", "version", "garbage")
        with pytest.raises(BackendError, match="unreadable"):
            async with opened(url=url, prefix=prefix):
                pass
    finally:
        delete_prefix(url, prefix)


async def test_one_prefix_one_strategy() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened("stream-id", url=url, prefix=prefix):
        with pytest.raises(ConfigurationError, match="strategy 'stream-id', not 'lease'"):
            async with opened("lease", url=url, prefix=prefix):
                pass


async def test_settings_that_break_guarantees_are_logged_once_by_a_starting_scheduler(
    own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Without AOF a restart forgets claims: a scheduler says so once at start; opening
    the store for a read (history, the dashboard) says nothing."""
    with sync_redis.Redis.from_url(own_server.url) as raw:
        raw.config_set("appendonly", "no")
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        async with opened(url=own_server.url) as backend:
            assert any("AOF persistence is off" in w for w in backend.setting_warnings)
        assert not [r for r in caplog.records if "AOF" in r.getMessage()]
        scheduler = Scheduler(own_server.url, instance_id="aof-check")
        await scheduler.start()
        await scheduler.stop()
    aof = [r for r in caplog.records if "AOF persistence is off" in r.getMessage()]
    assert len(aof) == 1 and aof[0].levelno == logging.WARNING


async def test_scripts_are_reloaded_after_the_server_forgot_them(own_server: Server) -> None:
    async with opened(url=own_server.url) as backend:
        now = await backend.now_ms()
        lease = Lease("job", now, 1, "tok")
        assert (await backend.claim(request(now, token="tok"))).outcome == Outcome.WON
        with sync_redis.Redis.from_url(own_server.url) as raw:
            raw.script_flush()
            assert await backend.heartbeat([lease], 60_000) == [True]  # pipelined EVALSHA
            raw.script_flush()
            assert await backend.finish(lease, Status.SUCCESS)  # a single EVALSHA


# -- coalesced script calls -----------------------------------------------------------
def round_trips_for(commands: int) -> int:
    return -(-commands // MAX_BATCH)


async def won(backend: RedisBackend, now: int, jobs: list[str]) -> list[Lease]:
    """Claim ``jobs`` at ``now`` in one batch; the leases won."""
    claims = await backend.claim_many([request(now, job=job, token=f"t{job}") for job in jobs])
    assert {claim.outcome for claim in claims} == {Outcome.WON}
    return [Lease(job, now, 1, f"t{job}") for job in jobs]


async def test_concurrent_calls_share_round_trips_and_get_their_own_answers() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix) as backend:
        now = await backend.now_ms()
        jobs = [f"job{i}" for i in range(300)]
        sent = backend.round_trips
        leases = await won(backend, now, jobs)
        # One claim request is one round trip: its scripts and the jobs' index entries.
        assert backend.round_trips - sent == 1
        with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
            assert raw.smembers(f"{prefix}:jobs") == set(jobs)
        assert set(jobs) <= backend._indexed

        # Concurrent heartbeats and finishes coalesce, each answered for its own lease.
        sent = backend.round_trips
        beats = await asyncio.gather(*(backend.heartbeat([lease], 60_000) for lease in leases))
        assert backend.round_trips - sent == round_trips_for(len(jobs))
        assert beats == [[True]] * len(jobs)
        mine = [replace(lease, token="wrong") if i % 2 else lease for i, lease in enumerate(leases)]
        sent = backend.round_trips
        finished = await asyncio.gather(*(backend.finish(lease, Status.SUCCESS) for lease in mine))
        assert backend.round_trips - sent == round_trips_for(len(jobs))
        assert finished == [i % 2 == 0 for i in range(len(jobs))]


async def test_claims_are_not_queued_behind_other_calls() -> None:
    """A claim is a round trip of its own, on a pool connection of its own: a reply
    delayed on the queue's pipeline cannot hold it past its horizon."""
    async with opened() as backend:
        now = await backend.now_ms()
        (lease,) = await won(backend, now, ["held"])
        sent = backend.round_trips
        beat = asyncio.ensure_future(backend.heartbeat([lease], 60_000))
        claims = await asyncio.gather(*(backend.claim(request(now, job=f"c{i}")) for i in range(3)))
        assert [claim.outcome for claim in claims] == [Outcome.WON] * 3
        assert await beat == [True]
        assert backend.round_trips - sent == 4


async def test_calls_leave_and_resume_in_the_order_they_were_made() -> None:
    async with opened() as backend:
        now = await backend.now_ms()
        assert (await backend.claim(request(now, token="tok"))).outcome == Outcome.WON
        lease = Lease("job", now, 1, "tok")
        order: list[str] = []

        async def finish() -> bool:
            done = await backend.finish(lease, Status.SUCCESS)
            order.append("finish")
            return done

        async def heartbeat() -> list[bool]:
            verdicts = await backend.heartbeat([lease], 60_000)
            order.append("heartbeat")
            return verdicts

        sent = backend.round_trips
        # The heartbeat is rejected (the finish ran first), and the finish's caller
        # hears of its success before the heartbeat's caller of the rejection.
        assert await asyncio.gather(finish(), heartbeat()) == [True, [False]]
        assert order == ["finish", "heartbeat"]
        assert backend.round_trips - sent == 1


async def test_a_script_error_fails_only_its_own_caller() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix) as backend:
        now = await backend.now_ms()
        leases = await won(backend, now, ["a", "bad", "b", "c"])
        with sync_redis.Redis.from_url(url) as raw:  # a run key of the wrong type: WRONGTYPE
            raw.delete(f"{prefix}:{{bad}}:run:{now}")
            raw.set(f"{prefix}:{{bad}}:run:{now}", "not a hash")
        sent = backend.round_trips
        results = await asyncio.gather(
            *(backend.finish(lease, Status.SUCCESS) for lease in leases), return_exceptions=True
        )
        assert backend.round_trips - sent == 1
        error = results.pop(1)
        assert isinstance(error, BackendError) and not isinstance(error, BackendUnavailable)
        assert "WRONGTYPE" in str(error)
        assert results == [True] * 3


async def test_a_coalesced_batch_reloads_forgotten_scripts(own_server: Server) -> None:
    async with opened(url=own_server.url, prefix="p") as backend:
        now = await backend.now_ms()
        jobs = [f"job{i}" for i in range(20)]
        leases = await won(backend, now, [*jobs, "bad"])
        with sync_redis.Redis.from_url(own_server.url) as raw:
            raw.delete(f"p:{{bad}}:run:{now}")
            raw.set(f"p:{{bad}}:run:{now}", "not a hash")
            raw.script_flush()
        sent = backend.round_trips
        results = await asyncio.gather(
            *(backend.finish(lease, Status.SUCCESS) for lease in leases), return_exceptions=True
        )
        assert backend.round_trips - sent == 2  # NOSCRIPT, then the load and the calls again
        assert results[:-1] == [True] * 20
        assert isinstance(results[-1], BackendError) and "WRONGTYPE" in str(results[-1])
        assert (await backend.claim(request(now, job="job0"))).outcome == Outcome.TAKEN


async def test_a_cancelled_caller_stops_waiting_alone() -> None:
    async with opened() as backend:
        now = await backend.now_ms()
        tasks = [asyncio.create_task(backend.claim(request(now, job=f"j{i}"))) for i in range(5)]
        await asyncio.sleep(0)  # each call is queued; the batch has not left yet
        tasks[0].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert [claim.outcome for claim in results[1:]] == [Outcome.WON] * 4  # type: ignore[union-attr]


@pytest.mark.parametrize("steps", [1, 2], ids=["queued", "sending"])
async def test_close_fails_calls_in_flight_and_leaves_no_task(steps: int) -> None:
    async with opened() as backend:
        now = await backend.now_ms()
        leases = await won(backend, now, [f"j{i}" for i in range(5)])
        tasks = [asyncio.create_task(backend.heartbeat([lease], 60_000)) for lease in leases]
        for _ in range(steps):  # 1: the calls are queued; 2: the flusher is sending them
            await asyncio.sleep(0)
        flusher = backend._flusher
        assert flusher is not None
        await backend.close()
        assert flusher.done() and backend._flusher is None
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(result, BackendUnavailable) for result in results), results
        with pytest.raises(BackendError, match="not open"):
            await backend.claim(request(now))


async def test_unreachable_server_is_unavailable() -> None:
    backend = RedisBackend(f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=1")
    with pytest.raises(BackendUnavailable):
        await backend.open()
    with pytest.raises(BackendError, match="not open"):
        await backend.now_ms()


async def test_bad_credentials_are_refused_not_retried() -> None:
    url = shared_redis_url().replace("redis://", "redis://nobody:s3cret@", 1)
    backend = RedisBackend(with_params(url, prefix=fresh_prefix()))
    with pytest.raises(BackendError) as err:
        await backend.open()
    assert not isinstance(err.value, BackendUnavailable)  # waiting will not mend it
    assert "s3cret" not in str(err.value) and "***" in str(err.value)
    scheduler = Scheduler(with_params(url, prefix=fresh_prefix()))
    scheduler.every("job", "1s", lambda ctx: None)
    with pytest.raises(BackendError):
        await scheduler.start()
    assert not scheduler.running


async def test_definition_keys() -> None:
    """Each definition beside its job's keys, the counter and the log one key each; a
    claim naming a version is still one round trip."""
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix) as backend:
        v1 = await backend.write_definition("job", '{"a": 1}', expected=0)
        v2 = await backend.write_definition("job", None, expected=v1)
        v3 = await backend.write_definition("other", "{}", expected=None)
        assert (v1, v2, v3) == (1, 2, 3)
        base = f"{prefix}:{{job}}:"
        assert keys_of(url, prefix) == {
            f"{prefix}:layout",
            f"{prefix}:definitions:version",
            f"{prefix}:definitions:log",
            f"{base}definition",
            f"{prefix}:{{other}}:definition",
        }
        with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
            assert raw.hgetall(f"{base}definition") == {"version": "2"}  # a tombstone
            assert raw.hgetall(f"{prefix}:{{other}}:definition") == {"version": "3", "body": "{}"}
            assert raw.get(f"{prefix}:definitions:version") == "3"
            assert raw.zrange(f"{prefix}:definitions:log", 0, -1, withscores=True) == [
                ("job", 2.0),
                ("other", 3.0),
            ]
        now = await backend.now_ms()
        before = backend.round_trips
        assert (await backend.claim(request(now, job="other", version=v3))).outcome == "won"
        assert (await backend.claim(request(now, job="job", version=v1))).outcome == "stale"
        assert backend.round_trips == before + 2
        assert await backend.history(HistoryQuery(job="job")) == []


@pytest.mark.parametrize("url", ["redis", "valkey"])
async def test_definitions_of_odd_job_names(url: str) -> None:
    """``definitions_since`` builds each job's key from the log in the script."""
    async with opened(url=shared_redis_url() if url == "redis" else valkey_url()) as backend:
        versions = [await backend.write_definition(n, f'"{n}"', expected=0) for n in ODD_NAMES]
        assert await backend.definitions_since(0) == [
            StoredDefinition(name, version, f'"{name}"')
            for name, version in zip(ODD_NAMES, versions, strict=True)
        ]
        now = await backend.now_ms()
        for name, version in zip(ODD_NAMES, versions, strict=True):
            claim = await backend.claim(request(now, job=name, version=version))
            assert claim.outcome == Outcome.WON


async def test_operations_keys() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened(url=url, prefix=prefix) as backend:
        slot = await backend.trigger("job", "me")
        base = f"{prefix}:{{job}}:"
        with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
            run = raw.hgetall(f"{base}run:{slot}")
            assert (run["state"], run["origin"], run["requested_by"]) == ("pending", "manual", "me")
            assert raw.smembers(f"{base}open") == {str(slot)}
            assert raw.zcard(f"{base}slots") == 0  # no history record yet
            await backend.set_paused("job", True)
            assert raw.hget(f"{base}job", "paused") == "1"
            assert await backend.paused_jobs() == {"job"}


@pytest.mark.parametrize("strategy", CLAIM_ONLY)
async def test_claim_only_strategies_keep_the_instance_registry(strategy: str) -> None:
    async with opened(strategy) as backend:
        info = InstanceInfo("a:1:000000", "a", 1, "0.1.0", 1, 0, {"job": "0f3a9c1e5b7d2a64"})
        before = await backend.now_ms()
        await backend.register(info, 60_000)
        await backend.register(replace(info, instance_id="b:1:000000"), 1)
        await asyncio.sleep(0.02)
        (live,) = await backend.instances()
        assert live == replace(info, last_seen=live.last_seen) and live.last_seen >= before
        await backend.unregister("a:1:000000")
        assert await backend.instances() == []


async def test_script_strategy_pauses() -> None:
    async with opened("script") as backend:
        now = await backend.now_ms()
        await backend.set_paused("job", True)
        assert await backend.paused_jobs() == {"job"}
        assert (await backend.claim(request(now))).outcome == Outcome.PAUSED
        assert (await backend.claim(request(now))).outcome == Outcome.TAKEN
        await backend.set_paused("job", False)
        assert (await backend.claim(request(now + 1))).outcome == Outcome.WON
        assert [(r.attempt, r.status) for r in await backend.history(HistoryQuery())] == [
            (1, Status.CLAIMED),
            (0, Status.PAUSED),
        ]


async def test_prune_works_in_batches() -> None:
    async with opened() as backend:
        now = await backend.now_ms()
        leases = [Lease("job", now - 1000 * k, 1, f"t{k}") for k in range(1, 1200)]
        for lease in leases:
            assert (await backend.claim(request(lease.slot, token=lease.token))).outcome == "won"
        await asyncio.gather(*(backend.finish(lease, Status.SUCCESS) for lease in leases))
        assert await backend.prune(now) == len(leases) - 1  # the latest record stays
        (kept,) = await backend.history(HistoryQuery())
        assert kept.slot == now - 1000


# -- odd names and prefixes ----------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["lease", *CLAIM_ONLY])
async def test_odd_job_names_are_stored_safely(strategy: str) -> None:
    async with opened(strategy) as backend:
        now = await backend.now_ms()
        for name in ODD_NAMES:
            assert (await backend.claim(request(now, job=name, token=name))).outcome == "won"
            assert (await backend.claim(request(now, job=name))).outcome == "taken"
        for name in ODD_NAMES:
            (record,) = await backend.history(HistoryQuery(job=name))
            assert (record.job, record.slot) == (name, now)
        everything = await backend.history(HistoryQuery())
        assert sorted(r.job for r in everything) == sorted(ODD_NAMES)


async def test_odd_prefix_is_stored_safely() -> None:
    url = shared_redis_url()
    prefix = "it's a \"test\" *%s:'; DROP TABLE x; --"
    bystander = "it's a \"test\" *%s:'; DROP TABLE x; -- NOT"
    async with opened(url=url, prefix=bystander) as other:
        await other.claim(request(await other.now_ms()))
        async with opened(url=url, prefix=prefix) as backend:
            now = await backend.now_ms()
            assert (await backend.claim(request(now))).outcome == Outcome.WON
            assert [r.slot for r in await backend.history(HistoryQuery())] == [now]
            assert keys_of(url, prefix) and all(
                k.startswith(prefix + ":") for k in keys_of(url, prefix)
            )
        assert keys_of(url, prefix) == set()  # cleaned up, and the bystander untouched
        assert len(await other.history(HistoryQuery())) == 1


# -- claim-only strategies -------------------------------------------------------------------
@pytest.mark.parametrize("strategy", CLAIM_ONLY)
async def test_claim_only_claims(strategy: str) -> None:
    async with opened(strategy) as backend:
        now = await backend.now_ms()
        first = request(now - 1000)
        won = await backend.claim(first)
        assert (won.outcome, won.attempt) == (Outcome.WON, 1)
        assert (await backend.claim(request(now - 1000))).outcome == Outcome.TAKEN
        assert (await backend.claim(first)).outcome == Outcome.WON  # the same token: mine
        assert (await backend.claim(request(now - 10_000, horizon_ms=5000))).outcome == "expired"
        assert (await backend.claim(request(now + 10_000))).outcome == Outcome.EARLY
        (record,) = await backend.history(HistoryQuery())
        assert (record.slot, record.attempt, record.status) == (now - 1000, 1, Status.CLAIMED)
        assert record.claimed_at is not None and abs(record.claimed_at - now) < 5000
        assert await backend.history(HistoryQuery(status=Status.SUCCESS)) == []
        lease = Lease("job", now - 1000, 1, first.token)
        if strategy == "script":
            assert not await backend.finish(Lease("job", now - 1000, 1, "stale"), Status.FAILED)
            assert await backend.finish(lease, Status.SUCCESS)
            assert await backend.finish(lease, Status.SUCCESS)
            (record,) = await backend.history(HistoryQuery(status=Status.SUCCESS))
            assert record.finished_at is not None
        else:
            with pytest.raises(CapabilityError, match="claim-only"):
                await backend.finish(lease, Status.SUCCESS)
        assert (await backend.claim(request(now))).outcome == Outcome.WON
        assert await backend.prune(now + 1) == 1
        assert [r.slot for r in await backend.history(HistoryQuery())] == [now]


async def test_stream_id_refuses_a_slot_older_than_a_claimed_one() -> None:
    """That slot is abandoned, not taken (nobody runs it): answered ``expired``, as a slot
    past its horizon is, whereas a claimed slot stays ``taken`` and its repeat ``won``."""
    async with opened("stream-id") as backend:
        now = await backend.now_ms()
        assert (await backend.claim(request(now - 2000, token="t1"))).outcome == Outcome.WON
        assert (await backend.claim(request(now))).outcome == Outcome.WON
        older = await backend.claim(request(now - 1000))
        assert (older.outcome, older.attempt) == (Outcome.EXPIRED, 0)
        assert older.store_now is not None and abs(older.store_now - now) < 5000
        assert (await backend.claim(request(now - 1000))).outcome == Outcome.EXPIRED
        assert (await backend.claim(request(now - 2000))).outcome == Outcome.TAKEN
        assert (await backend.claim(request(now))).outcome == Outcome.TAKEN
        again = await backend.claim(request(now - 2000, token="t1"))
        assert (again.outcome, again.attempt) == (Outcome.WON, 1)
        assert [r.slot for r in await backend.history(HistoryQuery())] == [now, now - 2000]


async def test_stream_id_entry_kept_as_early_is_won_by_the_same_token_at_the_slot() -> None:
    """A claim-only store may keep an early claim's entry: the engine claims the slot
    again with the same token, which wins; every other claim of the slot is taken."""
    url, prefix = shared_redis_url(), fresh_prefix()
    async with (
        opened("stream-id", url=url, prefix=prefix) as backend,
        opened("stream-id", url=url, prefix=prefix) as other,
    ):
        now = await backend.now_ms()
        backend._skew_ms += 500  # type: ignore[attr-defined]  # its estimate runs ahead
        slot = now + 1300  # passes the estimate's check, is early by the server's TIME
        assert (await backend.claim(request(slot, token="t1"))).outcome == Outcome.EARLY
        assert (await other.claim(request(slot))).outcome == Outcome.EARLY
        await asyncio.sleep(1.5)
        assert (await other.claim(request(slot))).outcome == Outcome.TAKEN
        at_slot = await backend.claim(request(slot, token="t1"))
        assert (at_slot.outcome, at_slot.attempt) == (Outcome.WON, 1)
        assert (await backend.claim(request(slot, token="t3"))).outcome == Outcome.TAKEN
        assert [r.slot for r in await backend.history(HistoryQuery())] == [slot]


async def test_an_abandoned_stream_id_slot_is_logged_and_counted_as_expired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the engine: another writer added an entry newer than the next slot."""
    caplog.set_level(logging.INFO, logger="anarchon")
    url, prefix = shared_redis_url(), fresh_prefix()
    while time.time() % 1 > 0.3:  # the next second boundary is the engine's first slot
        await asyncio.sleep(0.02)
    first = (int(time.time()) + 1) * 1000
    with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
        raw.xadd(f"{prefix}:{{job}}:stream", {"token": "other"}, id=f"{first + 1000}-0")
    ran: list[int] = []
    scheduler = Scheduler(
        with_params(url, strategy="stream-id", prefix=prefix), instance_id="solo", jitter_ms=0
    )
    scheduler.every("job", "1s", lambda ctx: ran.append(ctx.slot))
    try:
        await scheduler.start()
        while not ran and time.time() * 1000 < first + 4000:
            await asyncio.sleep(0.05)
    finally:
        await scheduler.stop()
        delete_prefix(url, prefix)
    stats = scheduler.stats
    # first: abandoned (no entry, a newer one exists); first + 1 s: another's; then ours.
    assert (stats.get("claim_expired"), stats.get("claim_taken")) == (1, 1), stats
    assert ran == [first + 2000]
    assert "slot abandoned" in caplog.text


@pytest.mark.parametrize("strategy", ["lease", *CLAIM_ONLY])
async def test_a_lost_claim_reply_is_recognised_on_repeat(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after the claim was applied: the repeat must say WON."""
    execute = Pipeline.execute
    dropped: list[bool] = []

    async def drop_reply(self: Pipeline, raise_on_error: bool = True) -> list[Any]:
        await execute(self, raise_on_error)
        dropped.append(True)
        raise RedisConnectionError("connection lost (simulated)")

    async with opened(strategy) as backend:
        now = await backend.now_ms()
        claim = request(now)
        monkeypatch.setattr(Pipeline, "execute", drop_reply)  # a job's first claim pipelines
        with pytest.raises(BackendUnavailable, match="simulated"):
            await backend.claim(claim)
        monkeypatch.setattr(Pipeline, "execute", execute)
        assert dropped
        assert (await backend.claim(request(now))).outcome == Outcome.TAKEN
        again = await backend.claim(claim)
        assert (again.outcome, again.attempt) == (Outcome.WON, 1)
        assert len(await backend.history(HistoryQuery())) == 1


async def test_idmp_is_refused_on_older_servers() -> None:
    for url, server in ((shared_redis_url(), "Redis 7."), (valkey_url(), "Valkey 8.")):
        with pytest.raises(CapabilityError) as err:
            async with opened("idmp", url=url):
                pass
        message = str(err.value)
        assert server in message and "Redis >= 8.6" in message
        assert all(s in message for s in ("lease", "stream-id", "script"))


# -- history pages -------------------------------------------------------------------------
async def test_a_page_is_full_though_the_cursor_splits_a_run() -> None:
    """The script stops at ``limit`` records: those of the cursor's slot after it do not count.

    It reads slots a hundred at a time, so the split run must be on the first of more
    than a hundred: were its three attempts counted, that read would end the page short.
    """
    async with opened() as backend:
        now = await backend.now_ms()
        token = "t1"
        assert (await backend.claim(request(now, token=token))).outcome == Outcome.WON
        for attempt in (1, 2):  # handed over at once: attempts 2 and 3
            assert await backend.release(Lease("job", now, attempt, token))
            token = f"t{attempt + 1}"
            taken = await backend.take_over(takeover_request(now, attempt, job="job", token=token))
            assert (taken.outcome, taken.attempt) == (Outcome.WON, attempt + 1)
        for k in range(1, 151):
            assert (await backend.claim(request(now - 1000 * k))).outcome == Outcome.WON
        query = HistoryQuery(job="job", limit=101, before=(now, "job", 1))
        page = await backend.history(query)
        assert [r.slot for r in page] == [now - 1000 * k for k in range(1, 102)]
        page = await backend.history(replace(query, before=(now, "job", 3)))
        assert [(r.slot, r.attempt) for r in page[:3]] == [(now, 2), (now, 1), (now - 1000, 1)]
        assert len(page) == 101


@pytest.mark.parametrize("strategy", CLAIM_ONLY)
async def test_claim_only_history_pages_with_a_cursor(strategy: str) -> None:
    async with opened(strategy) as backend:
        now = await backend.now_ms()
        for k in range(8, 0, -1):  # oldest first: stream-id takes only newer slots
            for job in ("a", "b", "c")[: 1 + k % 3]:
                assert (await backend.claim(request(now - 1000 * k, job=job))).outcome == "won"
        if strategy == "script":
            await backend.finish(Lease("b", now - 2000, 1, "x"), Status.SUCCESS)
        for query in (HistoryQuery(), HistoryQuery(job="b"), HistoryQuery(since=now - 5000)):
            whole = await backend.history(replace(query, limit=1000))
            assert len(whole) >= 4
            for limit in (1, 2, 3):
                pages = await history_pages(backend, replace(query, limit=limit))
                assert [r for page in pages for r in page] == whole, (query, limit)


async def test_idmp_history_reads_on_until_no_older_entry_can_belong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entries arrive out of slot order (catch-up): COUNT-bounded reads still page exactly.

    No Redis >= 8.6 is available, so the stream is written by hand in the layout
    ``XADD … IDMP`` makes (arrival-time ids, the slot in a field); only reads are run.
    """
    monkeypatch.setattr(RedisIdmpBackend, "_check_server", RedisBackend._check_server)
    url, prefix = shared_redis_url(), fresh_prefix()
    async with opened("idmp", url=url, prefix=prefix) as backend:
        command = backend._history_command("a", HistoryQuery(limit=5))  # type: ignore[attr-defined]
        assert command[-2:] == ["COUNT", 6]
        base = await backend.now_ms() - 100_000
        arrivals = {}  # (job, slot) -> arrival ms
        for k in range(40):
            for job in ("a", "b"):
                arrivals[(job, base + 1000 * k)] = base + 1000 * k + 5 + (job == "b")
        for k in range(20, 30):  # a's catch-up of slots 20-29 arrives after every other one
            arrivals[("a", base + 1000 * k)] = base + 60_000 + k
        with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
            raw.sadd(f"{prefix}:jobs", "a", "b")
            for (job, slot), arrival in sorted(arrivals.items(), key=lambda item: item[1]):
                fields = {"slot": slot, "token": "t", "instance": "i", "origin": "schedule"}
                raw.xadd(f"{prefix}:{{{job}}}:stream", fields, id=f"{arrival}-0")
        expected = sorted(((slot, job, 1) for job, slot in arrivals), reverse=True)
        everything = await backend.history(HistoryQuery(limit=1000))
        assert [(r.slot, r.job, r.attempt) for r in everything] == expected
        for query in (HistoryQuery(), HistoryQuery(job="a"), HistoryQuery(since=base + 25_000)):
            whole = await backend.history(replace(query, limit=1000))
            for limit in (1, 2, 3, 7):
                pages = await history_pages(backend, replace(query, limit=limit))
                assert [r for page in pages for r in page] == whole, (query, limit)


async def test_idmp_refusal_surfaces_at_scheduler_start() -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    scheduler = Scheduler(with_params(url, strategy="idmp", prefix=prefix))
    scheduler.every("job", "1s", lambda ctx: None)
    try:
        with pytest.raises(CapabilityError, match=r"Redis >= 8\.6"):
            await scheduler.start()
    finally:
        await scheduler.stop(grace_ms=0)
        delete_prefix(url, prefix)


# -- resilience: dropped connections and a restarted server ------------------------------------
class Runs:
    """Two instances of one job on one store; records every handler start."""

    def __init__(self, url: str, interval_ms: int, **options: Any) -> None:
        self.interval_ms = interval_ms
        self.ran: list[tuple[int, str]] = []
        self.schedulers = [
            # The lease (3 s) outlives the outages below, so a run in flight keeps it and
            # records its outcome once the store is back; a longer outage would end it
            # interrupted by a backup (see docs/backends/redis.md).
            Scheduler(url, instance_id=f"inst-{n}", heartbeat_ms=1000, **options)
            for n in range(2)
        ]
        for scheduler in self.schedulers:
            scheduler.every("tick", f"{interval_ms}ms", self.handler)

    async def handler(self, ctx: RunContext) -> None:
        self.ran.append((ctx.slot, ctx.instance_id))
        await asyncio.sleep(0.02)

    async def start(self) -> int:
        for scheduler in self.schedulers:
            await scheduler.start()
        return wall_ms()

    async def stop(self) -> None:
        for scheduler in self.schedulers:
            await scheduler.stop()

    def check(self, started: int, until: int, skipped: Collection[int] = ()) -> list[int]:
        """No slot ran twice and none in (started, until] was missed; the slots that ran.

        ``skipped`` slots were recorded ``skipped`` (overlap) and need not have run.
        """
        counts = Counter(slot for slot, _ in self.ran)
        assert not {s: n for s, n in counts.items() if n > 1}, "a slot ran twice"
        assert not set(skipped) & set(counts), "a slot recorded skipped also ran"
        first = started // self.interval_ms + 1
        expected = [k * self.interval_ms for k in range(first, until // self.interval_ms + 1)]
        assert len(expected) >= 5
        missing = [s for s in expected if s not in counts and s not in skipped]
        assert not missing, f"slots never ran: {missing}"
        return sorted(counts)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def assert_recorded_once(records: list[Any], ran: list[int], strategy: str, *, before: int) -> None:
    """Exactly one history record per slot that ran, with its outcome where stored.

    Slots from ``before`` on are left out: a claim the stop cancels after the store
    applied it stays recorded, unrun (claim-only) or for a backup to continue (lease).
    """
    records = [r for r in records if r.slot < before and r.status != Status.SKIPPED]
    assert sorted(r.slot for r in records) == [slot for slot in ran if slot < before]
    statuses = {r.status for r in records}
    expected = {"lease": Status.SUCCESS, "script": Status.SUCCESS, "stream-id": Status.CLAIMED}
    assert statuses == {expected[strategy]}


@pytest.mark.parametrize("strategy", ["lease", *CLAIM_ONLY])
async def test_client_kill_mid_run_loses_and_duplicates_nothing(
    strategy: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, prefix = shared_redis_url(), fresh_prefix()
    name = f"anarchon-kill-{secrets.token_hex(4)}"
    runs = Runs(with_params(url, strategy=strategy, prefix=prefix, client_name=name), 250)
    killed = 0

    async def killer() -> None:
        nonlocal killed
        with sync_redis.Redis.from_url(url, decode_responses=True) as raw:
            while True:
                await asyncio.sleep(0.12)
                for client in raw.client_list():
                    if client["name"] == name:
                        killed += raw.client_kill_filter(_id=client["id"])

    caplog.set_level(logging.WARNING, logger="anarchon")
    try:
        started = await runs.start()
        task = asyncio.ensure_future(killer())
        await asyncio.sleep(3.0)
        task.cancel()
        until = wall_ms() - 400
        await asyncio.sleep(0.3)
        await runs.stop()
        async with opened(strategy, url=url, prefix=prefix) as reader:
            records = await reader.history(HistoryQuery(limit=1000))
    finally:
        await runs.stop()
        delete_prefix(url, prefix)
    assert killed >= 10
    ran = runs.check(started, until, {r.slot for r in records if r.status == Status.SKIPPED})
    assert_recorded_once(records, ran, strategy, before=until)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("strategy", ["lease", *CLAIM_ONLY])
async def test_server_restart_mid_run_loses_and_duplicates_nothing(
    strategy: str, own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    url = with_params(own_server.url, strategy=strategy, socket_connect_timeout="0.5")
    runs = Runs(url, 300)
    caplog.set_level(logging.WARNING, logger="anarchon")
    try:
        await runs.start()
        await asyncio.sleep(1.5)
        before = await runs.schedulers[0].backend.history(HistoryQuery(limit=1000))
        await asyncio.to_thread(own_server.kill)  # a crash: nothing is flushed on the way out
        await asyncio.sleep(1.0)
        await asyncio.to_thread(own_server.start)  # same port and directory: replays the AOF
        restarted = wall_ms()  # the servers run on this host: its clock is theirs
        await asyncio.sleep(2.0)
        until = wall_ms() - 300
        await runs.stop()
        records = await read_history(own_server.url, strategy)
    finally:
        await runs.stop()
    assert before and {(r.slot, r.attempt) for r in before} <= {
        (r.slot, r.attempt) for r in records
    }, "a recorded run was lost in the restart"
    counts = Counter(slot for slot, _ in runs.ran)
    assert max(counts.values()) == 1, "a slot ran twice"
    assert any(slot > restarted for slot in counts), "runs did not resume after the restart"
    # A run whose finish failed in the outage keeps its live lease until the finish,
    # retried with backoff, lands after the restart: slots due meanwhile are skipped
    # (overlap), which is the protocol. A claim still backing off may miss one slot.
    skipped = {r.slot for r in records if r.status == Status.SKIPPED}
    runs.check(restarted + 300, restarted + 1800, skipped)
    assert_recorded_once(records, sorted(counts), strategy, before=until)
    assert any("retrying" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def read_history(url: str, strategy: str) -> list[Any]:
    backend = RedisBackend(url, strategy=strategy)
    await backend.open()
    try:
        return await backend.history(HistoryQuery(limit=1000))
    finally:
        await backend.close()


def test_the_skipped_reason_is_worded_as_the_core_words_it() -> None:
    from anarchon_core.backends.redis._lua import _HELPERS

    slots = [0, -1500, 1764952800123, -58_000_000_000_000, 253_370_764_799_999, 999]
    script = _HELPERS + "\nreturn overlap_reason(tonumber(ARGV[1]))"
    client = sync_redis.Redis.from_url(shared_redis_url())
    try:
        worded = [client.eval(script, 0, slot).decode() for slot in slots]
    finally:
        client.close()
    assert worded == [overlap_reason(slot) for slot in slots]
