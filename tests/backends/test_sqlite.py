"""What only the SQLite backend promises: URLs, its layout, and many processes on one file.

The multi-process tests use the ``spawn`` start method: each worker is a fresh
interpreter with its own connection, as separate service processes would be.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from anarchon_core.backend import (
    SCHEMA_VERSION,
    ClaimRequest,
    FinishRequest,
    Lease,
    StoredDefinition,
)
from anarchon_core.backends import backend_from_url
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.backends.sqlite import _batch as _sqlite_batch
from anarchon_core.backends.sqlite import _sql as sql
from anarchon_core.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    SchemaVersionError,
)
from anarchon_core.records import HistoryQuery, Origin, Outcome, Status

HOUR = 3_600_000


def claim_request(slot: int, token: str, job: str = "job") -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id=f"worker:{token[:6]}",
        lease_ms=60_000,
        horizon_ms=HOUR,
        skip_overlap=False,
    )


# -- URLs and construction -----------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///anarchon.sqlite3", "anarchon.sqlite3"),
        ("sqlite:///data/jobs.db", "data/jobs.db"),
        ("sqlite:////var/lib/anarchon/jobs.db", "/var/lib/anarchon/jobs.db"),
    ],
)
def test_url_forms(url: str, path: str) -> None:
    backend = backend_from_url(url)
    assert isinstance(backend, SqliteBackend)
    assert backend.path == os.path.abspath(path)  # resolved once, at definition
    assert backend.describe() == f"sqlite:///{os.path.abspath(path)}"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/x.db",
        "sqlite://",
        "sqlite:///",
        "sqlite:////",
        "sqlite:///data/",
        "sqlite:///x.db?mode=ro",
        "sqlite:x.db",
        "postgresql:///x.db",
    ],
)
def test_bad_url_names_the_url_and_the_accepted_forms(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SqliteBackend.from_url(url)
    message = str(caught.value)
    assert repr(url) in message
    assert "sqlite:///relative/path.db" in message and "sqlite:////abs/path.db" in message


def test_bad_url_masks_credentials() -> None:
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url("sqlite://user:secret@host/x.db")
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("timeout", [0, -5, 1.5, True, "5000"])
def test_bad_busy_timeout(tmp_path: Path, timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="busy_timeout_ms"):
        SqliteBackend(tmp_path / "x.db", busy_timeout_ms=timeout)


async def test_relative_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = SqliteBackend.from_url("sqlite:///rel.sqlite3")
    await backend.open()
    await backend.close()
    assert (tmp_path / "rel.sqlite3").is_file()


# -- life cycle and layout ---------------------------------------------------------
async def test_open_close_reopen_keeps_the_data(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    with pytest.raises(BackendError, match="not open"):
        await backend.claim(claim_request(0, "t"))
    await backend.open()
    await backend.open()  # idempotent
    now = await backend.now_ms()
    assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
    await backend.close()
    await backend.close()  # idempotent
    with pytest.raises(BackendError, match="not open"):
        await backend.history(HistoryQuery())
    await backend.open()
    try:
        assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
        assert len(await backend.history(HistoryQuery())) == 1
    finally:
        await backend.close()


async def test_open_cancelled_mid_connect_leaves_the_backend_closed(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    opening = asyncio.ensure_future(backend.open())
    await asyncio.sleep(0)
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    with pytest.raises(BackendError, match="not open"):
        await backend.history(HistoryQuery())
    await backend.open()
    await backend.close()


async def test_file_uses_wal_and_records_the_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()
    await backend.close()
    with _connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute(sql.GET_VERSION).fetchall() == [(str(SCHEMA_VERSION),)]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"anarchon_meta", "anarchon_runs", "anarchon_attempts", "anarchon_jobs"} <= tables


async def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()
    await backend.close()
    with _connect(path) as conn:
        conn.execute("UPDATE anarchon_meta SET value = ?", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaVersionError) as caught:
        await backend.open()
    assert f"version {SCHEMA_VERSION + 1}" in str(caught.value)
    assert f"version {SCHEMA_VERSION} " in str(caught.value)
    with pytest.raises(BackendError, match="not open"):  # the failed open left nothing behind
        await backend.history(HistoryQuery())


async def test_unreachable_and_corrupt_files_raise_backend_errors(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="missing"):
        await SqliteBackend(tmp_path / "missing" / "x.db").open()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(BackendError) as caught:
        await SqliteBackend(garbage).open()
    assert isinstance(caught.value.__cause__, sqlite3.Error)


async def test_meta_must_be_json(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.open()
    try:
        now = await backend.now_ms()
        assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
        with pytest.raises(ConfigurationError, match="meta"):
            await backend.finish(Lease("job", now, 1, "tok"), Status.SUCCESS, meta={"x": object()})
    finally:
        await backend.close()


async def test_waits_for_another_process_holding_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path, busy_timeout_ms=2000)
    await backend.open()
    try:
        with _connect(path) as other:
            other.execute("BEGIN IMMEDIATE")
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, other.execute, "COMMIT")
            started = time.monotonic()
            now = await backend.now_ms()
            assert (await backend.claim(claim_request(now, "tok"))).outcome == Outcome.WON
            assert time.monotonic() - started >= 0.15
    finally:
        await backend.close()


async def test_a_lock_held_past_the_busy_timeout_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path, busy_timeout_ms=100)
    await backend.open()
    try:
        with _connect(path) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(BackendUnavailable, match="locked") as caught:
                await backend.claim(claim_request(await backend.now_ms(), "tok"))
            other.execute("ROLLBACK")
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    finally:
        await backend.close()


def test_busy_answers_that_do_not_wait_are_retried(tmp_path: Path) -> None:
    answers = [sqlite3.OperationalError("database is locked")] * 3

    def flaky() -> str:
        if answers:
            raise answers.pop()
        return "done"

    assert SqliteBackend(tmp_path / "x.db", busy_timeout_ms=1000)._guarded(flaky) == "done"


#: A page after a cursor (the SQL ``history_filter`` writes).
HISTORY_PAGE = sql.HISTORY_COLUMNS + " WHERE (slot, job, attempt) < (?, ?, ?)" + sql.HISTORY_ORDER


@pytest.mark.parametrize(
    ("statement", "index"),
    [
        (sql.LIVE_RUN, "anarchon_runs_open"),
        (sql.DUE_RUNS, "anarchon_runs_open"),
        (sql.LAST_SCHEDULED_SLOT, "sqlite_autoindex_anarchon_runs_1"),
        (sql.CLAIM_JOB, "sqlite_autoindex_anarchon_jobs_1"),
        (sql.HISTORY_COLUMNS + sql.HISTORY_ORDER, "anarchon_attempts_history"),
        (
            sql.HISTORY_COLUMNS + " WHERE job = ?" + sql.HISTORY_ORDER,
            "sqlite_autoindex_anarchon_attempts_1",
        ),
        (
            sql.HISTORY_COLUMNS + " WHERE status = ?" + sql.HISTORY_ORDER,
            "anarchon_attempts_status_history",
        ),
        (HISTORY_PAGE, "anarchon_attempts_history ((slot,job,attempt)<(?,?,?))"),
        (
            HISTORY_PAGE.replace("WHERE", "WHERE job = ? AND"),
            "sqlite_autoindex_anarchon_attempts_1",
        ),
        (
            HISTORY_PAGE.replace("WHERE", "WHERE status = ? AND"),
            "anarchon_attempts_status_history (status=? AND (slot,job,attempt)<(?,?,?))",
        ),
    ],
)
async def test_hot_queries_use_an_index(tmp_path: Path, statement: str, index: str) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()
    await backend.close()
    with _connect(path) as conn:
        params = (None,) * statement.count("?")
        plan = " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement, params))
    assert index in plan, plan
    if statement.startswith(sql.HISTORY_COLUMNS):  # pages of history come in index order
        assert "TEMP B-TREE" not in plan, plan


async def test_a_file_with_the_former_history_indexes_gets_the_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()
    await backend.close()
    with _connect(path) as conn:  # as a file written before history's order changed
        conn.execute("DROP INDEX anarchon_attempts_history")
        conn.execute("DROP INDEX anarchon_attempts_status_history")
        conn.execute(
            "CREATE INDEX anarchon_attempts_slot "
            "ON anarchon_attempts (slot DESC, job, attempt DESC)"
        )
        conn.execute(
            "CREATE INDEX anarchon_attempts_status "
            "ON anarchon_attempts (status, slot DESC, job, attempt DESC)"
        )
    await backend.open()
    await backend.close()
    with _connect(path) as conn:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"anarchon_attempts_history", "anarchon_attempts_status_history"} <= indexes
    assert not {"anarchon_attempts_slot", "anarchon_attempts_status"} & indexes


async def test_a_file_with_the_former_index_gets_the_open_runs_index(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()
    await backend.close()
    with _connect(path) as conn:  # as a file written before the index was replaced
        conn.execute("DROP INDEX anarchon_runs_open")
        conn.execute(
            "CREATE INDEX anarchon_runs_state ON anarchon_runs (job, state, lease_expires)"
        )
    await backend.open()
    await backend.close()
    with _connect(path) as conn:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "anarchon_runs_open" in indexes and "anarchon_runs_state" not in indexes


async def test_a_file_of_the_previous_layout_gets_the_definition_columns(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with _connect(path) as conn:  # the jobs table as the release before definitions made it
        conn.execute(sql.META_TABLE)
        conn.execute(sql.SET_VERSION, (str(SCHEMA_VERSION),))
        conn.execute(
            "CREATE TABLE anarchon_jobs (job TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0)"
        )
        conn.execute("INSERT INTO anarchon_jobs (job, paused) VALUES ('held', 1)")
    backend = SqliteBackend(path)
    for _ in range(2):  # the upgrade, then an open of the upgraded file: nothing to do
        await backend.open()
        await backend.close()
    with _connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(anarchon_jobs)")]
    assert columns == ["job", "paused", "version", "definition"]
    await backend.open()
    try:
        assert await backend.paused_jobs() == {"held"}
        version = await backend.write_definition("held", "{}", expected=0)
        assert await backend.definitions_since(0) == [StoredDefinition("held", version, "{}")]
        assert await backend.paused_jobs() == {"held"}  # a definition leaves the pause alone
    finally:
        await backend.close()


async def test_versions_never_go_back_when_the_counter_row_is_gone(tmp_path: Path) -> None:
    """The counter row deleted by hand (or by a host's flush of the meta table alone):
    the store continues from the highest version its rows hold."""
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()
    try:
        await backend.write_definition("a", "{}", expected=0)
        b = await backend.write_definition("b", "{}", expected=0)
        with _connect(path) as conn:
            conn.execute("DELETE FROM anarchon_meta WHERE key = 'definitions_version'")
        assert await backend.definitions_version() == b
        c = await backend.write_definition("c", "{}", expected=0)
        assert c == b + 1
        assert await backend.definitions_version() == c
    finally:
        await backend.close()


async def test_due_runs_filters_thousands_of_names(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.open()
    try:
        now = await backend.now_ms()
        for job in ("a", "b", "other"):
            request = replace(claim_request(now - 5000, "t-" + job, job=job), lease_ms=1)
            assert (await backend.claim(request)).outcome == Outcome.WON
        await asyncio.sleep(0.01)
        names = [f"job.{i}" for i in range(10_000)] + ["b", "a"]
        due = await backend.due_runs(names)  # a list, not a set, is accepted too
        assert [(d.job, d.slot, d.reason) for d in due] == [
            ("a", now - 5000, "expired"),
            ("b", now - 5000, "expired"),
        ]
    finally:
        await backend.close()


# -- batched decisions ---------------------------------------------------------------
@pytest.fixture
def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of decisions of each transaction the backends run, in order."""
    sizes: list[int] = []
    run_batch = _sqlite_batch.run_batch

    def recording(conn: sqlite3.Connection, decisions: Any, convert: Any) -> list[Any]:
        sizes.append(len(decisions))
        return run_batch(conn, decisions, convert)

    monkeypatch.setattr(_sqlite_batch, "run_batch", recording)
    return sizes


async def test_a_burst_of_claims_shares_transactions_with_one_winner_each(
    tmp_path: Path, batch_sizes: list[int]
) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.open()
    try:
        now = await backend.now_ms()
        slots = [now - i for i in range(300)]
        requests = [claim_request(slot, f"token-{k}") for k in range(3) for slot in slots]
        claims = await asyncio.gather(*(backend.claim(r) for r in requests))
        winners = Counter(
            r.slot for r, c in zip(requests, claims, strict=True) if c.outcome == Outcome.WON
        )
        assert winners == Counter(slots)
        assert all(c.outcome in (Outcome.WON, Outcome.TAKEN) for c in claims)
        assert sum(batch_sizes) == len(requests)
        assert max(batch_sizes) == _sqlite_batch.MAX_BATCH  # many share, none exceeds the cap
        assert len(await backend.history(HistoryQuery(limit=1000))) == len(slots)
    finally:
        await backend.close()


async def test_a_batch_of_claims_or_finishes_is_queued_as_one_transaction(
    tmp_path: Path, batch_sizes: list[int]
) -> None:
    """``claim_many`` and ``finish_many`` queue their decisions together, in order: one
    transaction up to the cap (not the first alone and the rest after it)."""
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.open()
    try:
        now = await backend.now_ms()
        requests = [claim_request(now, f"token-{n}", job=f"job.{n}") for n in range(40)]
        claims = await backend.claim_many(requests)
        assert {c.outcome for c in claims} == {Outcome.WON}
        leases = [Lease(r.job, r.slot, 1, r.token) for r in requests]
        finishes = [FinishRequest(lease, Status.SUCCESS) for lease in leases]
        assert await backend.finish_many(finishes) == [True] * 40
        assert batch_sizes == [40, 40]
        assert await backend.claim_many([]) == []
        assert await backend.finish_many([]) == []
        assert batch_sizes == [40, 40]
    finally:
        await backend.close()


async def test_a_failing_decision_in_a_batch_rolls_back_only_itself(
    tmp_path: Path, batch_sizes: list[int]
) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path)
    await backend.open()

    def write_then_fail(error: Exception) -> Callable[[sqlite3.Connection, int], None]:
        def decide(conn: sqlite3.Connection, _now: int) -> None:
            conn.execute("INSERT INTO anarchon_jobs (job, paused) VALUES (?, 1)", (str(error),))
            raise error

        return decide

    try:
        now = await backend.now_ms()
        duplicate = sqlite3.IntegrityError("UNIQUE constraint failed")
        outcomes = await asyncio.gather(
            backend.claim(claim_request(now, "first")),  # leaves alone, the rest queue
            backend.claim(claim_request(now - 1, "a")),
            backend._write(write_then_fail(duplicate)),
            backend.claim(claim_request(now - 2, "b")),
            backend._write(write_then_fail(ValueError("a bug"))),
            backend.set_paused("c", True),
            return_exceptions=True,
        )
        assert batch_sizes == [1, 5]
        first, a, integrity, b, bug, paused = outcomes
        assert [c.outcome for c in (first, a, b)] == [Outcome.WON] * 3  # type: ignore[union-attr]
        assert isinstance(integrity, BackendError) and not isinstance(integrity, BackendUnavailable)
        assert integrity.__cause__ is duplicate
        assert isinstance(bug, ValueError) and paused is None
    finally:
        await backend.close()
    with _connect(path) as conn:
        assert conn.execute("SELECT job FROM anarchon_jobs").fetchall() == [("c",)]
        assert conn.execute("SELECT count(*) FROM anarchon_attempts").fetchone() == (3,)


