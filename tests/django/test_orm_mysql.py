"""The Django ORM backend on MySQL/MariaDB: the statements, the lock, the clock, collation.

The contract itself is the conformance suite's (``test_orm_conformance``) and the
processes' (``test_processes``), run on every database. Here: every core SQLite
statement the store sends has a MySQL form (checked everywhere, and accepted by the
server on a MySQL run), and, on MySQL only, what is particular to it: names and tokens
compare exactly, one store-wide lock serialises batches (a wait is bounded, a deadlock
repeated, a failing decision rolls back alone), the server's clock judges, and the key
columns are what the migrations promise.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from anarchon_core.backend import ClaimRequest, InstanceInfo, Lease, StoredDefinition
from anarchon_core.backends.sqlite import _sql as sqlite_sql
from anarchon_core.errors import BackendError, BackendUnavailable
from anarchon_core.records import HistoryQuery, Origin, Outcome, Status

MySQLdb = pytest.importorskip("MySQLdb", reason="mysqlclient is not installed (anarchon[mysql])")

from anarchon_core.backends import mysql as mysql_store  # noqa: E402  (needs MySQLdb)
from anarchon_core.backends.mysql import OVERRIDES, translate  # noqa: E402
from anarchon_django.backend import _secret_urls  # noqa: E402

ON_MYSQL = os.environ.get("ANARCHON_TEST_DJANGO_DB") == "mysql"

#: Names of the core's SQL module that are no statement the ORM store sends: the layout
#: (MySQL's own: ``anarchon_core.backends.mysql_layout``) and its version are the
#: migrations' and the backend's open; two states; the history fragments are sent joined
#: (:func:`history_statements`).
NOT_SENT = {
    "META_TABLE",
    "SURROGATE_KEY",
    "GET_VERSION",
    "SET_VERSION",
    "WAITING",
    "PENDING",
    "HISTORY_COLUMNS",
    "HISTORY_ORDER",
}


def core_statements() -> dict[str, str]:
    """Every statement of the core SQLite store's SQL module that the ORM store sends."""
    return {
        name: value
        for name, value in vars(sqlite_sql).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
        if name not in NOT_SENT
    }


def history_statements() -> list[str]:
    """The history statement for each combination of filters (as the store builds it)."""
    from anarchon_core.backends._sql import history_filter

    texts = []
    for job in (None, "a"):
        for status in (None, Status.SUCCESS):
            for since, until, before in ((None, None, None), (1, 2, None), (None, 5, (3, "a", 1))):
                query = HistoryQuery(
                    job=job, status=status, since=since, until=until, before=before, limit=10
                )
                where, _ = history_filter(query, "?")
                texts.append(sqlite_sql.HISTORY_COLUMNS + where + sqlite_sql.HISTORY_ORDER)
    return texts


def every_statement() -> list[str]:
    return [*core_statements().values(), *history_statements()]


# -- the translation (any database) ----------------------------------------------------------
def test_every_statement_the_store_sends_translates() -> None:
    assert len(core_statements()) >= 30  # the module's statements were found
    for text in every_statement():
        mysql = translate(text)
        assert "?" not in mysql
        assert mysql.count("%s") == text.count("?"), text


def oracle(text: str) -> str:
    """The documented SQLite → MySQL rewrites, applied mechanically to a core statement."""
    text = re.sub(r"INSERT OR REPLACE INTO", "REPLACE INTO", text)
    text = re.sub(r"ON CONFLICT \(\w+\) DO UPDATE SET", "ON DUPLICATE KEY UPDATE", text)
    text = re.sub(r"excluded\.(\w+)", r"VALUES(\1)", text)
    text = re.sub(r"(\w+) IS NOT \?", r"NOT (\1 <=> ?)", text)
    text = re.sub(r"(?<![`\w])key(?![`\w])", "`key`", text)  # a reserved word
    return " ".join(text.replace("?", "%s").split())


