"""What only the PostgreSQL backend promises: URLs, identifiers, its layout, the database's
clock, race-free decisions across connections, and surviving dropped connections.

Every test that needs the server uses its own random schema (``stores_postgres``), so
the tests are independent of each other and of whatever else uses the database.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import random
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from multiprocessing.synchronize import Barrier
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from services import POSTGRES_URL
from stores_postgres import drop_schema, fresh_schema, require_postgres, url_with

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import (
    SCHEMA_VERSION,
    ClaimRequest,
    FinishRequest,
    InstanceInfo,
    Lease,
    TakeoverRequest,
    overlap_reason,
)
from anarchon_core.backends import backend_from_url
from anarchon_core.backends._sql import history_filter
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.postgres._sql import TERMINAL
from anarchon_core.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    ConflictError,
    SchemaVersionError,
)
from anarchon_core.records import HistoryQuery, Origin, Outcome, Status

HOUR = 3_600_000
Params = tuple[Any, ...] | dict[str, Any]
DB_NOW = "SELECT (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint"


def claim_request(
    slot: int,
    token: str | None = None,
    job: str = "job",
    *,
    skip_overlap: bool = False,
    version: int | None = None,
) -> ClaimRequest:
    token = token or secrets.token_hex(8)
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id=f"worker:{token[:6]}",
        lease_ms=60_000,
        horizon_ms=HOUR,
        skip_overlap=skip_overlap,
        version=version,
    )


@asynccontextmanager
async def store(**options: Any) -> AsyncIterator[PostgresBackend]:
    """An open backend on a fresh schema, dropped afterwards."""
    require_postgres()
    schema = options.pop("schema", None) or fresh_schema()
    backend = PostgresBackend(POSTGRES_URL, schema=schema, **options)
    try:
        await backend.open()
        yield backend
    finally:
        await backend.close()
        drop_schema(schema)


@asynccontextmanager
async def raw() -> AsyncIterator[psycopg.AsyncConnection[tuple[Any, ...]]]:
    """A plain autocommit connection, to inspect or disturb the store."""
    conn = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


async def scalar(conn: psycopg.AsyncConnection[tuple[Any, ...]], query: Any, *params: Any) -> Any:
    row = await (await conn.execute(query, params or None)).fetchone()
    assert row is not None
    return row[0]


def table(backend: PostgresBackend, name: str) -> sql.Identifier:
    return sql.Identifier(backend.schema, backend.table_prefix + name)


# -- URLs and construction -----------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "conninfo", "schema", "prefix", "threshold"),
    [
        ("postgresql://u@h/db", "postgresql://u@h/db", "public", "anarchon_", 5),
        ("postgres://u@h:5433/db", "postgres://u@h:5433/db", "public", "anarchon_", 5),
        (
            "postgresql://u@h/db?schema=jobs&table_prefix=svc_&prepare_threshold=none",
            "postgresql://u@h/db",
            "jobs",
            "svc_",
            None,
        ),
        (
            "postgresql://u@h/db?sslmode=disable&prepare_threshold=0&application_name=x",
            "postgresql://u@h/db?sslmode=disable&application_name=x",
            "public",
            "anarchon_",
            0,
        ),
        (
            "postgresql:///db?host=/run/postgresql",
            "postgresql:///db?host=/run/postgresql",
            "public",
            "anarchon_",
            5,
        ),
    ],
)
def test_url_forms(
    url: str, conninfo: str, schema: str, prefix: str, threshold: int | None
) -> None:
    backend = backend_from_url(url)
    assert isinstance(backend, PostgresBackend)
    assert (backend.conninfo, backend.schema, backend.table_prefix) == (conninfo, schema, prefix)
    assert backend.prepare_threshold == threshold


@pytest.mark.parametrize(
    ("conninfo", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        ("postgresql://app@db/jobs?password=s3cret", "postgresql://app@db/jobs?password=***"),
        (
            "host=db user=app password=s3cret dbname=jobs",
            "host=db user=app password=*** dbname=jobs",
        ),
        ("host=db password='s3 cret' dbname=jobs", "host=db password=*** dbname=jobs"),
    ],
)
def test_describe_masks_the_password(conninfo: str, shown: str) -> None:
    assert PostgresBackend(conninfo).describe() == shown
    assert PostgresBackend(conninfo, schema="s").describe() == shown + " [s.anarchon_*]"


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("mysql://u@h/db", "postgresql://"),
        ("postgresql://u@h/db#frag", "postgresql://"),
        ("postgresql://u@h/db?nosuchoption=1", "nosuchoption"),
        ("postgresql://u@h:port/db", "'port'"),
        ("postgresql://u@h/db?prepare_threshold=-1", "'-1'"),
        ("postgresql://u@h/db?prepare_threshold=few", "'few'"),
        ("postgresql://u@h/db?schema=a&schema=b", "'schema' is given twice"),
        ("postgresql://u@h/db?schema=bad%20name", "'bad name'"),
        ("postgresql://u@h/db?schema=pg_catalog", "'pg_catalog'"),
        ("postgresql://u@h/db?table_prefix=x%27%3B%20DROP%20TABLE%20t%3B--", "DROP TABLE"),
    ],
)
def test_bad_url_names_the_value_and_the_form(url: str, names: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(url.replace("u@", "u:s3cret@"))
    message = str(caught.value)
    assert names in message
    assert "s3cret" not in message


@pytest.mark.parametrize(
    "value",
    [
        "",
        "has space",
        'dq"uote',
        "sq'uote",
        "'; DROP TABLE anarchon_runs; --",
        "a:b",
        "star*",
        "per%cent",
        "dash-ed",
        "9starts_with_digit",
        "ünïcode",
        "x" * 64,
        None,
        42,
    ],
)
@pytest.mark.parametrize("what", ["schema", "table_prefix"])
def test_bad_identifiers_are_refused_at_definition(what: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresBackend(POSTGRES_URL, **{what: value})
    message = str(caught.value)
    assert f"{what} {value!r} is not valid" in message
    assert "letters, digits and _" in message


@pytest.mark.parametrize(
    "options",
    [
        {"prepare_threshold": -1},
        {"prepare_threshold": True},
        {"min_size": -1},
        {"max_size": 0},
        {"min_size": 5, "max_size": 2},
        {"timeout": 0},
        {"prune_batch": 0},
    ],
)
def test_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        PostgresBackend(POSTGRES_URL, **options)


def test_identifiers_at_the_length_bounds_are_accepted() -> None:
    backend = PostgresBackend(POSTGRES_URL, schema="S" * 63, table_prefix="P_" * 20)
    assert all(len(name) <= 63 for name in backend.sql.function_names)


# -- life cycle and layout ---------------------------------------------------------
async def test_open_close_reopen_keeps_the_data() -> None:
    async with store() as backend:
        now = await backend.now_ms()
        assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
        await backend.open()  # idempotent
        await backend.close()
        await backend.close()  # idempotent
        with pytest.raises(BackendError, match="not open"):
            await backend.history(HistoryQuery())
        await backend.open()
        assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
        assert len(await backend.history(HistoryQuery())) == 1


async def test_layout_records_the_version_and_two_prefixes_share_a_schema() -> None:
    async with store(table_prefix="svc_a_") as a:
        b = PostgresBackend(POSTGRES_URL, schema=a.schema, table_prefix="svc_b_")
        await b.open()
        try:
            now = await a.now_ms()
            assert (await a.claim(claim_request(now))).outcome == Outcome.WON
            assert (await b.claim(claim_request(now))).outcome == Outcome.WON  # independent
        finally:
            await b.close()
        async with raw() as conn:
            for prefix in ("svc_a_", "svc_b_"):
                version = await scalar(
                    conn,
                    sql.SQL("SELECT value FROM {}").format(
                        sql.Identifier(a.schema, prefix + "meta")
                    ),
                )
                assert version == str(SCHEMA_VERSION)


async def test_newer_schema_version_is_refused() -> None:
    async with store() as backend:
        await backend.close()
        async with raw() as conn:
            await conn.execute(
                sql.SQL("UPDATE {} SET value = %s").format(table(backend, "meta")),
                (str(SCHEMA_VERSION + 1),),
            )
        with pytest.raises(SchemaVersionError) as caught:
            await backend.open()
        assert f"version {SCHEMA_VERSION + 1}" in str(caught.value)
        assert f"version {SCHEMA_VERSION} " in str(caught.value)
        with pytest.raises(BackendError, match="not open"):  # nothing left half-open
            await backend.history(HistoryQuery())


async def test_unreachable_server_is_unavailable_at_once() -> None:
    backend = PostgresBackend("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        await backend.open()
    assert time.monotonic() - started < 2
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    with pytest.raises(BackendError, match="not open"):
        await backend.claim(claim_request(0))


async def test_a_broken_layout_is_a_backend_error_not_unavailable() -> None:
    async with store() as backend:
        async with raw() as conn:
            await conn.execute(sql.SQL("DROP TABLE {}").format(table(backend, "runs")))
        with pytest.raises(BackendError) as caught:
            await backend.claim(claim_request(await backend.now_ms()))
        assert not isinstance(caught.value, BackendUnavailable)
        assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)


def _open_worker(schema: str, slot: int, barrier: Barrier, results: Any) -> None:
    """Open a fresh schema at the same moment as the other processes, claim one slot."""

    async def main() -> bool:
        backend = PostgresBackend(POSTGRES_URL, schema=schema)
        barrier.wait()
        await backend.open()
        try:
            claim = await backend.claim(claim_request(slot))
            return claim.outcome == Outcome.WON
        finally:
            await backend.close()

    try:
        results.put((asyncio.run(main()), None))
    except BaseException as exc:
        results.put((False, f"{type(exc).__name__}: {exc}"))


def test_concurrent_first_open_of_a_fresh_schema() -> None:
    require_postgres()
    schema, processes = fresh_schema(), 6
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    slot = time.time_ns() // 1_000_000
    procs = [
        ctx.Process(target=_open_worker, args=(schema, slot, barrier, results))
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            proc.start()
        reports = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=10)
        assert [error for _, error in reports if error] == []
        assert sum(won for won, _ in reports) == 1
    finally:
        drop_schema(schema)


async def test_a_store_made_before_the_operations_gets_their_layout_on_open() -> None:
    """A store of the previous layout (no registry, no pending index, no requested_by,
    older functions) is completed at open, at the same schema version, keeping its data."""
    async with store() as backend:
        now = await backend.now_ms()
        lease = Lease("job", now, 1, "tok")
        assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
        await backend.close()
        async with raw() as conn:
            await conn.execute(sql.SQL("DROP TABLE {}").format(table(backend, "instances")))
            await conn.execute(sql.SQL("DROP INDEX {}").format(table(backend, "runs_pending")))
            await conn.execute(
                sql.SQL("ALTER TABLE {} DROP COLUMN requested_by").format(table(backend, "runs"))
            )
            for name in backend.sql.function_names:
                await conn.execute(
                    sql.SQL("DROP FUNCTION {}").format(sql.Identifier(backend.schema, name))
                )
        await backend.open()
        assert await backend.finish(lease, Status.SUCCESS)  # the run in flight carries on
        slot = await backend.trigger("job", "ops")
        assert await backend.trigger("job", "ops") == slot
        assert await backend.cancel("job", slot)
        assert [r.instance_id for r in await backend.history(HistoryQuery())] == [
            "ops",
            "worker:tok",
        ]
        await backend.register(InstanceInfo("i", "h", 1, "v", 0, 0, {}), 60_000)
        assert [i.instance_id for i in await backend.instances()] == ["i"]
        async with raw() as conn:
            version = await scalar(
                conn, sql.SQL("SELECT value FROM {}").format(table(backend, "meta"))
            )
        assert version == str(SCHEMA_VERSION)


async def test_a_store_made_before_definitions_gets_their_columns_on_open() -> None:
    """A store of the previous release (``jobs`` without ``version`` and ``definition``,
    older functions) is completed at open, at the same schema version, keeping its data;
    the columns alone are counted too (the functions need them)."""
    async with store() as backend:
        now = await backend.now_ms()
        await backend.set_paused("job", True)
        await backend.close()

        async def drop_columns() -> None:
            async with raw() as conn:
                for column in ("version", "definition"):
                    await conn.execute(
                        sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
                            table(backend, "jobs"), sql.Identifier(column)
                        )
                    )

        await drop_columns()
        async with raw() as conn:
            for name in backend.sql.function_names:
                await conn.execute(
                    sql.SQL("DROP FUNCTION {}").format(sql.Identifier(backend.schema, name))
                )
        await backend.open()
        assert await backend.paused_jobs() == {"job"}
        assert await backend.definitions_version() == 0
        version = await backend.write_definition("job", '{"every": "10s"}', expected=0)
        claim = await backend.claim(claim_request(now, version=version))
        assert claim.outcome == Outcome.PAUSED
        await backend.close()
        await drop_columns()  # the functions are still there
        await backend.open()
        assert await backend.definitions_since(0) == []  # the columns' values went with them
        assert await backend.write_definition("job", "{}", expected=0) == version + 1
        async with raw() as conn:
            stored = await scalar(
                conn,
                sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(
                    table(backend, "meta")
                ),
            )
        assert stored == str(SCHEMA_VERSION)


async def test_a_store_with_the_former_history_index_gets_the_new_one_on_open() -> None:
    """History's order changed (job descending): its index is replaced at the same version."""
    async with store() as backend:
        now = await backend.now_ms()
        assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
        await backend.close()
        former = sql.SQL("CREATE INDEX {} ON {} (slot DESC, job, attempt DESC)").format(
            sql.Identifier(backend.table_prefix + "attempts_slot"), table(backend, "attempts")
        )
        indexes = "SELECT array_agg(indexname::text) FROM pg_indexes WHERE schemaname = %s"
        async with raw() as conn:
            await conn.execute(sql.SQL("DROP INDEX {}").format(table(backend, "attempts_history")))
            await conn.execute(former)
        await backend.open()
        assert [r.slot for r in await backend.history(HistoryQuery())] == [now]
        async with raw() as conn:
            names = await scalar(conn, indexes, backend.schema)
        prefix = backend.table_prefix
        assert prefix + "attempts_history" in names and prefix + "attempts_slot" not in names
        async with raw() as conn:  # an older instance, restarted mid-upgrade, made it again
            await conn.execute(former)
        await backend.close()
        await backend.open()  # the former index makes the store incomplete: dropped again
        async with raw() as conn:
            assert prefix + "attempts_slot" not in await scalar(conn, indexes, backend.schema)