async def test_callers_cancelled_before_or_during_their_batch(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.open()
    release_first, release_second, second_entered = (threading.Event() for _ in range(3))

    def blocker(release: threading.Event, entered: threading.Event | None = None) -> Any:
        def decide(_conn: sqlite3.Connection, _now: int) -> None:
            if entered is not None:
                entered.set()
            assert release.wait(10)

        return decide

    try:
        now = await backend.now_ms()
        first = asyncio.ensure_future(backend._write(blocker(release_first)))
        await asyncio.sleep(0)  # the first batch is in flight and holds the thread
        queued = [
            asyncio.ensure_future(backend.claim(claim_request(now - i, "q"))) for i in range(6)
        ]
        second = asyncio.ensure_future(backend._write(blocker(release_second, second_entered)))
        await asyncio.sleep(0)
        queued[0].cancel()  # before its batch left: dropped, never decided
        release_first.set()
        while not second_entered.is_set():  # the second batch is deciding, not committed
            await asyncio.sleep(0.005)
        queued[1].cancel()  # during its batch: decided and committed, the answer dropped
        release_second.set()
        results = await asyncio.gather(first, *queued, second, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert isinstance(results[2], asyncio.CancelledError)
        assert [c.outcome for c in results[3:7]] == [Outcome.WON] * 4  # type: ignore[union-attr]
        again = [await backend.claim(claim_request(now - i, "later")) for i in range(6)]
        assert [c.outcome for c in again] == [Outcome.WON] + [Outcome.TAKEN] * 5
    finally:
        release_first.set()
        release_second.set()
        await backend.close()


async def test_close_settles_what_was_queued_before_it(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.open()
    now = await backend.now_ms()
    claims = [asyncio.ensure_future(backend.claim(claim_request(now - i, "t"))) for i in range(100)]
    await asyncio.sleep(0)  # every claim is queued
    await backend.close()
    assert [c.result().outcome for c in claims] == [Outcome.WON] * 100
    with pytest.raises(BackendError, match="not open"):
        await backend.claim(claim_request(now, "late"))


async def test_losing_claims_do_not_wait_for_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path, busy_timeout_ms=100)
    await backend.open()
    try:
        now = await backend.now_ms()
        assert (await backend.claim(claim_request(now, "holder"))).outcome == Outcome.WON
        with _connect(path) as other:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            started = time.monotonic()
            lost = await backend.claim(claim_request(now, "loser"))
            assert lost.outcome == Outcome.TAKEN and time.monotonic() - started < 0.09
            # A repeat with the holding token, or a new run, is decided under the lock.
            for token, slot in (("holder", now), ("new", now - 1)):
                with pytest.raises(BackendUnavailable, match="locked"):
                    await backend.claim(claim_request(slot, token))
            other.execute("ROLLBACK")
        assert (await backend.claim(claim_request(now, "holder"))).outcome == Outcome.WON
    finally:
        await backend.close()


async def test_a_transaction_that_cannot_start_fails_each_of_its_decisions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.db"
    backend = SqliteBackend(path, busy_timeout_ms=100)
    await backend.open()
    try:
        now = await backend.now_ms()
        with _connect(path) as other:
            other.execute("BEGIN IMMEDIATE")
            errors = await asyncio.gather(
                *(backend.claim(claim_request(now - i, "t")) for i in range(5)),
                return_exceptions=True,
            )
            other.execute("ROLLBACK")
        assert all(isinstance(e, BackendUnavailable) for e in errors)
        assert len({id(e) for e in errors}) == 5  # one error object per caller
        claims = await asyncio.gather(
            *(backend.claim(claim_request(now - i, "t")) for i in range(5))
        )
        assert all(c.outcome == Outcome.WON for c in claims)  # nothing of the batch was kept
    finally:
        await backend.close()


# -- many processes, one file ------------------------------------------------------
def _claim_worker(path: str, slots: list[int], barrier: Barrier, results: Any) -> None:
    """Claim every slot with this process's own token; report the slots won."""

    async def claim_all(backend: SqliteBackend) -> list[int]:
        token = secrets.token_hex(8)
        won = []
        for slot in slots:
            claim = await backend.claim(claim_request(slot, token))
            if claim.outcome == Outcome.WON:
                won.append(slot)
        return won

    _report(path, barrier, results, claim_all)


def _hammer_worker(path: str, slots: list[int], barrier: Barrier, results: Any) -> None:
    """Claim, heartbeat, finish, sweep and read history as a busy instance would."""

    async def hammer(backend: SqliteBackend) -> list[int]:
        won = []
        for i, slot in enumerate(slots):
            token = secrets.token_hex(8)
            if (await backend.claim(claim_request(slot, token))).outcome == Outcome.WON:
                won.append(slot)
                lease = Lease("job", slot, 1, token)
                assert await backend.heartbeat([lease], 60_000) == [True]
                assert await backend.finish(lease, Status.SUCCESS, meta={"i": i})
            elif i % 5 == 0:
                await backend.due_runs(["job"])
                await backend.history(HistoryQuery(job="job", limit=10))
        return won

    _report(path, barrier, results, hammer)


def _define_worker(path: str, slots: list[int], barrier: Barrier, results: Any) -> None:
    """Create, change and remove definitions of this process's own jobs; report the
    versions the store issued (``slots`` is only their count)."""

    async def define(backend: SqliteBackend) -> list[int]:
        prefix, versions = secrets.token_hex(4), []
        for i in range(len(slots)):
            job = f"{prefix}-{i}"
            created = await backend.write_definition(job, f'{{"n": {i}}}', expected=0)
            changed = await backend.write_definition(job, f'{{"n": {-i}}}', expected=created)
            versions += [created, changed]
            if i % 2:
                versions.append(await backend.write_definition(job, None, expected=changed))
        return versions

    _report(path, barrier, results, define)


def _open_worker(path: str, slots: list[int], barrier: Barrier, results: Any) -> None:
    """Only open (first open of a fresh file, all processes at once) and claim one slot."""

    async def open_only(backend: SqliteBackend) -> list[int]:
        claim = await backend.claim(claim_request(slots[0], secrets.token_hex(8)))
        return [slots[0]] if claim.outcome == Outcome.WON else []

    _report(path, barrier, results, open_only, open_after_barrier=True)


def _report(
    path: str,
    barrier: Barrier,
    results: Any,
    work: Callable[[SqliteBackend], Any],
    *,
    open_after_barrier: bool = False,
) -> None:
    async def main() -> list[int]:
        backend = SqliteBackend(path)
        if not open_after_barrier:
            await backend.open()
        barrier.wait()
        if open_after_barrier:
            await backend.open()
        try:
            return list(await work(backend))
        finally:
            await backend.close()

    try:
        results.put((asyncio.run(main()), None))
    except BaseException as exc:
        results.put(([], f"{type(exc).__name__}: {exc}"))


def _run_processes(
    worker: Callable[..., None], path: Path, processes: int, slots: list[int]
) -> Counter[int]:
    """Run ``worker`` in ``processes`` spawned processes at once; count wins per slot."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(str(path), slots, barrier, results))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode == 0
    results.close()
    results.join_thread()
    errors = [error for _, error in reports if error is not None]
    assert errors == []
    return Counter(slot for won, _ in reports for slot in won)


@pytest.mark.slow
def test_one_winner_per_run_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    now = time.time_ns() // 1_000_000
    slots = [now - i for i in range(200)]
    wins = _run_processes(_claim_worker, path, 6, slots)
    assert wins == Counter(slots)  # every slot won exactly once
    with _connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM anarchon_attempts").fetchone() == (200,)


@pytest.mark.slow
def test_eight_processes_hammering_one_file_never_see_a_lock_error(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    now = time.time_ns() // 1_000_000
    slots = [now - i for i in range(100)]
    wins = _run_processes(_hammer_worker, path, 8, slots)
    assert wins == Counter(slots)
    with _connect(path) as conn:
        statuses = conn.execute("SELECT status, count(*) FROM anarchon_attempts GROUP BY status")
        assert statuses.fetchall() == [("success", 100)]


@pytest.mark.slow
def test_processes_writing_definitions_get_one_version_each_in_commit_order(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    versions = _run_processes(_define_worker, path, 6, list(range(30)))
    assert sorted(versions) == list(range(1, 6 * 75 + 1))  # each issued once, no gap
    assert set(versions.values()) == {1}

    async def read() -> tuple[int, list[StoredDefinition]]:
        backend = SqliteBackend(path)
        await backend.open()
        try:
            return await backend.definitions_version(), await backend.definitions_since(0)
        finally:
            await backend.close()

    newest, stored = asyncio.run(read())
    assert newest == 6 * 75
    assert len(stored) == 6 * 30
    assert [d.body is None for d in stored].count(True) == 6 * 15


@pytest.mark.slow
def test_concurrent_first_open_of_a_fresh_file(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    wins = _run_processes(_open_worker, path, 6, [time.time_ns() // 1_000_000])
    assert sum(wins.values()) == 1
    with _connect(path) as conn:
        assert conn.execute(sql.GET_VERSION).fetchall() == [(str(SCHEMA_VERSION),)]


def _connect(path: Path) -> closing[sqlite3.Connection]:
    """A raw autocommit connection to inspect or disturb the file, closed on exit."""
    return closing(sqlite3.connect(path, isolation_level=None))
