"""The Django ORM backend's own behaviour beyond the shared suites.

URLs and aliases, the migrated layout and its version, the backend's own thread and
connection (outer ``atomic`` blocks, dropped connections), the CLI through the
``anarchon.backends`` entry point, and one winner per slot across OS processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from anarchon_core.backend import ClaimRequest, Lease
from anarchon_core.backends import backend_from_url
from anarchon_core.errors import BackendError, ConfigurationError, SchemaVersionError
from anarchon_core.records import Origin, Outcome, Status
from anarchon_django import _schema as schema
from anarchon_django.backend import DjangoBackend
from anarchon_django.models import HistoryRecord, Job, Run, StoreMeta

ROOT = Path(__file__).resolve().parents[2]
JOB = "orm.job"


def claim_request(slot: int, token: str, *, job: str = JOB) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id=f"host:{os.getpid()}:{token[:6]}",
        lease_ms=60_000,
        horizon_ms=600_000,
        skip_overlap=False,
    )


# -- URLs and aliases ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "alias"),
    [("django://default", "default"), ("django://", "default"), ("django:///", "default")],
)
def test_url_names_the_database_alias(url: str, alias: str) -> None:
    store = DjangoBackend.from_url(url)
    assert store.alias == alias
    assert store.name == "django"
    assert store.capabilities.lease and store.capabilities.store_clock
    assert store.capabilities.finish


def test_the_core_factory_builds_it() -> None:
    assert isinstance(backend_from_url("django://default"), DjangoBackend)


@pytest.mark.parametrize(
    "url", ["django://default/x", "django://default?x=1", "django://u:secret@default", "sqlite://x"]
)
def test_malformed_urls_are_refused_without_secrets(url: str) -> None:
    with pytest.raises(ConfigurationError, match="django://ALIAS") as raised:
        DjangoBackend.from_url(url)
    assert "secret" not in str(raised.value)


def test_an_unknown_alias_names_the_configured_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"'nope'.*configured: 'default'"):
        DjangoBackend.from_url("django://nope")


def test_describe_names_the_vendor_and_database() -> None:
    text = DjangoBackend().describe()
    assert text.startswith(f"django://default ({connection.vendor} ")
    assert text.endswith(f" {connection.settings_dict['NAME']})")
    password = connection.settings_dict.get("PASSWORD")
    assert not password or password not in text


# -- the layout --------------------------------------------------------------------------
@pytest.mark.django_db
def test_models_and_migrations_agree() -> None:
    call_command("makemigrations", "anarchon_django", "--check", "--dry-run", verbosity=0)


def test_the_models_read_what_the_backend_wrote(
    backend: DjangoBackend, runner: asyncio.Runner
) -> None:
    now = runner.run(backend.now_ms())
    won = runner.run(backend.claim(claim_request(now, "t1")))
    assert won.outcome == Outcome.WON
    runner.run(backend.finish(Lease(JOB, now, 1, "t1"), Status.SUCCESS, meta={"k": [1]}))
    runner.run(backend.set_paused("other", True))
    record = HistoryRecord.objects.get(job=JOB, slot=now, attempt=1)
    assert (record.status, record.meta, record.origin) == ("success", {"k": [1]}, "schedule")
    assert record.claimed_at is not None and record.finished_at is not None
    assert Run.objects.get(job=JOB, slot=now).state == "success"
    assert Job.objects.get(job="other").paused is True
    assert StoreMeta.objects.get(key="schema_version").value == "1"


def test_a_newer_schema_version_is_refused(transactional_db: None, runner: asyncio.Runner) -> None:
    StoreMeta.objects.update_or_create(key="schema_version", defaults={"value": "99"})
    store = DjangoBackend()
    with pytest.raises(SchemaVersionError, match="version 99"):
        runner.run(store.open())
    runner.run(store.close())  # never opened: nothing to do


def test_missing_tables_ask_for_migrate(transactional_db: None, runner: asyncio.Runner) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE anarchon_jobs")
    try:
        with pytest.raises(ConfigurationError, match=r"anarchon_jobs.*manage\.py migrate"):
            runner.run(DjangoBackend().open())
    finally:
        # As the migrations leave it: the core's layout (idempotent: only the table is made).
        with connection.cursor() as cursor:
            for text in schema.statements(connection):
                cursor.execute(text)


# -- the backend's own thread and connection -----------------------------------------------
def test_calls_run_on_the_backends_own_thread_and_connection(
    backend: DjangoBackend, runner: asyncio.Runner
) -> None:
    def where(conn: Any) -> tuple[str, int]:
        return threading.current_thread().name, id(conn)

    name, conn_id = runner.run(backend._worker.call(where))
    assert name.startswith("anarchon-django")
    assert conn_id != id(connection)
    assert runner.run(backend._worker.call(where)) == (name, conn_id)


def test_an_outer_atomic_block_neither_wraps_nor_is_poisoned_by_a_claim(
    backend: DjangoBackend, runner: asyncio.Runner
) -> None:
    """Decided: a claim inside the caller's ``atomic()`` is its own committed decision."""
    now = runner.run(backend.now_ms())
    with transaction.atomic():
        assert runner.run(backend.claim(claim_request(now, "t1"))).outcome == Outcome.WON
        lost = runner.run(backend.claim(claim_request(now, "t2")))
        assert lost.outcome == Outcome.TAKEN  # the loser raised nothing, logged nothing
        assert Run.objects.filter(job=JOB, slot=now).count() == 1  # still usable
        transaction.set_rollback(True)
    assert Run.objects.get(job=JOB, slot=now).token == "t1"  # the rollback undid nothing


