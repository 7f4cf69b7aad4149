"""``manage.py anarchon import-celery-beat``: django-celery-beat's rows, made through its own
models, become stored definitions; a rerun updates, never duplicates."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
from typing import Any

import pytest

pytest.importorskip("django_celery_beat")

from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from anarchon_core import stored_jobs
from anarchon_core.backend import InstanceInfo
from anarchon_core.definitions import Definition
from anarchon_core.records import HistoryQuery, Status
from anarchon_core.schedules import At, Cron, Every
from anarchon_django.backend import DjangoBackend
from anarchon_django.celery_beat import (
    IMPORT_INSTANCE,
    MARK,
    convert,
    definition_name,
)

UTC = dt.UTC


def anarchon(*args: str) -> str:
    out = io.StringIO()
    call_command("anarchon", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def stored() -> dict[str, Definition]:
    async def read() -> list[Definition]:
        backend = DjangoBackend("default")
        await backend.open()
        try:
            return await stored_jobs.definitions(backend, None)
        finally:
            await backend.close()

    return {d.name: d for d in asyncio.run(read())}


def history(job: str) -> list[Any]:
    async def read() -> list[Any]:
        backend = DjangoBackend("default")
        await backend.open()
        try:
            return await backend.history(HistoryQuery(job=job, limit=10))
        finally:
            await backend.close()

    return asyncio.run(read())


def row_of(out: str, source: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(source + " ")]
    return line


@pytest.fixture
def rows(transactional_db: None) -> dict[str, Any]:
    """One PeriodicTask of every kind django-celery-beat has."""
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    now = timezone.now()
    ten_s = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    hourly = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    micro = IntervalSchedule.objects.create(every=1500, period=IntervalSchedule.MICROSECONDS)
    athens = CrontabSchedule.objects.create(
        minute="30",
        hour="3",
        day_of_month="1-7",
        month_of_year="*",
        day_of_week="1",
        timezone="Europe/Athens",
    )
    weekdays = CrontabSchedule.objects.create(
        minute="0", hour="9", day_of_week="mon-fri", timezone="UTC"
    )
    clocked = ClockedSchedule.objects.create(clocked_time=dt.datetime(2099, 1, 1, tzinfo=UTC))
    solar = SolarSchedule.objects.create(event="sunrise", latitude=37.98, longitude=23.73)
    made = {
        "ping": PeriodicTask.objects.create(
            name="ping",
            task="shop.tasks.ping",
            interval=ten_s,
            args="[1, 2]",
            kwargs='{"fmt": "pdf"}',
            queue="fast",
            exchange="pings",
            routing_key="ping.fast",
            headers='{"tenant": "acme"}',
            priority=7,
            expire_seconds=30,
            start_time=dt.datetime(2020, 1, 1, tzinfo=UTC),
            last_run_at=now - dt.timedelta(minutes=5),
            description="pings the shop",
        ),
        "Monthly report (Athens)": PeriodicTask.objects.create(
            name="Monthly report (Athens)",
            task="shop.tasks.report",
            crontab=athens,
            expires=dt.datetime(2099, 6, 1, tzinfo=UTC),
        ),
        "new year": PeriodicTask.objects.create(
            name="new year", task="shop.tasks.report", clocked=clocked, one_off=True
        ),
        "sunrise": PeriodicTask.objects.create(name="sunrise", task="shop.tasks.ping", solar=solar),
        "off": PeriodicTask.objects.create(
            name="off", task="shop.tasks.ping", interval=hourly, enabled=False
        ),
        "expired": PeriodicTask.objects.create(
            name="expired",
            task="shop.tasks.ping",
            interval=hourly,
            expires=dt.datetime(2001, 1, 1, tzinfo=UTC),
        ),
        "micro": PeriodicTask.objects.create(name="micro", task="shop.tasks.ping", interval=micro),
        "once": PeriodicTask.objects.create(
            name="once", task="shop.tasks.ping", crontab=weekdays, one_off=True
        ),
        "bad target": PeriodicTask.objects.create(
            name="bad target", task="not a task name!", interval=hourly
        ),
    }
    return made


def test_every_kind_is_imported_or_skipped_with_its_reason(rows: dict[str, Any]) -> None:
    out = anarchon("import-celery-beat")
    definitions = stored()
    assert set(definitions) == {
        "ping",
        definition_name("Monthly report (Athens)"),
        definition_name("new year"),
        "off",
        "once",
    }

    ping = definitions["ping"]
    assert ping.schedule == Every("10s")
    assert ping.target == "shop.tasks.ping"
    assert ping.args == (1, 2) and dict(ping.kwargs) == {"fmt": "pdf"}
    assert dict(ping.target_options) == {
        "queue": "fast",
        "exchange": "pings",
        "routing_key": "ping.fast",
        "headers": {"tenant": "acme"},
        "priority": 7,
        "expires": 30,
    }
    assert ping.start_at == 1_577_836_800_000 and ping.end_at is None
    assert ping.description == f'{MARK}"ping"\npings the shop'
    assert dict(ping.options) == {"catch_up": "latest"}
    # last_run_at is the job's last recorded scheduled run: catch-up starts there.
    (record,) = history("ping")
    assert record.status == Status.SUCCESS and record.instance_id == IMPORT_INSTANCE
    assert record.slot == int(rows["ping"].last_run_at.timestamp() * 1000)

    report = definitions[definition_name("Monthly report (Athens)")]
    assert report.name.startswith("Monthly-report-Athens-")
    assert report.schedule == Cron("30 3 1-7 * 1", "Europe/Athens", day_or=False)
    assert report.end_at == int(dt.datetime(2099, 6, 1, tzinfo=UTC).timestamp() * 1000)
    assert report.description == f'{MARK}"Monthly report (Athens)"'
    new_year = definitions[definition_name("new year")]
    assert new_year.schedule == At("2099-01-01T00:00:00Z")
    assert not definitions["off"].enabled
    assert definitions["off"].reason == "disabled in django-celery-beat"
    once = definitions["once"]
    assert isinstance(once.schedule, At)
    assert Cron("0 9 * * mon-fri").next_slot(once.schedule.at_ms - 1) == once.schedule.at_ms

    assert "solar schedule: anarchon has none" in row_of(out, "sunrise")
    assert "expired at 2001-01-01" in row_of(out, "expired")
    assert "1500 microseconds" in row_of(out, "micro")
    assert "refused by the store's rules" in row_of(out, "bad target")
    assert "skipped" in row_of(out, "bad target")
    assert "9 row(s): 5 imported, 0 updated, 0 unchanged, 4 skipped" in out
    assert "task unverified (no Celery app)" in row_of(out, "ping")


def test_a_rerun_updates_and_never_duplicates(rows: dict[str, Any]) -> None:
    anarchon("import-celery-beat")
    first = stored()
    again = anarchon("import-celery-beat")
    assert "9 row(s): 0 imported, 0 updated, 5 unchanged, 4 skipped" in again
    assert stored() == first  # same versions: nothing was written
    assert len(history("ping")) == 1

    from django_celery_beat.models import IntervalSchedule

    ping = rows["ping"]
    ping.interval = IntervalSchedule.objects.create(every=20, period=IntervalSchedule.SECONDS)
    ping.queue = "slow"
    ping.save()
    planned = anarchon("import-celery-beat", "--dry-run")
    assert "~ ping: every 20s" in planned and "to update" in row_of(planned, "ping")
    assert stored() == first  # a dry run writes nothing
    changed = anarchon("import-celery-beat")
    assert "1 updated, 4 unchanged" in changed
    after = stored()
    assert set(after) == set(first)
    assert after["ping"].schedule == Every("20s")
    assert after["ping"].target_options["queue"] == "slow"
    assert after["ping"].version > first["ping"].version
    assert after["once"].schedule == first["once"].schedule  # a one-off keeps its slot


def test_a_name_taken_by_another_definition_is_refused(rows: dict[str, Any]) -> None:
    async def add() -> None:
        backend = DjangoBackend("default")
        await backend.open()
        try:
            await stored_jobs.add_definition(
                backend, Definition.create("ping", Every("1h"), "mine"), None
            )
        finally:
            await backend.close()

    asyncio.run(add())
    out = anarchon("import-celery-beat")
    assert "a stored definition of that name exists, that this import did not write" in (
        row_of(out, "ping")
    )
    assert stored()["ping"].target == "mine"


def test_a_code_job_of_a_live_instance_keeps_its_name(rows: dict[str, Any]) -> None:
    async def register() -> None:
        backend = DjangoBackend("default")
        await backend.open()
        try:
            now = await backend.now_ms()
            info = InstanceInfo("web-1", "host", 1, "0", now, now, {"ping": "0" * 16})
            await backend.register(info, 60_000)
        finally:
            await backend.close()

    asyncio.run(register())
    out = anarchon("import-celery-beat")
    assert "the name is a code job's on a live instance" in row_of(out, "ping")
    assert "ping" not in stored() and history("ping") == []


def test_the_tables_are_read_when_the_app_is_not_installed(rows: dict[str, Any]) -> None:
    from django.conf import settings

    apps = [app for app in settings.INSTALLED_APPS if app != "django_celery_beat"]
    with override_settings(INSTALLED_APPS=apps):
        out = anarchon("import-celery-beat", "--dry-run")
    assert "9 row(s): 5 would be imported" in out
    assert "+ ping: every 10s" in out
    assert stored() == {}


def test_tasks_the_celery_app_does_not_register_are_listed(rows: dict[str, Any]) -> None:
    from celery import Celery, _state

    previous = getattr(_state._tls, "current_app", None)
    app = Celery("beatimport", set_as_current=True)

    @app.task(name="shop.tasks.ping")
    def ping() -> None: ...

    try:
        out = anarchon("import-celery-beat", "--dry-run")
    finally:
        _state._set_current_app(previous)
    assert "task not registered" not in row_of(out, "ping")
    assert "task not registered in the Celery app 'beatimport'" in row_of(
        out, "Monthly report (Athens)"
    )
    assert "2 definition(s) name a task the Celery app 'beatimport' does not register" in out


@pytest.mark.parametrize(
    "original",
    ["ping", "Monthly report (Athens)", "a:b", "Über Bericht", "!!!", "x" * 300, "-lead"],
)
def test_names_are_valid_and_stable(original: str) -> None:
    name = definition_name(original)
    assert definition_name(original) == name
    Definition.create(name, Every("1h"), "t")  # valid
    assert (name == original) == (original in ("ping",))


def test_celery_day_of_week_numbering_and_day_fields_are_crons() -> None:
    """Celery's crontab (Sunday is 0; both day fields must match) against the Cron the
    import makes of the same fields."""
    from celery import Celery
    from celery.schedules import crontab

    app = Celery("numbering", set_as_current=False)
    app.conf.timezone = "UTC"
    specs = [
        {"minute": "0", "hour": "9", "day_of_week": "0"},
        {"minute": "15", "hour": "*/6", "day_of_week": "mon-fri"},
        {"minute": "30", "hour": "3", "day_of_month": "1-7", "day_of_week": "1"},
        {"minute": "0", "hour": "0", "day_of_month": "13", "day_of_week": "5"},
        {"minute": "0", "hour": "12", "day_of_month": "*/10", "month_of_year": "2,8"},
    ]
    start = dt.datetime(2026, 3, 4, 10, 7, tzinfo=UTC)
    for spec in specs:
        row = {"name": "x", "task": "t", "crontab": {"timezone": "UTC", **spec}}
        schedule = convert(row, now_ms=0).definition.schedule  # type: ignore[union-attr]
        beat = crontab(app=app, **spec)
        last = start
        for _ in range(5):
            base, delta, _now = beat.remaining_delta(last)
            expected = base + delta
            got = schedule.next_slot(int(last.timestamp() * 1000))
            assert got == int(expected.timestamp() * 1000), (spec, last)
            last = expected
