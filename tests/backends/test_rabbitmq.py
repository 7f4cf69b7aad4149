"""What the RabbitMQ backend promises: URLs, queue names, one winner per run under
contention, the claim horizon, queues that expire, the layout marker, clear errors at
start, claim-only refusals, and a scheduler that survives its connections being killed.

Every test uses its own random queue prefix with a one-second expiry margin
(``stores_rabbitmq``), so tests are independent and every queue they create expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiormq.exceptions
import pytest
from claim_processes import claim_from_processes, opened, run_through_outage
from claim_requests import claim_only_request, now_ms
from stores_rabbitmq import (
    RABBITMQ_URL,
    RabbitServer,
    close_connections,
    delete_markers,
    fresh_prefix,
    rabbitmqctl,
    require_rabbitmq,
    url_with,
)

from anarchon_core import Scheduler
from anarchon_core.backend import SCHEMA_VERSION, ClaimRequest, Lease
from anarchon_core.backends import backend_from_url
from anarchon_core.backends import rabbitmq as rabbitmq_backend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.errors import (
    BackendError,
    BackendUnavailable,
    CapabilityError,
    ConfigurationError,
    SchemaVersionError,
)
from anarchon_core.records import HistoryQuery, Outcome, Status

#: Long enough for every test, short enough that the queues expire soon (+ 1 s margin).
HORIZON_MS = 10_000


def request(
    slot: int, token: str | None = None, job: str = "job", horizon_ms: int = HORIZON_MS
) -> ClaimRequest:
    return claim_only_request(slot, token, job, horizon_ms=horizon_ms)


@pytest.fixture
def prefix() -> Iterator[str]:
    require_rabbitmq()
    prefix = fresh_prefix()
    yield prefix
    delete_markers(prefix)


@pytest.fixture
def open_store(prefix: str) -> Callable[..., Any]:
    """``async with open_store(**options) as store``: an open backend on the test's prefix."""

    def make(**params: str) -> AbstractAsyncContextManager[RabbitMQBackend]:
        return opened(RabbitMQBackend(url_with(prefix=prefix, **{"margin": "1s", **params})))

    return make


async def queue_exists(name: str) -> bool:
    """A passive declare: the management-free way to ask whether a queue exists."""
    connection = await aio_pika.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        return True
    finally:
        await connection.close()


# -- URLs and names ------------------------------------------------------------------------
def test_factory_builds_it_from_amqp_and_amqps_urls() -> None:
    store = backend_from_url("amqp://guest:secret@broker:5672/prod?prefix=svc.&margin=2m")
    assert isinstance(store, RabbitMQBackend)
    assert store.capabilities.lease is False
    assert store.capabilities.store_clock is False
    assert store.capabilities.finish is False
    assert (store.prefix, store.margin_ms, store.timeout_ms) == ("svc.", 120_000, 5_000)
    assert store.describe() == "amqp://guest:***@broker:5672/prod?prefix=svc.&margin=2m"
    tls = backend_from_url("amqps://u:p@broker/?cafile=/ca.pem&no_verify_ssl=1&heartbeat=5")
    assert "secret" not in tls.describe() and "cafile=%2Fca.pem" in tls.describe()
    assert RabbitMQBackend(prefix="x.", margin_ms=0).queue_expiry_ms(0) == 1000


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("amqp:///", "is not valid"),
        ("amqp://guest:guest@host:99999/", "is not valid"),
        ("amqp://host/a/b", "write '/' inside a vhost name as %2F"),
        ("amqp://host/?prefetch=1", "unknown option 'prefetch'; accepted: prefix"),
        ("amqp://host/?prefix=a.&prefix=b.", "repeats option 'prefix'"),
        ("amqp://host/?prefix=amq.x", "reserved by the broker"),
        ("amqp://host/?prefix=" + "p" * 33, "1-32 characters"),
        ("amqp://host/?prefix=a%20b", "is not valid"),
        ("amqp://host/?margin=5", "a bare number has no unit"),
        ("amqp://host/?timeout=0s", "RabbitMQ URL option timeout"),
        ("amqp://user:hunter2@host/#frag", "is not valid"),
    ],
)
def test_bad_urls_are_refused_with_the_accepted_form(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        backend_from_url(url)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "job",
    ["a", "Z9", "ns:job", "a.b.c", "x-y_z", "a..b", "trailing.", "colons::", "q" * 200],
)
def test_queue_names_are_safe_and_one_to_one(job: str) -> None:
    store = RabbitMQBackend(prefix="p" * 32)
    name = store.queue_name(job, -(10**18))
    assert len(name.encode()) <= 255
    assert name.rsplit("@", 1) == ["p" * 32 + job, str(-(10**18))]
    with pytest.raises(ConfigurationError, match="job name in the store"):
        store.queue_name("bad@name", 1)


