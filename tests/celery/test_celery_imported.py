"""Real processes: four ``celery beat -S anarchon`` send what ``import-celery-beat`` imported.

The migration path of docs/django.md, end to end: a Django project's django-celery-beat
database (a SQLite file), its ``PeriodicTask`` rows made through django-celery-beat's own
models, is imported by ``manage.py anarchon import-celery-beat --backend URL --namespace
NS`` (a child process, with the beats' Celery app loaded, so the task names are checked
against it) into a shared lease store. Four beats of that store and namespace then send:

* every slot of each enabled row exactly once, with the row's queue, headers, priority
  and arguments, under its deterministic task id (sent once across all four beats);
* never a slot of the row that was disabled in django-celery-beat (each beat says why it
  does not plan it);
* after an imported definition is edited in the store (``stored_jobs.update_definition``
  at the version read: every 1 s -> every 2 s, another header value and kwargs), the new
  schedule and options, without a restart: each live beat logs the new version, and the
  store refuses the old version's claims from the moment the edit commits;

and one beat SIGKILLed in the middle loses nothing: every slot of the checked window is
executed exactly once. The window is checked by slot, never by wall-clock precision.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "django_celery_beat",
    reason="django-celery-beat is not installed (a dev dependency on Python < 3.13 only)",
)

from celery_cluster import (
    EVERY_SECOND,
    HERE,
    NAMESPACE,
    ROOT,
    CeleryCluster,
    Run,
    celery_cluster,
    check_exactly_once,
    grid,
    in_window,
    next_second,
    now_ms,
    sleep_until,
    task_ids,
)
from processes import wait_until
from registry import LEASE_URLS, load_store_modules
from services import require_tcp

from anarchon_core import stored_jobs
from anarchon_core.backends import backend_from_url
from anarchon_core.definitions import Definition
from anarchon_core.schedules import Every
from anarchon_django.celery_beat import MARK, definition_name

load_store_modules()

pytestmark = pytest.mark.slow

TASK = "celery_beat_app.record"
MANAGE = ROOT / "tests" / "django_project" / "manage.py"
#: The rows' names in django-celery-beat; the second is no valid definition name.
EVERY_ONE, EVERY_TWO, OFF = "imported-every-second", "Every two seconds (tenant t2)", "off"
ONE, TWO, DISABLED = (f"{NAMESPACE}:{definition_name(n)}" for n in (EVERY_ONE, EVERY_TWO, OFF))

#: Run by ``python -c`` in the Django project: django-celery-beat's models make the rows.
MAKE_ROWS = """
import json, sys
import django
django.setup()
from django_celery_beat.models import IntervalSchedule, PeriodicTask
for row in json.loads(sys.argv[1]):
    every, _ = IntervalSchedule.objects.get_or_create(
        every=row.pop("every"), period=IntervalSchedule.SECONDS
    )
    PeriodicTask.objects.create(interval=every, **row)
print(PeriodicTask.objects.count(), "rows")
"""
#: ``manage.py`` itself, run after importing the beats' Celery app, as a project whose
#: package loads its Celery app does: the import checks the task names against it.
MANAGE_WITH_APP = (
    f"import runpy, sys, celery_beat_app; sys.argv[0] = {str(MANAGE)!r}; "
    f"runpy.run_path({str(MANAGE)!r}, run_name='__main__')"
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """A Redis lease store: the path from the rows to the beats is the same on every
    store (test_celery_stored.py runs the beats on PostgreSQL too)."""
    require_tcp("Redis", "127.0.0.1", 6379)  # the broker and the records
    with LEASE_URLS["redis"](tmp_path) as url:
        yield url


def django_run(tmp_path: Path, *args: str) -> str:
    """Run ``python ARGS`` in the test Django project on the SQLite file of ``tmp_path``;
    its output (a failure shows it)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(HERE)]),
        "DJANGO_SETTINGS_MODULE": "django_project.settings",
        "ANARCHON_TEST_DJANGO_DB": "sqlite",
        "ANARCHON_TEST_DJANGO_NAME": str(tmp_path / "celery-beat.sqlite3"),
    }
    done = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"python {' '.join(args)} exited {done.returncode}:\n{out}"
    return out


