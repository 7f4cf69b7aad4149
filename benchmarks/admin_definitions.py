"""The Django admin's definition pages with 100,000 stored definitions.

Django is configured here (``settings.configure``: the admin, auth, sessions and
``anarchon_django``, the ORM store ``django://default``) on a throwaway SQLite file or
a fresh PostgreSQL database, ``migrate`` makes the tables, and ``--definitions`` rows
(every 1 to 59 minutes or a cron in one of four zones, one in ten disabled, a code job's
copy in twenty) are written straight into the store's table with its counter, as
``write_definition`` would leave them, with ``--attempts`` recorded runs of each in the
history (the list shows each row's newest) and a live instance holding the targets in
the registry (the form's choices, the list's flags). A superuser's ``django.test.Client`` then asks,
interleaved over ``--repeats`` rounds, for: the list's first page, a page in the middle
and the last one, a search by name, a search by target (a text of the definition), the
disabled ones (a filter), and one definition's change page (form, next slots, runs).
Each answer must be a 200 with its rows; the time is the whole request through
Django's handler, as a browser would wait for it, without the network.

Run: ``python -m benchmarks.admin_definitions`` (both databases, a few minutes), or
``--db sqlite --definitions 10000``. The PostgreSQL server is
``$ANARCHON_BENCH_POSTGRES`` (else the test server), where a database
``anarchon_bench_…`` is created and dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anarchon_core.definitions import Definition

from ._util import machine, print_table
from .django_claims import create_database, drop_database, postgres_settings
from .postgres_claims import DEFAULT_URL

ZONES = ("UTC", "Europe/Athens", "America/New_York", "Asia/Tokyo")
CHANGELIST = "/admin/anarchon_django/job/"


def definition(n: int) -> Definition:
    """The ``n``-th definition of the fill: varied, as a real table is."""
    schedule: dict[str, Any]
    if n % 2:
        schedule = {"every": f"{n % 59 + 1}m"}
    else:
        schedule = {"cron": f"{n % 60} {n % 24} * * *", "tz": ZONES[n % len(ZONES)]}
    return Definition.create(
        f"tenant-{n // 100:04d}.report-{n % 100:02d}",
        schedule,
        f"reports.task_{n % 40:02d}",
        kwargs={"tenant": n // 100, "kind": "daily"},
        target_options={"queue": f"q{n % 4}"},
        enabled=n % 10 != 3,
        reason=None if n % 10 != 3 else "paused by the tenant",
        description=f"report {n % 100} of tenant {n // 100}",
        owner="code" if n % 20 == 7 else "store",
    )


def fill(count: int, attempts: int) -> None:
    """``count`` definitions in the store's table and its counter, ``attempts`` recorded
    runs of each in the history (the list shows each row's newest), and one live
    instance in the registry holding the targets (what the form and the list read)."""
    from django.db import connection, transaction

    from anarchon_django.models import HistoryRecord, Instance, Job, StoreMeta

    now = int(time.time() * 1000)
    with transaction.atomic():
        HistoryRecord.objects.bulk_create(
            (
                HistoryRecord(
                    job=definition(n).name,
                    slot=now - (k + 1) * 60_000,
                    attempt=1,
                    origin="schedule",
                    status="success" if k else "failed",
                    instance_id="web-1",
                    claimed_at=now,
                    started_at=now,
                    finished_at=now,
                )
                for n in range(count)
                for k in range(attempts)
            ),
            batch_size=5000,
        )
        info = {
            "instance_id": "web-1",
            "host": "web-1",
            "pid": 1,
            "version": "bench",
            "started_at": now,
            "last_seen": now,
            "jobs": {},
            "targets": [f"reports.task_{n:02d}" for n in range(40)],
        }
        Instance.objects.create(
            instance_id="web-1", info=info, last_seen=now, expires_at=now + 3_600_000
        )

    with transaction.atomic():
        Job.objects.bulk_create(
            (
                Job(job=d.name, paused=False, version=n + 1, definition=d.body())
                for n, d in ((n, definition(n)) for n in range(count))
            ),
            batch_size=2000,
        )
        StoreMeta.objects.update_or_create(
            key="definitions_version", defaults={"value": str(count)}
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE anarchon_jobs")
            cursor.execute("ANALYZE anarchon_attempts")


def pages(count: int) -> dict[str, tuple[str, int]]:
    """What is asked: a name for each page, its path and the rows it must list."""
    per_page, middle_name = 50, definition(count // 2).name
    last = (count - 1) // per_page + 1
    pk = _pk_of(middle_name)
    return {
        "list, first page": (CHANGELIST, per_page),
        "list, middle page": (f"{CHANGELIST}?p={last // 2}", per_page),
        "list, last page": (f"{CHANGELIST}?p={last}", count - (last - 1) * per_page),
        "search a name": (f"{CHANGELIST}?q={middle_name}", 1),
        "search a target": (f"{CHANGELIST}?q=reports.task_07", per_page),
        "filter disabled": (f"{CHANGELIST}?enabled=no", per_page),
        "change page": (f"{CHANGELIST}{pk}/change/", 0),
    }


def _pk_of(name: str) -> int:
    from anarchon_django.models import Job

    return int(Job.objects.values_list("pk", flat=True).get(job=name))


def measure(count: int, repeats: int) -> dict[str, list[float]]:
    """Milliseconds per request of each page, ``repeats`` interleaved rounds."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
    asked = pages(count)
    times: dict[str, list[float]] = {name: [] for name in asked}
    for round_ in range(repeats + 1):  # round 0 warms the caches up, untimed
        for name, (url, rows) in asked.items():
            start = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - start) * 1000
            _check(name, response, rows)
            if round_:
                times[name].append(elapsed)
    return times