def test_each_override_is_its_core_statement_rewritten() -> None:
    """The explicit MySQL forms say what the core's statements say: only the syntax moves
    (and a clocked statement reads the server's clock as its last column)."""
    assert set(OVERRIDES) <= set(core_statements().values())
    assert mysql_store.CLOCKED.issubset(OVERRIDES)
    for text, mysql in OVERRIDES.items():
        if text in mysql_store.CLOCKED:
            mysql = mysql.replace(f", {mysql_store.CLOCK_MS} FROM", " FROM")
        assert " ".join(mysql.split()) == oracle(text)


@pytest.mark.parametrize(
    "text",
    [
        "INSERT OR IGNORE INTO anarchon_jobs (job) VALUES (?)",
        "INSERT INTO anarchon_jobs (job) VALUES (?) ON CONFLICT (job) DO NOTHING",
        "DELETE FROM anarchon_runs WHERE slot IS NOT ?",
        "SELECT value FROM anarchon_meta WHERE key = 'schema_version'",
    ],
)
def test_sqlite_syntax_without_a_mysql_form_is_refused(text: str) -> None:
    with pytest.raises(BackendError, match="no form for this SQLite statement"):
        translate(text)


def test_placeholders_change_outside_literals_only() -> None:
    assert translate("SELECT '?', job FROM anarchon_runs WHERE job = ? AND origin != '%'") == (
        "SELECT '?', job FROM anarchon_runs WHERE job = %s AND origin != '%%'"
    )


def test_driver_errors_name_no_password() -> None:
    settings = {"NAME": "db", "USER": "u", "PASSWORD": "pa$$w0rd/xyz", "OPTIONS": {}}

    class Supply:
        executor = None

        def describe(self) -> str:
            return "django://default (mysql db)"

    supply: Any = Supply()
    store = mysql_store.SuppliedMysqlBackend(supply, secrets=_secret_urls(settings))
    error = store._driver_error(MySQLdb.OperationalError(1045, "denied: pa$$w0rd/xyz was"))
    assert isinstance(error, BackendUnavailable)
    assert "pa$$w0rd" not in str(error) and str(error).startswith("django://default (mysql db)")
    assert isinstance(store._driver_error(MySQLdb.DataError(1406, "too long")), BackendError)