# Only PostgreSQL has a server connection to drop: on SQLite the test is not collected
# (rather than skipped), so that a CI run shows no skips.
if os.environ.get("ANARCHON_TEST_DJANGO_DB") == "postgres":

    def test_a_dropped_connection_reconnects(
        backend: DjangoBackend, runner: asyncio.Runner
    ) -> None:
        def pid(conn: Any) -> int:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                return int(cur.fetchone()[0])

        before = runner.run(backend._worker.call(pid))
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [before])
        now = runner.run(backend.now_ms())  # the dead connection is replaced, once, at once
        assert runner.run(backend.claim(claim_request(now, "t1"))).outcome == Outcome.WON
        assert runner.run(backend._worker.call(pid)) != before

    def test_a_release_applied_before_its_connection_died_answers_true_when_resent(
        backend: DjangoBackend, runner: asyncio.Runner, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The release commits, then its connection dies: the worker re-sends it on a
        fresh connection, and the re-send recognises its own hand-over."""
        import psycopg

        now = runner.run(backend.now_ms())
        assert runner.run(backend.claim(claim_request(now, "t1"))).outcome == Outcome.WON
        release = backend.inner.sql.release  # type: ignore[attr-defined]
        execute = psycopg.Cursor.execute
        killed: list[int] = []

        def apply_then_die(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            result = execute(self, query, *args, **kwargs)
            if query != release or killed:
                return result
            pid = self.connection.info.backend_pid
            with psycopg.connect(self.connection.info.dsn, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", [pid])
            killed.append(pid)
            for _ in range(200):  # the server ends the backend soon: its next statement fails
                execute(self, "SELECT 1")
                time.sleep(0.01)
            raise AssertionError(f"backend {pid} outlived pg_terminate_backend")

        monkeypatch.setattr(psycopg.Cursor, "execute", apply_then_die)
        lease = Lease(JOB, now, 1, "t1")
        assert runner.run(backend.release(lease))
        monkeypatch.undo()
        assert killed
        record = HistoryRecord.objects.get(job=JOB, slot=now, attempt=1)
        assert (record.status, record.error) == (Status.INTERRUPTED, "handed over")
        assert not runner.run(backend.release(lease))  # a new call: the token holds nothing


# MariaDB/MySQL: the server ends the backend's connection; the next call is repeated once,
# at once, on a fresh one (collected on MySQL only, as the PostgreSQL tests above).
if os.environ.get("ANARCHON_TEST_DJANGO_DB") == "mysql":

    def test_a_killed_connection_reconnects(backend: DjangoBackend, runner: asyncio.Runner) -> None:
        def thread_id(conn: Any) -> int:
            return int(conn.connection.thread_id())

        before = runner.run(backend._worker.call(thread_id))
        with connection.cursor() as cur:
            cur.execute("KILL CONNECTION %s", [before])
        now = runner.run(backend.now_ms())  # the dead connection is replaced, once, at once
        assert runner.run(backend.claim(claim_request(now, "t1"))).outcome == Outcome.WON
        assert runner.run(backend._worker.call(thread_id)) != before


def test_calls_after_close_are_refused(transactional_db: None, runner: asyncio.Runner) -> None:
    store = DjangoBackend()
    runner.run(store.open())
    runner.run(store.open())  # idempotent
    runner.run(store.close())
    runner.run(store.close())
    with pytest.raises(BackendError, match="not open"):
        runner.run(store.now_ms())


# -- other processes -------------------------------------------------------------------------
@pytest.fixture
def process_env(transactional_db: None, tmp_path: Path) -> dict[str, str]:
    """The environment of a process that uses this test's database through ``django://``.

    The test project's settings take the test database's name from
    ``ANARCHON_TEST_DJANGO_NAME``. Where the installed metadata lacks the
    ``anarchon.backends`` entry point (an editable install made before it existed), a
    stand-in distribution on the path declares it, so the core factory finds it the
    way it does when installed.
    """
    if not any(ep.name == "django" for ep in entry_points(group="anarchon.backends")):
        info = tmp_path / "anarchon_django_entry_point-0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: anarchon-django-entry-point\nVersion: 0\n"
        )
        (info / "entry_points.txt").write_text(
            "[anarchon.backends]\ndjango = anarchon_django.backend:DjangoBackend.from_url\n"
        )
    path = [str(tmp_path), str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "ANARCHON_TEST_DJANGO_NAME": str(connection.settings_dict["NAME"]),
    }


def test_cli_history_reads_the_orm_store(
    backend: DjangoBackend, runner: asyncio.Runner, process_env: dict[str, str]
) -> None:
    now = runner.run(backend.now_ms())
    runner.run(backend.claim(claim_request(now, "t1")))
    runner.run(backend.finish(Lease(JOB, now, 1, "t1"), Status.FAILED, error="boom"))
    command = [sys.executable, "-m", "anarchon_core", "history"]
    done = subprocess.run(
        [*command, "--backend", "django://default", "--json"],
        env=process_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    record = json.loads(line)
    assert (record["job"], record["slot"], record["status"]) == (JOB, now, "failed")
    assert record["error"] == "boom"


CLAIMER = """
import asyncio, json, os, sys, time
import django
django.setup()
from anarchon_core.backend import ClaimRequest
from anarchon_core.backends import backend_from_url
from anarchon_core.records import Origin, Outcome

async def main():
    job, slots, start_at = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
    store = backend_from_url("django://default")
    await store.open()
    try:
        me = f"p{os.getpid()}"
        await asyncio.sleep(max(0.0, start_at - time.time()))
        claims = [
            store.claim(ClaimRequest(job, s, Origin.SCHEDULE, f"{me}-{s}", me, 60000, 600000,
                                     False))
            for s in slots
        ]
        outcomes = await asyncio.gather(*claims)
    finally:
        await store.close()
    print(json.dumps([[s, str(o.outcome)] for s, o in zip(slots, outcomes)]))

asyncio.run(main())
"""


@pytest.mark.slow
def test_processes_claiming_the_same_slots_have_one_winner_each(
    backend: DjangoBackend, runner: asyncio.Runner, process_env: dict[str, str]
) -> None:
    now = runner.run(backend.now_ms())
    slots = [now - 1000 * i for i in range(40)]
    start_at = time.time() + 3.0  # every process set up and connected: they contend
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, JOB, json.dumps(slots), str(start_at)],
            env=process_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    winners: dict[int, int] = {}
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        for slot, outcome in json.loads(out):
            assert outcome in ("won", "taken"), outcome
            if outcome == "won":
                winners[slot] = winners.get(slot, 0) + 1
    assert winners == dict.fromkeys(slots, 1)
    assert Run.objects.filter(job=JOB).count() == len(slots)
    assert HistoryRecord.objects.filter(job=JOB, status="running").count() == len(slots)