# -- the claim --------------------------------------------------------------------------
async def test_exactly_one_winner_under_heavy_contention(open_store: Callable[..., Any]) -> None:
    slot = now_ms() // 1000 * 1000
    jobs = [f"contended.{n}" for n in range(40)]
    async with (
        open_store() as a,
        open_store() as b,
        open_store() as c,
        open_store() as d,
    ):
        claims = [store.claim(request(slot, job=job)) for job in jobs for store in (a, b, c, d) * 5]
        answers = await asyncio.gather(*claims)
    won = Counter(
        job
        for job, answer in zip([j for j in jobs for _ in range(20)], answers, strict=True)
        if answer.outcome == Outcome.WON
    )
    assert won == Counter(jobs), "every run won exactly once"
    assert {a.outcome for a in answers} == {Outcome.WON, Outcome.TAKEN}
    assert all(a.attempt == 1 for a in answers if a.outcome == Outcome.WON)


async def test_odd_but_valid_names_claim_their_own_queue(open_store: Callable[..., Any]) -> None:
    slot = now_ms()
    names = ["a", "a.b", "a:b", "a-b", "a_b", "A.b:c-d_e", "x" * 200, "ns:job.", "0"]
    async with open_store() as store:
        first = [await store.claim(request(slot, job=name)) for name in names]
        again = [await store.claim(request(slot, job=name)) for name in names]
        assert [c.outcome for c in first] == [Outcome.WON] * len(names)
        assert [c.outcome for c in again] == [Outcome.TAKEN] * len(names)
        assert await queue_exists(store.queue_name("A.b:c-d_e", slot))


async def test_a_retry_with_the_same_token_is_not_a_second_win(
    open_store: Callable[..., Any],
) -> None:
    """Ambiguous outcomes are at most once: the message cannot be read back safely."""
    slot = now_ms()
    async with open_store() as store:
        assert (await store.claim(request(slot, token="t1"))).outcome == Outcome.WON
        assert (await store.claim(request(slot, token="t1"))).outcome == Outcome.TAKEN


async def test_horizon_and_early_claims_are_judged_by_the_local_clock(
    open_store: Callable[..., Any],
) -> None:
    now = now_ms()
    async with open_store() as store:
        late = await store.claim(request(now - 5_000, horizon_ms=4_000))
        assert late.outcome == Outcome.EXPIRED
        assert not await queue_exists(store.queue_name("job", now - 5_000)), "nothing sent"
        early = await store.claim(request(now + 60_000))
        assert early.outcome == Outcome.EARLY
        ok = await store.claim(request(now - 3_000, horizon_ms=4_000))
        assert ok.outcome == Outcome.WON
        assert await store.now_ms() >= now


async def test_run_queues_expire_after_horizon_plus_margin(open_store: Callable[..., Any]) -> None:
    """Nothing piles up: the broker deletes each run's queue once it is unused."""
    async with open_store(margin="0s") as store:
        assert store.queue_expiry_ms(300) == 1000
        slot = now_ms()
        assert (await store.claim(request(slot, horizon_ms=300))).outcome == Outcome.WON
        name = store.queue_name("job", slot)
        assert await queue_exists(name)  # a declare, even passive, restarts the expiry
        await asyncio.sleep(1.6)
        assert not await queue_exists(name), "the queue did not expire"