async def test_opening_a_complete_store_runs_no_ddl() -> None:
    """Every table, index, column and function is counted: a store already complete
    is left alone (DDL would lock the tables every instance claims in)."""
    async with store() as backend:
        again = PostgresBackend(POSTGRES_URL, schema=backend.schema)
        again.sql.create_tables = "SELECT 1/0"  # would fail if it ran
        again.sql.create_functions = ["SELECT 1/0"]
        await again.open()
        await again.close()
        async with raw() as conn:
            await conn.execute(sql.SQL("DROP INDEX {}").format(table(backend, "runs_pending")))
        with pytest.raises(BackendError):  # incomplete: the DDL runs (and here fails)
            await again.open()
        await backend.close()
        await backend.open()  # completes it
        assert await backend.trigger("job", "ops") > 0


# -- names stored safely -----------------------------------------------------------
ODD_NAMES = [
    "a:b.c-d_e",
    "ns:a:b.c-d_e",
    "it's",
    'say "hi"',
    "with space",
    "star*and%percent%s",
    "'; DROP TABLE anarchon_runs; --",
    "$anarchon$",
    "ζ✓",
]


async def test_odd_job_names_are_stored_as_values() -> None:
    """The core refuses most of these at definition; the store keeps any name safely."""
    async with store() as backend:
        now = await backend.now_ms()
        for i, job in enumerate(ODD_NAMES):
            request = claim_request(now - i, job=job, skip_overlap=True)
            assert (await backend.claim(request)).outcome == Outcome.WON
            lease = Lease(job, now - i, 1, request.token)
            assert await backend.heartbeat([lease], 60_000) == [True]
            assert await backend.finish(lease, Status.SUCCESS, meta={"job": job})
            await backend.set_paused(job, True)
            (rec,) = await backend.history(HistoryQuery(job=job))
            assert (rec.job, rec.meta, rec.status) == (job, {"job": job}, Status.SUCCESS)
            assert await backend.last_scheduled_slot(job) == now - i
        assert await backend.due_runs(ODD_NAMES) == []
        assert len(await backend.history(HistoryQuery())) == len(ODD_NAMES)