def _check(name: str, response: Any, rows: int) -> None:
    html = response.content.decode()
    if response.status_code != 200:
        raise SystemExit(f"{name}: HTTP {response.status_code}")
    listed = html.count('<th class="field-job"')
    if rows and listed != rows:
        raise SystemExit(f"{name}: {listed} rows listed, expected {rows}")
    if not rows and 'id="anarchon-next-slots"' not in html:
        raise SystemExit(f"{name}: no next slots on the change page")


def configure(db: str, tmp: Path, url: str | None) -> None:
    import django
    from django.conf import settings
    from django.core.management import call_command

    if db == "sqlite":
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp / "admin.db")}
    else:
        database = postgres_settings(url or "")
    settings.configure(
        DEBUG=False,
        DATABASES={"default": database},
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "anarchon_django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF="benchmarks._admin_urls",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        SECRET_KEY="anarchon-benchmarks-only",
        ANARCHON={"BACKEND": "django://default"},
    )
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def run_one(db: str, count: int, repeats: int, attempts: int) -> None:
    """One database, in this process (Django is configured once per process)."""
    server = os.environ.get("ANARCHON_BENCH_POSTGRES", DEFAULT_URL)
    url = create_database(server) if db == "postgres" else None
    try:
        with tempfile.TemporaryDirectory(prefix="anarchon-admin-bench-") as tmp:
            configure(db, Path(tmp), url)
            started = time.perf_counter()
            fill(count, attempts)
            filled = time.perf_counter() - started
            from anarchon_django import _admin_dashboard

            try:
                times = measure(count, repeats)
            finally:
                _admin_dashboard.close_dashboard()
    finally:
        if url is not None:
            from django.db import connections

            connections.close_all()
            drop_database(server, url)
    rows = [
        (name, f"{statistics.median(t):.1f}", f"{min(t):.1f}", f"{max(t):.1f}")
        for name, t in times.items()
    ]
    print_table(
        f"{db}: the admin's definition pages, {count:,} definitions and {count * attempts:,} "
        f"recorded runs (filled in {filled:.1f} s), {repeats} interleaved rounds",
        ("page", "median ms", "min ms", "max ms"),
        rows,
    )
    print(
        json.dumps(
            {
                "db": db,
                "definitions": count,
                "median_ms": {name: round(statistics.median(t), 1) for name, t in times.items()},
            }
        )
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--definitions", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--attempts", type=int, default=3, help="recorded runs per definition")
    args = parser.parse_args(argv)
    if not 1 <= args.definitions <= 1_000_000 or not 1 <= args.repeats <= 1000:
        parser.error("give 1 to 1,000,000 definitions and 1 to 1,000 repeats")
    if not 0 <= args.attempts <= 100:
        parser.error("give 0 to 100 attempts per definition")
    if args.db != "both":
        run_one(args.db, args.definitions, args.repeats, args.attempts)
        return
    print(machine(), flush=True)
    for db in ("sqlite", "postgres"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.admin_definitions",
                "--db",
                db,
                "--definitions",
                str(args.definitions),
                "--repeats",
                str(args.repeats),
                "--attempts",
                str(args.attempts),
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