async def test_instances_disagreeing_on_the_horizon_still_get_one_winner(
    open_store: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    slot = now_ms()
    async with open_store() as a, open_store() as b:
        assert (await a.claim(request(slot, horizon_ms=10_000))).outcome == Outcome.WON
        with caplog.at_level(logging.WARNING, "anarchon.backends.rabbitmq"):
            other = await b.claim(request(slot, horizon_ms=20_000))
        assert other.outcome == Outcome.TAKEN
        assert "another x-expires" in caplog.text
        assert (await b.claim(request(slot + 1, horizon_ms=20_000))).outcome == Outcome.WON


# -- batched claims ---------------------------------------------------------------------------
async def test_batches_from_three_stores_have_one_winner_per_run(
    open_store: Callable[..., Any],
) -> None:
    """Three instances send the same 200 runs, each as one ``claim_many``, at once."""
    slot = now_ms()
    jobs = [f"batch.{n}" for n in range(200)]
    async with open_store() as a, open_store() as b, open_store() as c:
        batches = await asyncio.gather(
            *(s.claim_many([request(slot, job=job) for job in jobs]) for s in (a, b, c))
        )
    won = Counter(
        job
        for answers in batches
        for job, answer in zip(jobs, answers, strict=True)
        if answer.outcome == Outcome.WON
    )
    assert won == Counter(jobs), "every run won exactly once"
    assert {x.outcome for answers in batches for x in answers} == {Outcome.WON, Outcome.TAKEN}


async def test_a_failed_batch_retried_with_its_tokens_keeps_its_confirmed_wins(
    open_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim of a batch fails: the batch fails as a whole; its retry with the same
    tokens answers won for the claims that were confirmed, taken for the one whose
    confirm was lost (at most once) and for the runs another instance holds."""
    slot = now_ms()
    jobs = [f"retry.{n}" for n in range(30)]
    mine = [request(slot, job=job) for job in jobs]
    async with open_store() as a, open_store() as b:
        theirs = await b.claim_many([request(slot, job=job) for job in jobs[:5]])
        assert {c.outcome for c in theirs} == {Outcome.WON}
        publish_batch = a._publish_batch

        async def lossy(claims: list[tuple[str, bytes]]) -> list[Any]:
            results = await publish_batch(claims)
            results[10] = ConnectionError("the confirm was lost")  # it was confirmed
            return results

        monkeypatch.setattr(a, "_publish_batch", lossy)
        with pytest.raises(BackendUnavailable, match="1 of 30 claims"):
            await a.claim_many(mine)
        monkeypatch.undo()
        again = await a.claim_many(mine)
        expected = [Outcome.TAKEN] * 5 + [Outcome.WON] * 25
        expected[10] = Outcome.TAKEN  # the lost confirm: nobody runs it
        assert [c.outcome for c in again] == expected
        others = await b.claim_many([request(slot, job=job) for job in jobs])
        assert {c.outcome for c in others} == {Outcome.TAKEN}, "never a second winner"
        # A plain repeat of a single claim answered before stays taken (at most once).
        assert (await a.claim(request(slot, token="t1", job="single"))).outcome == Outcome.WON
        assert (await a.claim(request(slot, token="t1", job="single"))).outcome == Outcome.TAKEN


async def test_a_batch_declares_past_a_queue_with_another_expiry(
    open_store: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A refused declare closes the batch's declare channel: the queues after it are
    declared again, the refused one is claimed as it is; every run is still decided."""
    slot = now_ms()
    jobs = [f"expiry.{n}" for n in range(12)]
    async with open_store() as a, open_store() as b:
        held = request(slot, job=jobs[6], horizon_ms=10_000)
        assert (await a.claim(held)).outcome == Outcome.WON
        with caplog.at_level(logging.WARNING, "anarchon.backends.rabbitmq"):
            answers = await b.claim_many([request(slot, job=j, horizon_ms=20_000) for j in jobs])
        assert "another x-expires" in caplog.text
        assert [c.outcome for c in answers] == [Outcome.WON] * 6 + [Outcome.TAKEN] + [
            Outcome.WON
        ] * 5
        again = await b.claim_many([request(slot, job=j, horizon_ms=20_000) for j in jobs])
        assert {c.outcome for c in again} == {Outcome.TAKEN}
        assert (await b.claim(request(slot + 1, horizon_ms=20_000))).outcome == Outcome.WON


async def test_a_batch_keeps_at_most_max_in_flight_claims_unconfirmed(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rabbitmq_backend, "MAX_IN_FLIGHT", 8)
    publish, flying, peak = rabbitmq_backend._publish, [0], [0]

    async def counting(*args: Any) -> bool:
        flying[0] += 1
        peak[0] = max(peak[0], flying[0])
        try:
            return await publish(*args)
        finally:
            flying[0] -= 1

    monkeypatch.setattr(rabbitmq_backend, "_publish", counting)
    slot = now_ms()
    store = RabbitMQBackend(url_with(prefix=prefix, margin="1s"))
    async with opened(store):
        answers = await store.claim_many([request(slot, job=f"w.{n}") for n in range(60)])
        assert [c.outcome for c in answers] == [Outcome.WON] * 60
        repeat = await store.claim_many([request(slot, job=f"w.{n}") for n in range(60)])
        assert [c.outcome for c in repeat] == [Outcome.TAKEN] * 60
    assert peak[0] == 8, "pipelined, and never more than MAX_IN_FLIGHT unconfirmed"


async def test_history_is_empty_and_lease_operations_are_refused(
    open_store: Callable[..., Any],
) -> None:
    async with open_store() as store:
        await store.claim(request(now_ms()))
        assert await store.history(HistoryQuery()) == []
        assert await store.prune(now_ms()) == 0
        with pytest.raises(CapabilityError, match="rabbitmq is a claim-only backend"):
            await store.finish(Lease("job", 1, 1, "t"), Status.SUCCESS)


def test_exactly_one_winner_across_processes(prefix: str) -> None:
    """Four processes, each with its own connection, claim the same 300 runs at once."""
    jobs = [f"mp.{n}" for n in range(300)]
    url = url_with(prefix=prefix, margin="1s")
    won = claim_from_processes(url, jobs, processes=4, horizon_ms=HORIZON_MS)
    assert won == Counter(jobs), "every run won exactly once"


# -- start: layout, errors ------------------------------------------------------------------
async def test_layout_marker_is_recorded_and_a_newer_one_refused(
    open_store: Callable[..., Any], prefix: str
) -> None:
    async with open_store():
        pass
    connection = await aio_pika.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        await channel.declare_exchange(f"{prefix}layout.v{SCHEMA_VERSION}", passive=True)
        await channel.declare_exchange(
            f"{prefix}layout.v{SCHEMA_VERSION + 1}", aio_pika.ExchangeType.FANOUT, durable=True
        )
    finally:
        await connection.close()
    store = RabbitMQBackend(url_with(prefix=prefix))
    with pytest.raises(SchemaVersionError, match="upgrade it"):
        await store.open()
    await store.close()


async def test_wrong_credentials_are_a_clear_error_at_open() -> None:
    require_rabbitmq()
    store = backend_from_url("amqp://guest:wrong-pass@127.0.0.1:5672/")
    with pytest.raises(BackendError, match="refused the credentials of user 'guest'") as info:
        await store.open()
    assert "wrong-pass" not in str(info.value) and "guest:***@" in str(info.value)
    await store.close()


async def test_unknown_vhost_is_a_clear_error_at_open() -> None:
    require_rabbitmq()
    store = backend_from_url("amqp://guest:guest@127.0.0.1:5672/no-such-vhost")
    with pytest.raises(BackendError, match="virtual host 'no-such-vhost'"):
        await store.open()


async def test_unreachable_broker_is_unavailable_at_open() -> None:
    with socket_closed_port() as port:
        store = backend_from_url(f"amqp://guest:guest@127.0.0.1:{port}/?timeout=2s")
        with pytest.raises(BackendUnavailable, match="cannot be reached"):
            await store.open()
        with pytest.raises(BackendUnavailable):
            await store.claim(request(now_ms()))


async def test_missing_permissions_are_named(prefix: str) -> None:
    """A user may claim under a prefix with 'configure' on it and 'write' on amq.default."""
    binary = rabbitmqctl()
    user = f"anarchon-t-{secrets.token_hex(4)}"
    loop = asyncio.get_running_loop()

    def ctl(*args: str) -> None:
        subprocess.run([binary, "-q", *args], check=True, capture_output=True, timeout=30)

    await loop.run_in_executor(None, ctl, "add_user", user, "pw")
    try:
        allowed = "^" + re.escape(prefix)
        await loop.run_in_executor(
            None, ctl, "set_permissions", "-p", "/", user, allowed, "^amq\\.default$", ""
        )
        base = urlsplit(RABBITMQ_URL)._replace(
            netloc=f"{user}:pw@{urlsplit(RABBITMQ_URL).netloc.rsplit('@', 1)[-1]}"
        )
        store = RabbitMQBackend(url_with(base.geturl(), prefix=prefix, margin="1s"))
        async with opened(store):
            assert (await store.claim(request(now_ms()))).outcome == Outcome.WON
        other = RabbitMQBackend(url_with(base.geturl(), prefix="anarchon-elsewhere."))
        with pytest.raises(BackendError, match="needs 'configure' permission on names starting"):
            await other.open()
    finally:
        await loop.run_in_executor(None, ctl, "delete_user", user)


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]  # bound but not listening: connections are refused


# -- the scheduler on RabbitMQ --------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"catch_up": "latest"}, "catch_up='latest' needs a lease backend"),
        ({"overlap": "skip"}, "overlap='skip' needs a lease backend"),
        ({"max_attempts": 3}, "max_attempts=3 allows takeovers"),
    ],
)
async def test_lease_only_options_are_refused(
    prefix: str, options: dict[str, Any], message: str
) -> None:
    scheduler = Scheduler(url_with(prefix=prefix, margin="1s"))
    scheduler.every("job", "1h", lambda ctx: None, **options)
    with pytest.raises(CapabilityError, match=message) as info:
        await scheduler.start()
    assert "amqp://guest:***@" in str(info.value) and "is claim-only" in str(info.value)
    assert "sqlite://, postgresql://, redis://?strategy=lease" in str(info.value)