def make_rows(tmp_path: Path, c: CeleryCluster) -> list[dict[str, Any]]:
    """Migrate django-celery-beat's tables and make three rows with its models."""
    rows: list[dict[str, Any]] = [
        {
            "name": EVERY_ONE,
            "task": TASK,
            "every": 1,
            "kwargs": json.dumps({"run": 1}),
            "queue": f"{c.queue}-one",
            "headers": json.dumps({"tenant": "t1"}),
        },
        {
            "name": EVERY_TWO,
            "task": TASK,
            "every": 2,
            "args": json.dumps(["two"]),
            "queue": f"{c.queue}-two",
            "headers": json.dumps({"tenant": "t2"}),
            "priority": 7,
            "description": "the second row",
        },
        {"name": OFF, "task": TASK, "every": 1, "queue": f"{c.queue}-one", "enabled": False},
    ]
    django_run(tmp_path, str(MANAGE), "migrate", "django_celery_beat", "-v", "0")
    assert "3 rows" in django_run(tmp_path, "-c", MAKE_ROWS, json.dumps(rows))
    return rows


def stored(store: str) -> dict[str, Definition]:
    """The definitions of the beats' namespace, by store name."""

    async def read() -> list[Definition]:
        backend = backend_from_url(store)
        await backend.open()
        try:
            return await stored_jobs.definitions(backend, NAMESPACE)
        finally:
            await backend.close()

    return {f"{NAMESPACE}:{d.name}": d for d in asyncio.run(read())}


def edit(store: str, old: Definition, **changes: Any) -> Definition:
    """Update ``old`` in the store at the version read, through the store API."""
    new = Definition.from_json({**old.to_json(), **changes}, version=old.version)

    async def call() -> Definition:
        backend = backend_from_url(store)
        await backend.open()
        try:
            return await stored_jobs.update_definition(backend, new, NAMESPACE)
        finally:
            await backend.close()

    return asyncio.run(call())


def kill_between_sends(c: CeleryCluster, beat: subprocess.Popen[bytes], wanted: set[Run]) -> int:
    """SIGKILL ``beat`` in the middle of a second in which it holds no unsent run: once
    every wanted run of that second and before is executed (so published), before the
    next second's claims. Tries three seconds; the second it was killed in."""
    first = min(slot for _, slot in wanted)
    for second in range(first + 2000, first + 5000, 1000):
        sleep_until(second + 300)
        due = {run for run in wanted if run[1] <= second}
        while now_ms() < second + 850 and not due <= c.executed():
            sleep_until(now_ms() + 20)
        if due <= c.executed() and now_ms() < second + 900:
            break
    beat.send_signal(signal.SIGKILL)
    return second