async def test_odd_names_in_the_operations_are_values_too() -> None:
    async with store() as backend:
        slots = {job: await backend.trigger(job, f"{job} (by)") for job in ODD_NAMES}
        due = await backend.due_runs(ODD_NAMES)
        assert {(d.job, d.slot, d.reason) for d in due} == {
            (job, slot, "manual") for job, slot in slots.items()
        }
        for job in ODD_NAMES:
            await backend.set_paused(job, True)
            assert await backend.cancel(job, slots[job])
        assert await backend.paused_jobs() == set(ODD_NAMES)
        assert {(r.job, r.instance_id) for r in await backend.history(HistoryQuery())} == {
            (job, f"{job} (by)") for job in ODD_NAMES
        }
        for job in ODD_NAMES:
            info = InstanceInfo(job, job, 1, job, 0, 0, {job: job})
            await backend.register(info, 60_000)
        live = await backend.instances()
        assert [i.instance_id for i in live] == sorted(ODD_NAMES)  # code point order
        assert all(i.jobs == {i.instance_id: i.instance_id} for i in live)
        for job in ODD_NAMES:
            await backend.unregister(job)
        assert await backend.instances() == []


@pytest.mark.parametrize("name", ODD_NAMES[2:])
def test_odd_job_names_are_refused_by_the_scheduler(name: str) -> None:
    scheduler = Scheduler(PostgresBackend(POSTGRES_URL))
    with pytest.raises(ConfigurationError) as caught:
        scheduler.every(name, "10s", lambda ctx: None)
    assert repr(name) in str(caught.value)


async def test_nul_characters_in_free_text_are_replaced() -> None:
    async with store() as backend:
        now = await backend.now_ms()
        request = claim_request(now)
        await backend.claim(request)
        lease = Lease("job", now, 1, request.token)
        assert await backend.finish(lease, Status.FAILED, error="a\x00b", meta={"k\x00": ["\x00"]})
        (rec,) = await backend.history(HistoryQuery())
        assert (rec.error, rec.meta) == ("a\ufffdb", {"k\ufffd": ["\ufffd"]})
        slot = await backend.trigger("job", "by\x00")
        assert await backend.cancel("job", slot)
        assert (await backend.history(HistoryQuery()))[0].instance_id == "by\ufffd"
        info = InstanceInfo("i\x00", "h\x00", 1, "v", 0, 0, {"j\x00": "f\x00"})
        await backend.register(info, 60_000)
        (live,) = await backend.instances()
        assert (live.instance_id, live.host, live.jobs) == (
            "i\ufffd",
            "h\ufffd",
            {"j\ufffd": "f\ufffd"},
        )
        await backend.unregister("i\x00")
        assert await backend.instances() == []


async def test_a_registry_entry_that_is_not_json_is_refused() -> None:
    async with store() as backend:
        info = InstanceInfo("i", "h", 1, "v", 0, 0, {"job": object()})
        with pytest.raises(ConfigurationError, match=r"'i'.*not JSON"):
            await backend.register(info, 60_000)