# -- on the server (a MySQL run only; not collected elsewhere, so no skips) -------------------
if ON_MYSQL:
    from django.db import connection, transaction

    from anarchon_django._orm_thread import Worker
    from anarchon_django.backend import DjangoBackend
    from anarchon_django.models import KeyField, Run

    def request(job: str, slot: int, token: str, **kwargs: Any) -> ClaimRequest:
        return ClaimRequest(
            job=job,
            slot=slot,
            origin=Origin.SCHEDULE,
            token=token,
            instance_id=kwargs.pop("instance_id", "host:1:abcdef"),
            lease_ms=kwargs.pop("lease_ms", 60_000),
            horizon_ms=600_000,
            skip_overlap=kwargs.pop("skip_overlap", False),
        )

    @pytest.fixture
    def holder(transactional_db: None) -> Iterator[Any]:
        """A connection of its own (not Django's: usable inside the event loop) that
        holds the store's lock until its ``commit()``."""
        settings = connection.settings_dict
        conn = MySQLdb.connect(
            host=settings["HOST"],
            port=int(settings["PORT"]),
            user=settings["USER"],
            password=settings["PASSWORD"],
            database=settings["NAME"],
        )
        try:
            yield conn
        finally:
            conn.rollback()
            conn.close()

    def hold_lock(conn: Any) -> int:
        """Take the store's lock on ``conn``; the server's clock then."""
        cursor = conn.cursor()
        cursor.execute("SET time_zone = '+00:00'")
        cursor.execute("START TRANSACTION")
        cursor.execute(mysql_store.LOCK_ROW, ["1"])  # the row, if a flush removed it
        cursor.execute(mysql_store.LOCK)
        return int(cursor.fetchone()[0])

    def server_clock(conn: Any) -> int:
        cursor = conn.cursor()
        cursor.execute(mysql_store.CLOCK)
        return int(cursor.fetchone()[0])

    def test_every_statement_is_valid_on_the_server(transactional_db: None) -> None:
        with connection.cursor() as cursor:
            for text in every_statement():
                mysql = translate(text)
                cursor.execute(f"EXPLAIN {mysql}", [1] * mysql.count("%s"))

    def test_the_key_columns_are_exact_and_the_times_bigint(transactional_db: None) -> None:
        exact = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_name, column_name, column_type, collation_name "
                "FROM information_schema.columns WHERE table_schema = DATABASE() "
                "AND table_name LIKE 'anarchon\\_%%'"
            )
            columns = {(t, c): (kind, coll) for t, c, kind, coll in cursor.fetchall()}
        keys = {
            ("anarchon_runs", "job"),
            ("anarchon_runs", "state"),
            ("anarchon_runs", "token"),
            ("anarchon_attempts", "job"),
            ("anarchon_jobs", "job"),
            ("anarchon_instances", "instance_id"),
            ("anarchon_meta", "key"),
        }
        for key in keys:
            assert columns[key] == (f"varchar({KeyField.MYSQL_LENGTH})", exact), key
        times = [k for k in columns if k[1] in ("slot", "lease_expires", "retry_at")]
        times += [k for k in columns if k[1].endswith("_at") or k[1] in ("last_seen",)]
        assert len(times) >= 9
        for key in times:
            assert columns[key][0].startswith("bigint"), key

    def test_a_definition_is_utf8mb4_whatever_the_tables_default(
        backend: DjangoBackend, runner: asyncio.Runner
    ) -> None:
        """``definition`` is created in the key columns' utf8mb4 collation: text outside
        the Basic Multilingual Plane (and trailing spaces) comes back as written."""
        exact = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT data_type, collation_name FROM information_schema.columns "
                "WHERE table_schema = DATABASE() AND table_name = 'anarchon_jobs' "
                "AND column_name = 'definition'"
            )
            assert cursor.fetchone() == ("longtext", exact)
        body = '{"description": "nightly 🌙 report ", "target": "reports.send"}  '
        version = runner.run(backend.write_definition("moon", body, expected=0))
        assert runner.run(backend.definitions_since(0)) == [StoredDefinition("moon", version, body)]

    def test_two_stores_writing_definitions_at_once_get_one_version_each(
        transactional_db: None,
    ) -> None:
        """Two stores (two connections, two threads): the store-wide lock orders their
        changes, so the counter issues each version once, in commit order."""
        versions: dict[str, list[int]] = {}

        def writer(name: str, barrier: threading.Barrier) -> None:
            async def main() -> None:
                store = DjangoBackend("default")
                await store.open()
                try:
                    barrier.wait(timeout=30)
                    versions[name] = list(
                        await asyncio.gather(
                            *(
                                store.write_definition(f"{name}-{i}", "{}", expected=0)
                                for i in range(25)
                            )
                        )
                    )
                    for i in range(5):  # both stores change one definition in turn
                        body = f'"{name}{i}"'
                        version = await store.write_definition("shared", body, expected=None)
                        versions[name].append(version)
                finally:
                    await store.close()

            asyncio.run(main())

        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=writer, args=(n, barrier)) for n in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        issued = versions["a"] + versions["b"]
        assert sorted(issued) == list(range(1, 61))

        async def read() -> tuple[int, list[StoredDefinition]]:
            store = DjangoBackend("default")
            await store.open()
            try:
                return await store.definitions_version(), await store.definitions_since(0)
            finally:
                await store.close()

        newest, stored = asyncio.run(read())
        assert newest == 60
        assert len(stored) == 51
        assert [d.version for d in stored] == sorted(d.version for d in stored)
        assert stored[-1].job == "shared" and stored[-1].version == 60

    def test_names_and_tokens_compare_exactly(
        backend: DjangoBackend, runner: asyncio.Runner
    ) -> None:
        """MySQL's default collations would make these one job, one token, one instance."""
        now = runner.run(backend.now_ms())
        for job in ("Report", "report", "report "):
            assert runner.run(backend.claim(request(job, now, f"t-{job}"))).outcome == "won"
        assert Run.objects.filter(slot=now).count() == 3
        runner.run(backend.set_paused("Report", True))
        assert runner.run(backend.paused_jobs()) == {"Report"}
        history = runner.run(backend.history(HistoryQuery(job="report")))
        assert [r.job for r in history] == ["report"]
        # A token differing in case or a trailing space holds nothing.
        assert runner.run(backend.heartbeat([Lease("report", now, 1, "T-report")], 1000)) == [False]
        assert runner.run(backend.heartbeat([Lease("report", now, 1, "t-report ")], 1000)) == [
            False
        ]
        assert runner.run(backend.heartbeat([Lease("report", now, 1, "t-report")], 1000)) == [True]

    def test_a_batch_waits_for_the_lock_and_is_judged_by_the_clock_after_it(
        backend: DjangoBackend, runner: asyncio.Runner, holder: Any
    ) -> None:
        now = runner.run(backend.now_ms())
        hold_lock(holder)

        async def contend() -> tuple[int, Any]:
            claim = asyncio.ensure_future(backend.claim(request("locked", now, "t1")))
            await asyncio.sleep(0.5)  # long enough to have finished, were it not waiting
            assert not claim.done()
            released_at = server_clock(holder)
            holder.commit()
            return released_at, await asyncio.wait_for(claim, 30)

        released_at, won = runner.run(contend())
        assert won.outcome == Outcome.WON
        assert won.store_now is not None and won.store_now >= released_at

    def test_a_lock_wait_is_bounded(runner: asyncio.Runner, holder: Any) -> None:
        worker = Worker("default", "django://default (mysql test)")
        store = mysql_store.SuppliedMysqlBackend(
            worker,
            secrets=_secret_urls(connection.settings_dict),
            lock_timeout_ms=1000,
        )
        runner.run(store.open())
        try:
            now = runner.run(store.now_ms())
            hold_lock(holder)
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match="Lock wait timeout"):
                runner.run(store.claim(request("bounded", now, "t1")))
            assert time.monotonic() - started < 20
            holder.commit()
            assert runner.run(store.claim(request("bounded", now, "t1"))).outcome == "won"
        finally:
            runner.run(store.close())
            runner.run(worker.close())

    def test_a_deadlock_repeats_the_batch(
        backend: DjangoBackend, runner: asyncio.Runner, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        lock = mysql_store.Connection.lock
        calls: list[int] = []

        def deadlock_once(self: Any) -> int:
            calls.append(1)
            if len(calls) == 1:
                raise MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock")
            return lock(self)

        monkeypatch.setattr(mysql_store.Connection, "lock", deadlock_once)
        now = runner.run(backend.now_ms())
        assert runner.run(backend.claim(request("deadlocked", now, "t1"))).outcome == "won"
        assert len(calls) == 2

    def test_a_failing_decision_rolls_back_alone(
        backend: DjangoBackend, runner: asyncio.Runner
    ) -> None:
        """Too long for its column (strict mode): that claim fails, its batch's others
        commit, and nothing stays locked."""
        now = runner.run(backend.now_ms())
        long = "x" * (KeyField.MYSQL_LENGTH + 1)
        batch = [request("ok1", now, "a"), request(long, now, "b"), request("ok2", now, "c")]
        with pytest.raises(BackendError, match="too long"):
            runner.run(backend.claim_many(batch))
        assert set(Run.objects.filter(slot=now).values_list("job", flat=True)) == {"ok1", "ok2"}
        with pytest.raises(BackendError, match="too long"):
            runner.run(backend.claim(request(long, now, "d")))  # alone: no savepoint
        assert runner.run(backend.claim(request("ok3", now, "e"))).outcome == "won"
        with transaction.atomic(), connection.cursor() as cursor:  # not left locked
            cursor.execute(mysql_store.LOCK.replace("FOR UPDATE", "FOR UPDATE NOWAIT"))

    def test_the_store_clock_is_the_servers(backend: DjangoBackend, runner: asyncio.Runner) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))")
            before = int(cursor.fetchone()[0]) // 1000
        now = runner.run(backend.now_ms())
        with connection.cursor() as cursor:
            cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))")
            after = int(cursor.fetchone()[0]) // 1000
        assert before <= now <= after
        won = runner.run(backend.claim(request("clock", now, "t1", lease_ms=60_000)))
        lease_expires = Run.objects.get(job="clock").lease_expires
        assert won.store_now is not None and lease_expires == won.store_now + 60_000

    def test_nothing_is_judged_by_this_hosts_clock(
        backend: DjangoBackend, runner: asyncio.Runner, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """This host's clock ten days ahead changes no answer: the server's clock judges
        (the core SQLite store reads its host's, which is the store clock there)."""
        from anarchon_core import backend as core_backend
        from anarchon_core.backends import sqlite as sqlite_store
        from anarchon_core.backends.sqlite import _decisions

        now = runner.run(backend.now_ms())
        ahead = now + 10 * 86_400_000
        for module in (core_backend, sqlite_store, _decisions):
            monkeypatch.setattr(module, "wall_clock_ms", lambda: ahead)
        assert abs(runner.run(backend.now_ms()) - now) < 60_000
        won = runner.run(backend.claim(request("clocked", now, "t1", lease_ms=60_000)))
        lost = runner.run(backend.claim(request("clocked", now, "t2")))  # the precheck's
        assert won.outcome == Outcome.WON and lost.outcome == Outcome.TAKEN
        for answer in (won, lost):
            assert answer.store_now is not None and abs(answer.store_now - now) < 60_000
        assert runner.run(backend.due_runs(["clocked"])) == []  # its lease is live
        info = InstanceInfo("i1", "host", 1, "1", now, now, {})
        runner.run(backend.register(info, 60_000))
        assert [i.instance_id for i in runner.run(backend.instances())] == ["i1"]

    def test_a_missing_lock_row_is_written_again(
        backend: DjangoBackend, runner: asyncio.Runner
    ) -> None:
        """A flush of the tables removes the row every batch locks: the next batch adds it."""
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM anarchon_meta")
        now = runner.run(backend.now_ms())
        assert runner.run(backend.claim(request("relocked", now, "t1"))).outcome == "won"
        with connection.cursor() as cursor:
            cursor.execute("SELECT value FROM anarchon_meta WHERE `key` = 'schema_version'")
            assert cursor.fetchone() == ("1",)

    def test_concurrent_batches_on_two_backends_have_one_winner(
        transactional_db: None,
    ) -> None:
        """Two stores (two connections, two threads) claiming the same runs at once."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))")
            now = int(cursor.fetchone()[0]) // 1000
        slots = [now - 1000 * i for i in range(30)]
        answers: dict[str, list[Outcome]] = {}

        def claimer(name: str, barrier: threading.Barrier) -> None:
            async def main() -> None:
                store = DjangoBackend("default")
                await store.open()
                try:
                    barrier.wait(timeout=30)
                    claims = await asyncio.gather(
                        *(store.claim(request("race", s, f"{name}-{s}")) for s in slots)
                    )
                    answers[name] = [c.outcome for c in claims]
                finally:
                    await store.close()

            asyncio.run(main())

        barrier = threading.Barrier(2)
        first = threading.Thread(target=claimer, args=("a", barrier))
        first.start()
        second = threading.Thread(target=claimer, args=("b", barrier))
        second.start()
        first.join(60)
        second.join(60)
        assert set(answers) == {"a", "b"}
        for a, b in zip(answers["a"], answers["b"], strict=True):
            assert sorted([a, b]) == [Outcome.TAKEN, Outcome.WON]
