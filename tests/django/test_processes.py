"""``manage.py anarchon run`` in real processes on the project's database.

Three children per test contend for one store: the core's store for the database
engine under test (``core``: a SQLite file, or a schema in the PostgreSQL test database)
and the ORM store (``django``: ``django://default``, the test database itself). The
handlers query the ORM in every run. What is asserted is what ran (the events each
handler appended) and what the store recorded, not timing, except where a bound is
the point (takeover and hand-over speed).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import procs
import pytest
from processes import starts
from procs import cluster

from anarchon_core import Status

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HB = 200  # the test settings' heartbeat


@pytest.fixture(params=["core", "django"])
def store(request: pytest.FixtureRequest, tmp_path: Path, transactional_db: None) -> str:
    return procs.store_url(request.param, tmp_path)


def history(store: str, job: str) -> list[dict[str, object]]:
    """The store's records of ``job`` read through ``manage.py anarchon history --json``."""
    import io
    import json

    from django.core.management import call_command

    out = io.StringIO()
    call_command(
        "anarchon",
        "history",
        "--backend",
        store,
        "--job",
        job,
        "--limit",
        "10000",
        "--json",
        stdout=out,
    )
    return [json.loads(line) for line in out.getvalue().splitlines()]


def grid_slots(first: float, last: float, interval_ms: int) -> list[int]:
    lo = int(first * 1000) // interval_ms + 1
    hi = int(last * 1000) // interval_ms
    return [k * interval_ms for k in range(lo, hi + 1)]


def test_each_slot_runs_exactly_once(store: str, tmp_path: Path) -> None:
    jobs = [
        {"name": "tick", "every": "1s", "kind": "sync", "orm": True},
        {"name": "tock", "every": "1s", "kind": "async", "orm": True, "sleep_s": 0.1},
    ]
    with cluster(tmp_path, store, jobs, JITTER_MS=100) as c:
        c.start_all(3)
        ready = time.time()
        time.sleep(6)
        until = time.time() - 0.5
        c.stop_all()
        events, logs = c.events(), c.logs()
    assert "Traceback" not in logs
    for job in ("tick", "tock"):
        ran = Counter(e["slot"] for e in starts(events, job))
        assert not {s: n for s, n in ran.items() if n > 1}, f"{job} ran twice"
        expected = grid_slots(ready + 0.2, until, 1000)
        assert len(expected) >= 4
        assert not [s for s in expected if s not in ran], f"{job} missed slots"
        ended = [e for e in events if e["e"] == "end" and e["job"] == job]
        assert len(ended) >= len(expected)
    recorded = [r for r in history(store, "tick") if r["status"] == "success"]
    assert len(recorded) == len({r["slot"] for r in recorded}) >= 4


def test_sigkill_runner_is_taken_over(store: str, tmp_path: Path) -> None:
    jobs = [{"name": "long", "every": "3s", "sleep_s": 1.5, "orm": True}]
    with cluster(tmp_path, store, jobs, LEASE_MS=3 * HB) as c:
        c.start_all(3)
        first = c.wait_for(lambda ev: starts(ev, "long"), 10, "first run")[0]
        victim = c.instance_of(first["pid"])
        c.signal(victim, signal.SIGKILL)
        second = c.wait_for(
            lambda ev: [e for e in starts(ev) if e["slot"] == first["slot"] and e["attempt"] == 2],
            8,
            "takeover",
        )[0]
        c.wait_for(lambda ev: [e for e in ev if e["e"] == "end" and e["attempt"] == 2], 5, "end")
        c.stop_all()
        records = {r["attempt"]: r for r in history(store, "long") if r["slot"] == first["slot"]}
    assert second["pid"] != first["pid"]
    assert records[1]["status"] == Status.INTERRUPTED.value
    assert records[2]["status"] == Status.SUCCESS.value
    assert records[2]["instance_id"] != victim


def test_sigstop_runner_is_fenced(store: str, tmp_path: Path) -> None:
    jobs = [{"name": "long", "every": "5s", "sleep_s": 1.5}]
    with cluster(tmp_path, store, jobs, LEASE_MS=3 * HB) as c:
        c.start_all(3)
        first = c.wait_for(lambda ev: starts(ev, "long"), 12, "first run")[0]
        frozen = c.instance_of(first["pid"])
        c.freeze(frozen, "long", first["slot"])
        c.wait_for(
            lambda ev: [
                e
                for e in ev
                if e["e"] == "end" and e["attempt"] == 2 and e["slot"] == first["slot"]
            ],
            8,
            "attempt 2 to finish",
        )
        c.signal(frozen, signal.SIGCONT)
        c.wait_for(
            lambda ev: [e for e in ev if e["e"] == "end" and e["pid"] == first["pid"]],
            5,
            "the stale runner to end",
        )
        time.sleep(0.5)
        stale_log = c.log_path(frozen).read_text()
        c.stop_all()
        records = {r["attempt"]: r for r in history(store, "long") if r["slot"] == first["slot"]}
    assert "lost the run" in stale_log or "finish rejected" in stale_log
    assert records[1]["status"] == Status.INTERRUPTED.value
    assert records[2]["status"] == Status.SUCCESS.value
    assert records[2]["instance_id"] != frozen
    assert 3 not in records