def test_four_beats_send_imported_rows_and_follow_an_edit(tmp_path: Path, store: str) -> None:
    with celery_cluster(tmp_path, store=store) as c:
        rows = make_rows(tmp_path, c)
        one_queue, two_queue = rows[0]["queue"], rows[1]["queue"]
        c.worker("worker", "-l", "warning", queues=(one_queue, two_queue))
        out = django_run(
            tmp_path,
            "-c",
            MANAGE_WITH_APP,
            "anarchon",
            "import-celery-beat",
            "--backend",
            store,
            "--namespace",
            NAMESPACE,
        )
        imported = stored(store)
        names = [f"beat{i}" for i in range(4)]
        beats = [c.beat(name) for name in names]
        c.wait_started(names)
        # The imported definitions are read at start: the first slot can be near.
        start = next_second(lead_ms=2000)
        end = start + 6000
        first_one = grid(ONE, start, end, 1000)
        phase1 = first_one | grid(TWO, start, end, 2000) | grid(EVERY_SECOND, start, end, 1000)
        killed_in = kill_between_sends(c, beats[0], phase1)
        sleep_until(end + 300)
        c.wait_executed(phase1)  # no run of the window left to claim: edit now
        current = edit(
            store,
            imported[ONE],
            schedule={"every": "2s"},
            kwargs={"run": 2},
            target_options={"queue": one_queue, "headers": {"tenant": "t1-edited"}},
        )
        edited_at = now_ms()
        followed = f"stored job {ONE} changed (version {current.version})"
        wait_until(
            lambda: all(followed in c.log(name) for name in names[1:]),
            15,
            "every live beat to follow the edit",
        )
        start2 = next_second(lead_ms=1000)
        start2 += start2 % 2000  # an even second: a slot of the 2-s grid
        end2 = start2 + 6000
        sleep_until(end2 + 1500)
        second_one = grid(ONE, start2, end2, 2000)
        twos = grid(TWO, start, end2, 2000)
        entries = grid(EVERY_SECOND, start, end2, 1000)
        wanted = first_one | second_one | twos | entries
        executed = c.wait_executed(wanted, timeout=20)
        verdict = check_exactly_once(executed, wanted)
        sent = in_window(c.sends(), wanted)
        killed = beats[0].wait(5)
        logs = "".join(c.log(name) for name in names)
    assert killed == -signal.SIGKILL
    assert "Traceback" not in logs

    # The import: every row, the task names checked against the beats' Celery app.
    assert "3 row(s): 3 imported, 0 updated, 0 unchanged, 0 skipped" in out, out
    assert "task not registered" not in out and "unverified" not in out, out
    assert set(imported) == {ONE, TWO, DISABLED}
    assert imported[ONE].schedule == Every("1s") and imported[TWO].schedule == Every("2s")
    assert dict(imported[TWO].target_options) == {
        "queue": two_queue,
        "headers": {"tenant": "t2"},
        "priority": 7,
    }
    assert imported[TWO].description == f'{MARK}"{EVERY_TWO}"\nthe second row'
    assert not imported[DISABLED].enabled
    assert current.version > imported[ONE].version

    # Every slot of the window sent once (by one of the four beats) and executed once:
    # a 1-s or 2-s slot is past its horizon before the dead beat's lease (6 s) expires,
    # so none is taken over and re-sent; and the kill found no run in flight.
    assert not verdict.takeovers and verdict.once == verdict.runs == verdict.executions
    assert sent == Counter(dict.fromkeys(task_ids(wanted), 1)), sent
    assert start + 2000 <= killed_in <= end

    # Each row's send options; the disabled row never sent, not even once.
    ones = [row for row in executed if row["job"] == ONE]
    twos_rows = [row for row in executed if row["job"] == TWO]
    for row in twos_rows:
        assert (row["routing_key"], row["priority"], row["tenant"]) == (two_queue, 7, "t2"), row
        assert row["args"] == ["two"] and row["kwargs"] == {}, row
    by_slot = {int(row["slot"]): row for row in ones}
    for _, slot in first_one:
        row = by_slot[slot]
        assert (row["routing_key"], row["tenant"], row["kwargs"]) == (one_queue, "t1", {"run": 1})
    for _, slot in second_one:  # the edit: its header value and kwargs, on the 2-s grid
        row = by_slot[slot]
        assert (row["routing_key"], row["tenant"], row["kwargs"]) == (
            one_queue,
            "t1-edited",
            {"run": 2},
        ), row
    assert not [row for row in executed if row["job"] == DISABLED]
    assert f"sending {definition_name(OFF)} (" not in logs
    not_planned = f"stored job {DISABLED} is not planned here: disabled: disabled in django"
    assert all(not_planned in c.log(name) for name in names)
    # Once the edit committed, the store refused the old version's claims: no slot of
    # the 1-s grid (an odd second) was sent after it.
    late_odd = sorted(s for s in by_slot if s > edited_at + 1000 and s % 2000)
    assert not late_odd, f"1-s slots sent after the edit: {late_odd}"
    per_beat = [sum(in_window(c.sends(name), wanted - entries).values()) for name in names]
    print(
        f"four beats, imported rows ({store.split(':')[0]}): {verdict.summary()}; "
        f"imported slots sent per beat {per_beat}; beat0 killed at +{killed_in - start} ms"
    )