class Proxy:
    """A TCP proxy to the broker that can cut every connection and refuse new ones."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.server: asyncio.Server | None = None
        self.port = 0
        self.pipes: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self, down_s: float) -> None:
        """Drop every connection, refuse connections for ``down_s``, then accept again."""
        assert self.server is not None
        self.server.close()
        for writer in list(self.pipes):
            writer.transport.abort()
        # From Python 3.12.1 on, wait_closed() also waits for the server's connections.
        await self.server.wait_closed()
        await asyncio.sleep(down_s)
        await self.start()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.pipes):
            writer.transport.abort()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self.pipes |= {writer, up_writer}
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pipe(src, dst))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.pipes.discard(dst)
            dst.transport.abort()


async def test_scheduler_survives_connections_killed_by_the_broker(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    rabbitmqctl()  # skips (fails under CI) unless it can be used
    name = f"anarchon-test-{secrets.token_hex(4)}"
    url = url_with(prefix=prefix, margin="1s", name=name)

    async def kill() -> None:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, close_connections, name) == 3

    await run_through_outage(url, kill, caplog)
    assert caplog.text.count("reconnected to RabbitMQ") >= 3


async def test_scheduler_survives_an_unreachable_broker_and_reconnects(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = Proxy(urlsplit(RABBITMQ_URL).port or 5672)
    await proxy.start()
    try:
        parts = urlsplit(RABBITMQ_URL)
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
        url = url_with(parts._replace(netloc=netloc).geturl(), prefix=prefix, margin="1s")
        runs = await run_through_outage(url, lambda: proxy.cut(1.0), caplog)
    finally:
        await proxy.stop()
    assert "cannot be reached" in caplog.text or "reconnecting in" in caplog.text
    assert len(runs) >= 8


async def test_wins_and_schedulers_survive_a_broker_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a throwaway node: a confirmed win outlives the restart, claims resume after it."""
    loop = asyncio.get_running_loop()
    server = await loop.run_in_executor(None, RabbitServer(tmp_path).start)
    try:
        async with opened(RabbitMQBackend(server.url)) as store:
            slot = now_ms()
            # A horizon that outlasts a slow restart on a loaded machine: past it the
            # answer would be EXPIRED, which says nothing about the kept win.
            kept = request(slot, job="kept", horizon_ms=300_000)
            assert (await store.claim(kept)).outcome == Outcome.WON

            async def restart() -> None:
                await loop.run_in_executor(None, server.restart)

            await run_through_outage(url_with(server.url, margin="1s"), restart, caplog, 20)
            again = await store.claim(request(slot, job="kept", horizon_ms=300_000))
            assert again.outcome == Outcome.TAKEN, "the win was kept across the restart"
    finally:
        await loop.run_in_executor(None, server.stop)
    assert "reconnected to RabbitMQ" in caplog.text