# -- the database's clock ------------------------------------------------------------
async def test_times_come_from_the_database_clock() -> None:
    async with store() as backend, raw() as conn:
        before = await scalar(conn, DB_NOW)
        now = await backend.now_ms()
        claim = await backend.claim(claim_request(now, "tok"))
        after = await scalar(conn, DB_NOW)
        assert before <= now <= claim.store_now <= after  # type: ignore[operator]
        assert after - before < 1000  # a few ms on one host; generous for a busy CI
        assert abs(now - time.time_ns() // 1_000_000) < 1000  # same host: same clock
        expires = await scalar(
            conn, sql.SQL("SELECT lease_expires FROM {}").format(table(backend, "runs"))
        )
        assert expires == claim.store_now + 60_000  # type: ignore[operator]
        await asyncio.sleep(0.1)
        assert 100 <= await backend.now_ms() - now < 1000


async def test_decisions_use_clock_timestamp_not_the_frozen_transaction_now() -> None:
    """Inside one transaction ``now()`` stays put; the claim must read the real time."""
    async with store() as backend, raw() as conn:
        slot = await backend.now_ms()
        async with conn.transaction():
            started = await scalar(conn, "SELECT (extract(epoch FROM now()) * 1000)::bigint")
            await conn.execute("SELECT pg_sleep(0.3)")
            request = claim_request(slot)
            params = (request.job, slot, "schedule", request.token, "x", 60_000, HOUR, True, "")
            params += (None,)  # no definition version
            cur = await conn.execute(backend.sql.claim, params)
            outcome, _, store_now = await cur.fetchone()  # type: ignore[misc]
        assert outcome == "won"
        assert store_now - started >= 300


async def test_expiry_is_judged_when_the_statement_runs() -> None:
    async with store() as backend:
        now = await backend.now_ms()
        request = ClaimRequest("job", now, Origin.SCHEDULE, "tok", "a", 200, HOUR, True)
        await backend.claim(request)
        take = TakeoverRequest("job", now, 1, "t2", "b", 60_000, HOUR, 3, True)
        assert (await backend.take_over(take)).outcome == Outcome.TAKEN  # still live
        await asyncio.sleep(0.25)
        assert (await backend.take_over(take)).outcome == Outcome.WON


# -- race-free decisions across connections ------------------------------------------
async def test_overlap_check_does_not_race_claims_of_other_slots() -> None:
    async with store(max_size=8) as backend:
        now = await backend.now_ms()
        for round_ in range(5):
            job = f"race{round_}"
            claims = await asyncio.gather(
                *(
                    backend.claim(claim_request(now - k, job=job, skip_overlap=True))
                    for k in range(8)
                )
            )
            outcomes = Counter(c.outcome for c in claims)
            assert outcomes == {Outcome.WON: 1, Outcome.SKIPPED: 7}, outcomes


async def test_takeovers_of_two_runs_of_one_job_do_not_overlap() -> None:
    async with store(max_size=8) as backend:
        now = await backend.now_ms()
        for slot in (now - 1, now - 2):
            short = ClaimRequest("job", slot, Origin.SCHEDULE, f"t{slot}", "a", 50, HOUR, False)
            assert (await backend.claim(short)).outcome == Outcome.WON
        await asyncio.sleep(0.1)
        takes = await asyncio.gather(
            *(
                backend.take_over(
                    TakeoverRequest(
                        "job", slot, 1, secrets.token_hex(4), "b", 60_000, HOUR, 3, True
                    )
                )
                for slot in (now - 1, now - 2)
                for _ in range(4)
            )
        )
        assert Counter(t.outcome for t in takes) == {
            Outcome.WON: 1,
            Outcome.BLOCKED: 4,
            Outcome.TAKEN: 3,
        }


# -- batches ---------------------------------------------------------------------------
@asynccontextmanager
async def statements_sent() -> AsyncIterator[list[str]]:
    """Every statement any connection of this process sends, as sent."""
    execute = psycopg.AsyncCursor.execute
    sent: list[str] = []

    async def counted(
        self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any
    ) -> psycopg.AsyncCursor[Any]:
        sent.append(str(query))
        return await execute(self, query, *args, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psycopg.AsyncCursor, "execute", counted)
        yield sent


async def test_a_batch_is_one_statement_and_one_transaction() -> None:
    """100 claims and then their 100 finishes: one statement each, each one commit (every
    row it wrote carries one transaction id)."""
    async with store() as backend, raw() as conn:
        now = await backend.now_ms()
        requests = [claim_request(now, job=f"batch.{n}", skip_overlap=True) for n in range(100)]
        async with statements_sent() as sent:
            claims = await backend.claim_many(requests)
        assert sent == [backend.sql.claim_many]
        assert {c.outcome for c in claims} == {Outcome.WON}
        runs, attempts = table(backend, "runs"), table(backend, "attempts")
        writers = sql.SQL("SELECT count(DISTINCT xmin::text), count(*) FROM {}")
        assert await (await conn.execute(writers.format(runs))).fetchone() == (1, 100)
        assert await (await conn.execute(writers.format(attempts))).fetchone() == (1, 100)
        leases = [Lease(r.job, r.slot, 1, r.token) for r in requests]
        async with statements_sent() as sent:
            done = await backend.finish_many([FinishRequest(le, Status.SUCCESS) for le in leases])
        assert sent == [backend.sql.finish_many]
        assert done == [True] * 100
        assert await (await conn.execute(writers.format(runs))).fetchone() == (1, 100)
        statuses = sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(attempts)
        assert await (await conn.execute(statuses)).fetchall() == [("success", 100)]


@pytest.mark.parametrize("skip_overlap", [True, False])
async def test_overlapping_batches_in_opposite_orders_do_not_deadlock(skip_overlap: bool) -> None:
    """Four instances claim the same 50 jobs, two slots each, at once, each its batch in
    another order (forward, reversed, shuffled): every batch holds its locks until it
    commits, so only one locking order keeps them from waiting for each other (a
    deadlock would fail a batch after ``deadlock_timeout``)."""
    async with store(max_size=4) as backend:
        now = await backend.now_ms()
        for round_ in range(6):
            jobs = [f"dl.{round_}.{n:02d}" for n in range(50)]
            runs = [(job, now - k) for job in jobs for k in (0, 1)]
            orders = [runs, runs[::-1], random.sample(runs, len(runs)), runs[1:] + runs[:1]]
            batches = [
                [claim_request(slot, job=job, skip_overlap=skip_overlap) for job, slot in order]
                for order in orders
            ]
            answers = await asyncio.gather(*(backend.claim_many(b) for b in batches))
            won = Counter(
                (r.job, r.slot) if not skip_overlap else r.job
                for batch, claims in zip(batches, answers, strict=True)
                for r, c in zip(batch, claims, strict=True)
                if c.outcome == Outcome.WON
            )
            if skip_overlap:  # one live run per job: the other slot is skipped
                assert won == Counter(jobs), won
            else:
                assert won == Counter(runs), won


async def test_a_batch_with_several_runs_of_one_job_takes_its_lock_before_any_run() -> None:
    """Another transaction holds the job's lock, a run of it (``s``) and is about to
    claim ``s - 1``; a batch claiming ``s - 1`` then ``s`` waits for the job's lock and
    holds none of its runs meanwhile, so that claim does not wait for the batch (both
    waiting would be a deadlock) and the batch then finds both runs taken."""
    async with store(max_size=2) as backend, raw() as conn:
        now = await backend.now_ms()

        def arrays(requests: list[ClaimRequest]) -> tuple[list[Any], ...]:
            return tuple([getattr(r, field) for r in requests] for field in ClaimRequest.__slots__)

        theirs = [claim_request(now, "a", "job"), claim_request(now - 2, "a2", "job")]
        await conn.execute("BEGIN")
        rows = await (await conn.execute(backend.sql.claim_many, arrays(theirs))).fetchall()
        assert [row[1] for row in rows] == ["won", "won"]
        mine = asyncio.create_task(
            backend.claim_many([claim_request(now - 1, "b", "job"), claim_request(now, "b", "job")])
        )
        await blocked(mine)
        single = claim_request(now - 1, "a", "job")
        params = (single.job, now - 1, "schedule", "a", "x", 60_000, HOUR, False, "")
        params += (None,)  # no definition version
        row = await (await conn.execute(backend.sql.claim, params)).fetchone()
        assert row is not None and row[0] == "won"  # did not wait for the batch
        await conn.execute("COMMIT")
        answers = await asyncio.wait_for(mine, timeout=5)
        assert [a.outcome for a in answers] == [Outcome.TAKEN, Outcome.TAKEN]


async def test_batched_claims_answer_as_single_claims_in_order() -> None:
    """The same requests sent one by one to one store and as one batch to another, from
    the same state, get the same answers and leave the same history, in request order:
    pause, overlap, a run held by another token, a repeat while live and once lapsed,
    early and expired, and several requests of one run or one job."""

    async def prepare(backend: PostgresBackend, now: int) -> None:
        await backend.set_paused("paused", True)
        assert (await backend.claim(claim_request(now, "holder", "held"))).outcome == Outcome.WON
        lapsing = ClaimRequest("lapsed", now, Origin.SCHEDULE, "lapsing", "w", 1, HOUR, False)
        assert (await backend.claim(lapsing)).outcome == Outcome.WON

    def scenario(now: int) -> list[ClaimRequest]:
        return [
            claim_request(now, "repeat", "free"),
            claim_request(now - 2000, "busy1", "busy", skip_overlap=True),
            claim_request(now, "other", "free"),
            claim_request(now, "repeat", "free"),
            claim_request(now - 1000, "busy2", "busy", skip_overlap=True),
            claim_request(now - 3000, "busy3", "busy"),
            claim_request(now, "paused", "paused", skip_overlap=True),
            claim_request(now, "other", "held"),
            claim_request(now, "holder", "held"),
            ClaimRequest("lapsed", now, Origin.SCHEDULE, "lapsing", "w", 1, HOUR, False),
            claim_request(now + 60_000, "early", "early"),
            claim_request(now - 2 * HOUR, "expired", "expired"),
            ClaimRequest("printed", now, Origin.CATCH_UP, "fp", "w", 60_000, HOUR, True, "v2"),
        ]

    expected = [
        (Outcome.WON, 1),
        (Outcome.WON, 1),
        (Outcome.TAKEN, 0),
        (Outcome.WON, 1),
        (Outcome.SKIPPED, 0),
        (Outcome.WON, 1),
        (Outcome.PAUSED, 0),
        (Outcome.TAKEN, 0),
        (Outcome.WON, 1),
        (Outcome.LAPSED, 0),
        (Outcome.EARLY, 0),
        (Outcome.EXPIRED, 0),
        (Outcome.WON, 1),
    ]
    async with store() as alone, store() as batched, raw() as conn:
        now = await alone.now_ms()
        for backend in (alone, batched):
            await prepare(backend, now)
        await asyncio.sleep(0.05)  # the lapsing lease expires
        singles = [await alone.claim(r) for r in scenario(now)]
        together = await batched.claim_many(scenario(now))
        assert [(c.outcome, c.attempt) for c in singles] == expected
        assert [(c.outcome, c.attempt) for c in together] == expected
        assert all(c.store_now is not None and abs(c.store_now - now) < 10_000 for c in together)
        stored = []
        for backend in (alone, batched):
            history = await backend.history(HistoryQuery(limit=100))
            rows = await conn.execute(
                sql.SQL(
                    "SELECT job, slot, state, attempt, token, fingerprint FROM {} ORDER BY 1, 2"
                ).format(table(backend, "runs"))
            )
            stored.append(
                (
                    [
                        (r.job, r.slot, r.attempt, r.origin, r.status, r.instance_id)
                        for r in history
                    ],
                    await rows.fetchall(),
                )
            )
        assert stored[0] == stored[1]
        assert ("printed", now, "running", 1, "fp", "v2") in stored[1][1]


async def test_batched_finishes_answer_as_single_finishes_in_order() -> None:
    """Finishes of one run twice in one batch: the first in order finishes it, a later
    one is a repeat (true for the same status); stale tokens change nothing."""
    async with store() as backend:
        now = await backend.now_ms()
        requests = [claim_request(now, job=job) for job in ("a", "b", "c")]
        assert {c.outcome for c in await backend.claim_many(requests)} == {Outcome.WON}
        a, b, c = (Lease(r.job, r.slot, 1, r.token) for r in requests)
        stale = Lease("c", now, 1, "stale")
        answers = await backend.finish_many(
            [
                FinishRequest(stale, Status.SUCCESS),
                FinishRequest(a, Status.FAILED, error="boom", retry_in_ms=60_000),
                FinishRequest(b, Status.SUCCESS, meta={"n": 1}),
                FinishRequest(a, Status.FAILED, error="again"),
                FinishRequest(b, Status.FAILED, error="late"),
                FinishRequest(c, Status.SUCCESS),
            ]
        )
        assert answers == [False, True, True, True, False, True]
        history = {r.job: r for r in await backend.history(HistoryQuery(limit=10))}
        assert (history["a"].status, history["a"].error) == (Status.FAILED, "boom")
        assert (history["b"].status, history["b"].meta) == (Status.SUCCESS, {"n": 1})
        assert history["c"].status == Status.SUCCESS
        assert await backend.heartbeat([a, b, c], 60_000) == [False, False, False]


async def test_batched_finishes_and_heartbeats_of_the_same_leases_do_not_deadlock() -> None:
    """An instance's heartbeat and a batch of its finishes may run at once on two
    connections: both lock the runs in key order, so neither waits for the other."""
    async with store(max_size=4) as backend:
        now = await backend.now_ms()
        for round_ in range(5):
            requests = [claim_request(now - round_, job=f"hb.{n:02d}") for n in range(50)]
            assert {c.outcome for c in await backend.claim_many(requests)} == {Outcome.WON}
            leases = [Lease(r.job, r.slot, 1, r.token) for r in requests]
            finishes = [FinishRequest(le, Status.SUCCESS) for le in random.sample(leases, 50)]
            results = await asyncio.gather(
                backend.heartbeat(leases[::-1], 60_000),
                backend.finish_many(finishes),
                backend.heartbeat(random.sample(leases, 50), 60_000),
            )
            assert results[1] == [True] * 50


async def blocked(task: asyncio.Task[Any]) -> None:
    """Assert that ``task`` is waiting (for a lock another connection holds)."""
    await asyncio.sleep(0.3)
    assert not task.done()


@pytest.mark.parametrize("end", ["commit", "rollback"])
async def test_definition_writes_queue_on_the_counter_and_claims_do_not(end: str) -> None:
    """A write in flight on another connection holds the counter's row: a write of
    another job waits for it and then gets the next version (the versions commit in
    order), an edit of the same version waits and then conflicts (or, after a rollback,
    goes through); readers and claims never wait, and see only what is committed."""
    async with store(max_size=4) as backend, raw() as conn:
        now = await backend.now_ms()
        v1 = await backend.write_definition("job", '{"n": 1}', expected=0)
        await conn.execute("BEGIN")
        theirs = await scalar(conn, backend.sql.write_definition, "job", '{"n": 2}', v1)
        assert theirs == v1 + 1
        other = asyncio.create_task(backend.write_definition("other", "{}", expected=0))
        edit = asyncio.create_task(backend.write_definition("job", '{"n": 3}', expected=v1))
        await blocked(other)
        await blocked(edit)
        assert await backend.definitions_version() == v1
        assert [d.version for d in await backend.definitions_since(0)] == [v1]
        claim = await backend.claim(claim_request(now, job="job", version=v1))
        assert claim.outcome == Outcome.WON  # decided on the committed version
        await conn.execute(end.upper())
        versions = {await asyncio.wait_for(other, timeout=5)}
        if end == "commit":
            with pytest.raises(ConflictError) as caught:
                await asyncio.wait_for(edit, timeout=5)
            assert caught.value.current == theirs
            assert versions == {theirs + 1}
        else:
            versions.add(await asyncio.wait_for(edit, timeout=5))
            assert versions == {v1 + 1, v1 + 2}  # the rolled-back number was never seen
        stored = await backend.definitions_since(v1)
        assert [d.version for d in stored] == sorted(d.version for d in stored)
        assert await backend.definitions_version() == stored[-1].version


@pytest.mark.parametrize("skip_overlap", [True, False])
async def test_a_stale_claim_of_a_paused_job_is_stale_and_writes_nothing(
    skip_overlap: bool,
) -> None:
    """The version is checked before pause, in the statement that reads the pause."""
    async with store() as backend:
        now = await backend.now_ms()
        v1 = await backend.write_definition("job", "{}", expected=0)
        await backend.set_paused("job", True)
        stale = claim_request(now, job="job", version=v1 + 1, skip_overlap=skip_overlap)
        assert (await backend.claim(stale)).outcome == Outcome.STALE
        (batched,) = await backend.claim_many([stale])
        assert batched.outcome == Outcome.STALE
        assert await backend.history(HistoryQuery()) == []
        current = claim_request(now, job="job", version=v1, skip_overlap=skip_overlap)
        assert (await backend.claim(current)).outcome == Outcome.PAUSED
        assert [r.status for r in await backend.history(HistoryQuery())] == [Status.PAUSED]


@pytest.mark.parametrize("end", ["commit", "rollback"])
async def test_a_trigger_waits_for_a_request_in_flight_on_another_connection(end: str) -> None:
    async with store() as backend, raw() as conn:
        await conn.execute("BEGIN")
        theirs = await scalar(conn, backend.sql.trigger, "job", "them")
        mine = asyncio.create_task(backend.trigger("job", "me"))
        await blocked(mine)  # the unique index makes it wait for the other transaction
        await conn.execute(end.upper())
        slot = await asyncio.wait_for(mine, timeout=5)
        if end == "commit":
            assert slot == theirs  # one request: the one that committed
        else:
            assert slot != theirs  # the other one is gone: this one is the request
        (due,) = await backend.due_runs(["job"])
        assert due.slot == slot
        assert await backend.cancel("job", slot)
        (rec,) = await backend.history(HistoryQuery())
        assert rec.instance_id == ("them" if end == "commit" else "me")


async def test_a_trigger_skips_milliseconds_claimed_while_it_waited() -> None:
    async with store() as backend, raw() as conn:
        now = await backend.now_ms()
        await conn.execute("BEGIN")
        await conn.execute(  # runs of every millisecond for 3 s, not yet committed
            sql.SQL(
                "INSERT INTO {} (job, slot, origin, state, attempt) "
                "SELECT 'job', s, 'schedule', 'success', 1 FROM generate_series(%s, %s) s"
            ).format(table(backend, "runs")),
            (now, now + 2999),
        )
        task = asyncio.create_task(backend.trigger("job", "me"))
        await blocked(task)  # its millisecond is being inserted: the primary key waits
        await conn.execute("COMMIT")
        assert await asyncio.wait_for(task, timeout=5) == now + 3000  # looked again


async def test_cancel_that_waited_for_a_takeover_cancels_the_new_attempt() -> None:
    """cancel's statement snapshot predates the takeover's new record; the upsert still
    ends that record, so no attempt is left ``running`` in a cancelled run."""
    async with store() as backend, raw() as conn:
        now = await backend.now_ms()
        short = ClaimRequest("job", now, Origin.SCHEDULE, "t1", "a", 50, HOUR, True)
        assert (await backend.claim(short)).outcome == Outcome.WON
        await asyncio.sleep(0.1)
        await conn.execute("BEGIN")
        params = ("job", now, 1, "t2", "b", 60_000, HOUR, 3, True)
        row = await (await conn.execute(backend.sql.take_over, params)).fetchone()
        assert row is not None and row[:2] == ("won", 2)
        task = asyncio.create_task(backend.cancel("job", now))
        await blocked(task)  # the takeover holds the run's row
        await conn.execute("COMMIT")
        assert await asyncio.wait_for(task, timeout=5)
        history = await backend.history(HistoryQuery())
        assert [(r.attempt, r.status) for r in history] == [
            (2, Status.CANCELLED),
            (1, Status.INTERRUPTED),
        ]
        assert await backend.heartbeat([Lease("job", now, 2, "t2")], 60_000) == [False]


async def test_cancel_and_start_of_one_pending_request_at_once() -> None:
    """Whichever comes first, the request ends cancelled and no attempt stays running."""
    async with store(max_size=8) as backend:
        for _ in range(10):
            slot = await backend.trigger("job", "ops")
            take = TakeoverRequest("job", slot, 0, secrets.token_hex(4), "b", 60_000, HOUR, 3, True)
            claim, cancelled = await asyncio.gather(
                backend.take_over(take), backend.cancel("job", slot)
            )
            assert cancelled
            assert claim.outcome in (Outcome.WON, Outcome.TAKEN)
            (rec,) = await backend.history(HistoryQuery(since=slot, until=slot + 1))
            assert rec.status == Status.CANCELLED
            assert rec.attempt == (1 if claim.outcome == Outcome.WON else 0)
            assert await backend.due_runs(["job"]) == []


# -- the instance registry ---------------------------------------------------------------
async def test_registry_times_come_from_the_database_clock() -> None:
    async with store() as backend, raw() as conn:
        await backend.register(InstanceInfo("i", "h", 1, "v", 0, 123, {}), 60_000)
        (info,) = await backend.instances()
        seen, expires = await (
            await conn.execute(
                sql.SQL("SELECT last_seen, expires_at FROM {}").format(table(backend, "instances"))
            )
        ).fetchone()  # type: ignore[misc]
        assert info.last_seen == seen and expires == seen + 60_000
        assert abs(seen - await scalar(conn, DB_NOW)) < 1000


async def test_prune_deletes_the_rows_of_expired_instances() -> None:
    async with store() as backend, raw() as conn:
        await backend.register(InstanceInfo("gone", "h", 1, "v", 0, 0, {}), 1)
        await backend.register(InstanceInfo("live", "h", 1, "v", 0, 0, {}), 60_000)
        await asyncio.sleep(0.05)
        count = sql.SQL("SELECT count(*) FROM {}").format(table(backend, "instances"))
        assert await scalar(conn, count) == 2  # expired, not listed, still stored
        assert [i.instance_id for i in await backend.instances()] == ["live"]
        assert await backend.prune(0) == 0
        assert await scalar(conn, count) == 1


# -- indexes and pruning ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("statement", "params", "index"),
    [
        ("due_runs", {"jobs": ["a", "b"]}, "runs_open"),
        ("due_runs", {"jobs": ["a", "b"]}, "runs_pending"),  # pending manual requests
        ("cancel", {"job": "a", "slot": 1, "revoked": "cancelled:x"}, "runs_pkey"),
        ("last_scheduled_slot", ("a",), "runs_pkey"),
        ("history", HistoryQuery(limit=10), "attempts_history"),
        ("history", HistoryQuery(job="a", limit=10), "attempts_pkey"),
        ("history", HistoryQuery(status=Status.SUCCESS, limit=10), "attempts_history"),
        ("history", HistoryQuery(limit=10, before=(10**12, "a", 2)), "attempts_history"),
        ("history", HistoryQuery(job="a", limit=10, before=(10**12, "a", 2)), "attempts_pkey"),
    ],
)
async def test_hot_queries_can_use_an_index(
    statement: str, params: Params | HistoryQuery, index: str
) -> None:
    async with store() as backend, raw() as conn:
        text = getattr(backend.sql, statement)
        if isinstance(params, HistoryQuery):  # the statement PostgresBackend.history sends
            where, values = history_filter(params, "%s")
            text, params = text + where + backend.sql.history_order, (*values, params.limit)
        for kind in ("seqscan", "bitmapscan", "sort"):  # tiny tables: ask what is possible
            await conn.execute(f"SET enable_{kind} = off")
        plan = " | ".join(
            row[0] for row in await (await conn.execute("EXPLAIN " + text, params)).fetchall()
        )
        assert backend.table_prefix + index in plan, plan
        assert "Sort" not in plan or statement == "due_runs", plan  # pages in index order