def test_sigterm_hands_over_before_lease_expiry(store: str, tmp_path: Path) -> None:
    lease = 6000  # a backup waiting for expiry would need 6 s
    jobs = [{"name": "long", "every": "3s", "sleep_s": 30}]
    with cluster(tmp_path, store, jobs, LEASE_MS=lease, GRACE_MS=100) as c:
        c.start_all(2)
        first = c.wait_for(lambda ev: starts(ev, "long"), 10, "first run")[0]
        runner = c.instance_of(first["pid"])
        c.signal(runner, signal.SIGTERM)
        sent = time.time()
        second = c.wait_for(
            lambda ev: [e for e in starts(ev) if e["slot"] == first["slot"] and e["attempt"] == 2],
            5,
            "hand-over",
        )[0]
        assert c.procs[runner].wait(5) == 0
        c.stop_all()
        records = {r["attempt"]: r for r in history(store, "long") if r["slot"] == first["slot"]}
    assert second["t"] - sent < lease / 1000 / 2
    assert records[1]["status"] == Status.INTERRUPTED.value
    assert records[1]["error"] == "handed over"
    assert "stopped" in c.log_path(runner).read_text()


def test_pause_and_resume_from_a_fourth_process(store: str, tmp_path: Path) -> None:
    jobs = [{"name": "tick", "every": "1s", "orm": True}]
    with cluster(tmp_path, store, jobs) as c:
        c.start_all(3)
        c.wait_for(lambda ev: len(starts(ev, "tick")) >= 2, 10, "two runs")
        paused = procs.manage("anarchon", "pause", "tick", env=c.env)
        assert paused.returncode == 0, paused.stderr
        paused_at = time.time()
        time.sleep(3.5)
        during = [e for e in starts(c.events(), "tick") if e["slot"] / 1000 > paused_at + 1.2]
        resumed = procs.manage("anarchon", "resume", "tick", env=c.env)
        assert resumed.returncode == 0, resumed.stderr
        resumed_at = time.time()
        c.wait_for(
            lambda ev: [e for e in starts(ev, "tick") if e["slot"] / 1000 > resumed_at], 5, "resume"
        )
        c.stop_all()
        records = history(store, "tick")
    assert during == [], "a paused job ran"
    paused_records = [r for r in records if r["status"] == "paused"]
    assert len(paused_records) >= 2
    assert len({r["slot"] for r in paused_records}) == len(paused_records), "one per slot"
    assert all(r["attempt"] == 0 for r in paused_records)


def test_run_refuses_with_unapplied_migrations(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.sqlite3"  # a database nobody migrated
    result = procs.manage(
        "anarchon",
        "run",
        env={
            "ANARCHON_TEST_DJANGO_DB": "sqlite",
            "ANARCHON_TEST_DJANGO_NAME": str(fresh),
            "ANARCHON_TEST_BACKEND": "django://default",
        },
    )
    assert result.returncode == 2
    assert "unapplied migration" in result.stderr and "manage.py migrate" in result.stderr
    assert "anarchon started" not in result.stderr


def test_run_refuses_on_a_failing_check(tmp_path: Path) -> None:
    result = procs.manage(
        "anarchon", "run", env={"ANARCHON_TEST_SETTINGS": '{"CATCH_UP": "sometimes"}'}
    )
    assert result.returncode != 0
    assert "anarchon.E005" in result.stderr and "CATCH_UP" in result.stderr


def test_run_reload_starts_the_scheduler_under_the_autoreloader(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    log = tmp_path / "reload.log"
    env = procs.child_env(ANARCHON_TEST_BACKEND=f"sqlite:///{tmp_path / 'store.sqlite3'}")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(procs.MANAGE), "anarchon", "run", "--reload"],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,  # the reloader's child is in the same process group
        )
    try:
        deadline = time.monotonic() + 30
        while "anarchon started" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        assert "anarchon started" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_stored_definitions_are_followed_by_every_process(store: str, tmp_path: Path) -> None:
    """``manage.py anarchon jobs add|apply`` on the project's store while three
    ``manage.py anarchon run`` processes run: each slot of the target ``shop.report``
    runs once, a change of schedule is followed without a restart, a removal stops it."""
    from django.core.management import call_command

    jobs = [{"name": "tick", "every": "10s"}]  # the project defines jobs: SPECS is set
    first = tmp_path / "first.json"
    first.write_text(
        '[{"name": "report", "schedule": {"every": "1s"}, "target": "shop.report", "args": [1]}]'
    )
    second = tmp_path / "second.json"
    second.write_text(
        '[{"name": "report", "schedule": {"every": "2s", "offset": "500ms"},'
        ' "target": "shop.report", "args": [2]}]'
    )
    with cluster(tmp_path, store, jobs, JITTER_MS=100) as c:
        c.start_all(3)
        call_command("anarchon", "jobs", "add", str(first), "--backend", store)
        c.wait_for(lambda ev: len(starts(ev, "report")) >= 3, 10, "runs every second")
        call_command("anarchon", "jobs", "apply", str(second), "--yes", "--backend", store)
        changed = time.time()
        c.wait_for(
            lambda ev: len([e for e in starts(ev, "report") if e["t"] > changed + 1]) >= 2,
            10,
            "runs every 2 s",
        )
        empty = tmp_path / "empty.json"
        empty.write_text("[]")
        call_command("anarchon", "jobs", "apply", str(empty), "--yes", "--backend", store)
        removed = time.time()
        time.sleep(2.5)
        c.stop_all()
        events, logs = c.events(), c.logs()
    assert "Traceback" not in logs
    runs = starts(events, "report")
    slots = [e["slot"] for e in runs]
    assert len(slots) == len(set(slots)), "a slot ran twice"
    after = [e for e in runs if e["t"] > changed]
    assert after and all(e["slot"] % 2000 == 500 and e["args"] == [2] for e in after), after
    assert not [e for e in runs if e["t"] > removed + 0.3], "ran after its removal"