async def test_prune_deletes_in_bounded_batches_and_keeps_the_latest() -> None:
    async with store(prune_batch=300) as backend:
        async with raw() as conn:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job, slot, origin, state, attempt) "
                    "SELECT 'bulk', s, 'schedule', 'success', 1 FROM generate_series(1, 1000) s"
                ).format(table(backend, "runs"))
            )
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job, slot, attempt, origin, status) "
                    "SELECT 'bulk', s, 1, 'schedule', 'success' FROM generate_series(1, 1000) s"
                ).format(table(backend, "attempts"))
            )
        batches: list[int] = []
        row = backend._row

        async def counting(query: str, params: Any = None) -> tuple[Any, ...]:
            found = await row(query, params)
            if query is backend.sql.prune:
                batches.append(found[0])
            return found

        backend._row = counting  # type: ignore[method-assign]
        assert await backend.prune(2000) == 999
        assert batches == [300, 300, 300, 99]
        async with raw() as conn:
            runs = await scalar(
                conn, sql.SQL("SELECT count(*) FROM {}").format(table(backend, "runs"))
            )
        assert runs == 1
        (rec,) = await backend.history(HistoryQuery())
        assert rec.slot == 1000 and await backend.last_scheduled_slot("bulk") == 1000


async def test_a_prune_batch_in_flight_does_not_block_claims() -> None:
    async with store() as backend, raw() as conn:
        now = await backend.now_ms()
        for slot in (now - 3000, now - 2000):  # an old finished run, then the latest
            request = claim_request(slot, job="job", skip_overlap=True)
            await backend.claim(request)
            assert await backend.finish(Lease("job", slot, 1, request.token), Status.SUCCESS)
        params = {
            "below": now,
            "terminal": TERMINAL,
            "jobs": None,  # every job in scope
            "prefix": None,
            "keep_jobs": ["job"],
            "keep_slots": [now - 2000],
            "batch": 1000,
        }
        async with conn.transaction():  # the batch holds its row locks until commit
            row = await (await conn.execute(backend.sql.prune, params)).fetchone()
            assert row is not None and row[0] == 1
            claim = await asyncio.wait_for(
                backend.claim(claim_request(now, job="job", skip_overlap=True)), timeout=2
            )
            assert claim.outcome == Outcome.WON
            assert await asyncio.wait_for(backend.history(HistoryQuery()), timeout=2)


# -- dropped connections -------------------------------------------------------------
async def terminate(app: str) -> int:
    """``pg_terminate_backend`` every connection named ``app``; how many there were."""
    async with raw() as conn:
        killed = await scalar(
            conn,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            app,
        )
    return int(killed)


async def test_pool_recovers_after_its_connections_are_terminated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = f"anarchon-test-{secrets.token_hex(4)}"
    require_postgres()
    schema = fresh_schema()
    backend = PostgresBackend(url_with(application_name=app), schema=schema, min_size=3)
    await backend.open()
    try:
        now = await backend.now_ms()
        await asyncio.gather(*(backend.claim(claim_request(now - k, job="warm")) for k in range(6)))
        for round_ in range(3):
            assert await terminate(app) >= 1
            requests = [claim_request(now - k, job=f"j{round_}") for k in range(6)]
            claims = await asyncio.gather(*(backend.claim(r) for r in requests))
            assert {c.outcome for c in claims} == {Outcome.WON}
        assert "lost" in caplog.text and "retrying on a fresh connection" in caplog.text
    finally:
        await backend.close()
        drop_schema(schema)


async def test_scheduler_survives_terminated_connections(caplog: pytest.LogCaptureFixture) -> None:
    """Two schedulers run a job every 200 ms while every connection they hold is killed."""
    require_postgres()
    caplog.set_level(logging.INFO, logger="anarchon")
    app = f"anarchon-test-{secrets.token_hex(4)}"
    schema = fresh_schema()
    url = url_with(schema=schema, application_name=app)
    started: Counter[tuple[str, int]] = Counter()

    def tick(ctx: RunContext) -> None:
        started[(ctx.job, ctx.slot)] += 1

    async def slow(ctx: RunContext) -> None:
        started[(ctx.job, ctx.slot)] += 1
        await asyncio.sleep(0.5)  # spans kills: its heartbeats and finish must get through

    schedulers = [
        Scheduler(url, instance_id=f"i{n}", heartbeat_ms=200, lease_ms=1200, jitter_ms=40)
        for n in range(2)
    ]
    for scheduler in schedulers:
        scheduler.every("tick", "200ms", tick)
        scheduler.every("slow", "1s", slow)
    try:
        for scheduler in schedulers:
            await scheduler.start()
        first = time.time()
        kills = []
        for _ in range(4):
            await asyncio.sleep(0.7)
            kills.append(await terminate(app))
        last_kill = time.time()
        await asyncio.sleep(1.2)
        assert all(s.running for s in schedulers)
        until = time.time()
        for scheduler in schedulers:
            await scheduler.stop()
        reader = backend_from_url(url)
        await reader.open()
        history = await reader.history(HistoryQuery(limit=10_000))
        await reader.close()
    finally:
        for scheduler in schedulers:
            await scheduler.stop()
        drop_schema(schema)
    assert all(n >= 1 for n in kills), kills
    assert "engine loop crashed" not in caplog.text
    assert "Traceback" not in caplog.text
    duplicates = {key: n for key, n in started.items() if n > 1}
    assert not duplicates, f"ran twice: {duplicates}"
    # Every run that started has its record, finished, with one attempt only.
    recorded = {(r.job, r.slot): r for r in history if r.attempt == 1}
    for key in started:
        assert key in recorded, f"{key} ran but has no record"
        assert recorded[key].status == Status.SUCCESS, recorded[key]
    assert all(r.attempt <= 1 for r in history), [r for r in history if r.attempt > 1]
    # Runs resumed after the last kill, and every 200 ms slot in between ran.
    ticks = sorted(slot for job, slot in started if job == "tick")
    assert any(slot > last_kill * 1000 for slot in ticks)
    expected = range((int(first * 1000) // 200 + 1) * 200, int(until * 1000) - 300, 200)
    missing = [slot for slot in expected if slot not in ticks]
    assert len(expected) >= 15 and not missing, f"missed {missing}"


@asynccontextmanager
async def dies_after_applying(text: str) -> AsyncIterator[list[int]]:
    """The first statement ``text`` is applied (committed), then its connection dies.

    Its backend is terminated with ``pg_terminate_backend`` once the statement ran, so
    the caller sees the connection fail after the store applied the call: the reply
    is lost and the backend re-sends the statement on a fresh connection. Yields the
    pids terminated (one, once it happened).
    """
    execute = psycopg.AsyncCursor.execute
    killed: list[int] = []

    async def apply_then_die(
        self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any
    ) -> psycopg.AsyncCursor[Any]:
        result = await execute(self, query, *args, **kw)
        if query != text or killed:
            return result
        pid = self.connection.info.backend_pid
        async with raw() as conn:
            assert await scalar(conn, "SELECT pg_terminate_backend(%s)", pid)
        killed.append(pid)
        for _ in range(200):  # the server ends the backend soon: its next statement fails
            await execute(self, "SELECT 1")
            await asyncio.sleep(0.01)
        raise AssertionError(f"backend {pid} outlived pg_terminate_backend")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psycopg.AsyncCursor, "execute", apply_then_die)
        yield killed


async def test_a_release_applied_before_its_connection_died_answers_true_when_resent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The re-sent release finds its own hand-over (the run's token is the one this call
    wrote), not a stale token: True, and the attempt was ended once."""
    async with store() as backend:
        now = await backend.now_ms()
        request = claim_request(now)
        assert (await backend.claim(request)).outcome == Outcome.WON
        lease = Lease("job", now, 1, request.token)
        async with dies_after_applying(backend.sql.release) as killed:
            assert await backend.release(lease)
        assert killed and "retrying on a fresh connection" in caplog.text
        (record,) = await backend.history(HistoryQuery())
        assert (record.status, record.error) == (Status.INTERRUPTED, "handed over")
        assert not await backend.release(lease)  # a new call: the token holds nothing
        assert await backend.heartbeat([lease], 60_000) == [False]
        takeover = TakeoverRequest("job", now, 1, "t2", "b", 60_000, HOUR, 3, False)
        assert (await backend.take_over(takeover)).outcome == Outcome.WON


async def test_a_cancel_applied_before_its_connection_died_answers_true_when_resent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with store() as backend:
        now = await backend.now_ms()
        request = claim_request(now)
        assert (await backend.claim(request)).outcome == Outcome.WON
        async with dies_after_applying(backend.sql.cancel) as killed:
            assert await backend.cancel("job", now)
        assert killed and "retrying on a fresh connection" in caplog.text
        (record,) = await backend.history(HistoryQuery())
        assert record.status == Status.CANCELLED
        assert not await backend.cancel("job", now)  # a new call: the run has ended
        lease = Lease("job", now, 1, request.token)
        assert await backend.heartbeat([lease], 60_000) == [False]
        assert not await backend.release(lease)


class FaultProxy:
    """A local TCP proxy to the test server that can cut every connection and refuse
    new ones: an outage of the store without touching the shared server."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.down = False
        self.port = 0
        self._transports: set[asyncio.WriteTransport] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def cut(self) -> None:
        self.down = True
        for transport in self._transports:
            transport.abort()
        self._transports.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._transports |= {writer.transport, up_writer.transport}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


async def test_scheduler_resumes_after_the_store_was_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every connection is cut and new ones are refused for 2 s: the scheduler logs,
    retries with backoff and runs again soon after the store is back."""
    require_postgres()
    target = int(psycopg.conninfo.conninfo_to_dict(POSTGRES_URL).get("port") or 5432)
    schema = fresh_schema()
    ran: list[tuple[float, int]] = []
    async with FaultProxy(target) as proxy:
        parts = urlsplit(POSTGRES_URL)
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        url = urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{proxy.port}"))
        backend = PostgresBackend(url, schema=schema)
        scheduler = Scheduler(backend, instance_id="solo", heartbeat_ms=200, jitter_ms=0)
        scheduler.every("tick", "200ms", lambda ctx: ran.append((time.time(), ctx.slot)))
        try:
            await scheduler.start()
            await asyncio.sleep(1.0)
            proxy.cut()
            await asyncio.sleep(2.0)
            proxy.down = False
            back = time.time()
            deadline = back + 4
            while time.time() < deadline and not [t for t, _ in ran if t > back + 0.5]:
                await asyncio.sleep(0.05)
            assert scheduler.running
        finally:
            await scheduler.stop()
            drop_schema(schema)
    assert "retrying" in caplog.text
    assert "engine loop crashed" not in caplog.text
    slots = Counter(slot for _, slot in ran)
    assert max(slots.values()) == 1
    assert [t for t, _ in ran if t > back + 0.5], "no run after the store came back"


# Slots across the accepted years (100–9899), before 1970 and with milliseconds.
REASON_SLOTS = [0, -1500, 1764952800123, -58_000_000_000_000, 253_370_764_799_999, 999]


def test_the_skipped_reason_is_worded_as_the_core_words_it() -> None:
    require_postgres()
    from anarchon_core.backends.postgres._sql import _OVERLAP_REASON

    text = _OVERLAP_REASON.replace("%", "%%").replace("v_overlap", "q.v")
    query = f"SELECT {text} FROM unnest(%s::bigint[]) WITH ORDINALITY AS q(v, n) ORDER BY q.n"
    with psycopg.connect(POSTGRES_URL) as conn:
        rows = conn.execute(query, (REASON_SLOTS,)).fetchall()
    assert [row[0] for row in rows] == [overlap_reason(slot) for slot in REASON_SLOTS]
