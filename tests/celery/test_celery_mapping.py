"""How beat entries and ``anarchon_*`` settings map to anarchon jobs."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import pytest
from celery.schedules import crontab, schedule, solar

import anarchon_celery
from anarchon_core.errors import CapabilityError, ConfigurationError
from anarchon_core.names import validate_job_name
from anarchon_core.schedules import Cron, Every

Make = Callable[..., anarchon_celery.Scheduler]


def _solar() -> solar:
    """A ``solar`` schedule without ``ephem`` (not installed here): only its type matters."""
    spec = solar.__new__(solar)
    spec.nowfun, spec._app = None, None
    return spec


def entry(spec: object, **more: object) -> dict[str, object]:
    return {"task": "proj.tasks.t", "schedule": spec, **more}


def jobs(sched: anarchon_celery.Scheduler) -> dict[str, object]:
    assert sched._core is not None
    return {job.store_name: job.schedule for job in sched._core.jobs.values()}


@pytest.mark.parametrize(
    ("spec", "interval_ms"),
    [
        (10, 10_000),
        (2.5, 2_500),
        (dt.timedelta(minutes=5), 300_000),
        (schedule(dt.timedelta(seconds=30)), 30_000),
        (schedule(45, relative=True), 45_000),
    ],
)
def test_intervals_map_to_the_epoch_grid(make_scheduler: Make, spec: object, interval_ms: int):
    sched = make_scheduler({"sync": entry(spec)})
    (name, mapped), *_ = jobs(sched).items()
    assert name == "proj:sync"
    assert isinstance(mapped, Every) and mapped.interval_ms == interval_ms


def test_relative_is_ignored_with_one_debug_log(make_scheduler: Make, caplog):
    caplog.set_level(logging.DEBUG, logger="anarchon.celery")
    make_scheduler({"rel-once": entry(schedule(10, relative=True))})
    make_scheduler({"rel-once": entry(schedule(10, relative=True))})
    assert sum("relative=True is ignored" in r.getMessage() for r in caplog.records) == 1


def test_crontab_maps_from_the_expanded_sets_with_and_day_rule(make_scheduler: Make):
    sched = make_scheduler(
        {"nightly": entry(crontab(minute="*/15", hour="1-3", day_of_week="mon-fri"))},
        timezone="Europe/Berlin",
    )
    mapped = jobs(sched)["proj:nightly"]
    assert isinstance(mapped, Cron)
    assert mapped.expression == "0,15,30,45 1-3 * * 1-5"
    assert mapped.tz == "Europe/Berlin" and mapped.day_or is False


def test_crontab_zone_defaults_to_utc_and_entry_tz_overrides(make_scheduler: Make):
    sched = make_scheduler(
        {"a": entry(crontab(minute=0)), "b": entry(crontab(minute=0))},
        anarchon_entries={"b": {"tz": "Asia/Tokyo"}},
    )
    found = jobs(sched)
    assert found["proj:a"].tz == "UTC"  # type: ignore[attr-defined]
    assert found["proj:b"].tz == "Asia/Tokyo"  # type: ignore[attr-defined]


def test_local_zone_is_refused_unless_allowed(make_scheduler: Make):
    beat = {"a": entry(crontab(minute=0))}
    with pytest.raises(ConfigurationError, match="enable_utc=False"):
        make_scheduler(beat, enable_utc=False, timezone=None)
    # Intervals never need a zone.
    make_scheduler({"b": entry(5)}, enable_utc=False, timezone=None)


def test_local_zone_when_allowed(make_scheduler: Make, monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    sched = make_scheduler(
        {"a": entry(crontab(minute=0))},
        enable_utc=False,
        timezone=None,
        anarchon_allow_local_tz=True,
    )
    assert jobs(sched)["proj:a"].tz == "Asia/Tokyo"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_solar(), "solar schedules are not supported"),
        (crontab(minute=0, nowfun=dt.datetime.now), r"crontab\(nowfun=...\)"),
        (schedule(10, nowfun=dt.datetime.now), r"schedule\(nowfun=...\)"),
    ],
)
def test_refused_kinds_name_the_entry(make_scheduler: Make, spec: object, message: str):
    with pytest.raises(ConfigurationError, match=message) as info:
        make_scheduler({"odd entry": entry(spec)})
    assert "'odd entry'" in str(info.value)


def test_custom_schedule_classes_are_refused(make_scheduler: Make):
    class MySchedule(schedule):  # type: ignore[misc]
        pass

    with pytest.raises(ConfigurationError, match=r"'custom'.*MySchedule.*not supported"):
        make_scheduler({"custom": entry(MySchedule(10))})


def test_add_periodic_task_entries_are_read(make_app):
    app = make_app()

    @app.on_after_configure.connect
    def setup(sender, **_):
        sender.add_periodic_task(30.0, sender.signature("proj.tasks.t"), name="added")

    app.loader.import_default_modules()
    app.finalize()
    sched = anarchon_celery.Scheduler(app=app)
    assert "proj:added" in jobs(sched)


@pytest.mark.parametrize(
    "name",
    ["every 10 seconds", "ünïcode/entry", "-leading", "a" * 400, "tasks.add(2, 2)"],
)
def test_names_outside_the_set_become_stable_slugs(name: str):
    slug = anarchon_celery.job_name(name, "proj")
    assert slug == anarchon_celery.job_name(name, "proj")  # stable
    validate_job_name(f"proj:{slug}")
    assert slug != name
    assert len(f"proj:{slug}") <= 200


def test_valid_names_are_kept_and_slugs_differ_by_hash():
    assert anarchon_celery.job_name("cleanup.daily", "proj") == "cleanup.daily"
    assert anarchon_celery.job_name("a b", "p") != anarchon_celery.job_name("a/b", "p")


def test_the_job_name_uses_the_namespace(make_scheduler: Make):
    sched = make_scheduler({"x y": entry(5)}, anarchon_namespace="billing")
    (name,) = jobs(sched)
    assert name.startswith("billing:x-y-")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"anarchon_entries": {"sync": {"jitter": 5}}}, r"anarchon_entries\['sync'\].*'jitter'"),
        ({"anarchon_entries": {"sync": {"jitter_ms": -1}}}, r"anarchon_entries\['sync'\]"),
        ({"anarchon_entries": {"sync": {"catch_up": "most"}}}, "catch_up"),
        ({"anarchon_entries": {"sync": {"max_attempts": 0}}}, "max_attempts"),
        ({"anarchon_entries": {"sync": {"tz": "Asia/Tokyo"}}}, "'tz' applies to crontab"),
        ({"anarchon_entries": {"sync": {"offset": "20s"}}}, "'sync'.*offset"),
        ({"anarchon_entries": {"nope": {"jitter_ms": 5}}}, "'nope'.*not a beat_schedule entry"),
        ({"anarchon_entries": "x"}, "anarchon_entries"),
        ({"anarchon_jitter_ms": "fast"}, "anarchon_jitter_ms"),
        ({"anarchon_catch_up": "sometimes"}, "anarchon_catch_up"),
        ({"anarchon_grace_ms": -5}, "anarchon_grace_ms"),
        ({"anarchon_candidates": 0}, r"anarchon_candidates = 0 is not valid: give an int from 1"),
        ({"anarchon_heartbeat_ms": 0}, r"anarchon_heartbeat_ms = 0 is not valid: give an int"),
        ({"anarchon_lease_ms": 100}, r"anarchon_lease_ms = 100 .*>= 2 × anarchon_heartbeat_ms"),
        ({"anarchon_history_retention": "7 days"}, "anarchon_history_retention"),
        ({"anarchon_task_id": "uuid4"}, "anarchon_task_id"),
        ({"anarchon_instance_id": " "}, "anarchon_instance_id"),
        ({"anarchon_allow_local_tz": "yes"}, "anarchon_allow_local_tz"),
        ({"anarchon_namespace": "bad ns"}, "anarchon_namespace"),
        ({"anarchon_backend": "nope://x"}, "nope"),
    ],
)
def test_bad_settings_stop_beat_naming_entry_and_key(
    make_scheduler: Make, conf: dict[str, object], message: str
):
    with pytest.raises(ConfigurationError, match=message):
        make_scheduler({"sync": entry(10)}, **conf)


def test_a_misspelled_setting_stops_beat_with_a_did_you_mean(make_scheduler: Make):
    """A typo must never leave beat running on defaults (a per-host store)."""
    with pytest.raises(ConfigurationError) as info:
        make_scheduler({"sync": entry(10)}, anarchon_backed="redis://h:6379/0")
    assert "anarchon_backed is not a setting anarchon knows" in str(info.value)
    assert "did you mean 'anarchon_backend'?" in str(info.value)


def test_every_bad_setting_is_reported_at_once(make_scheduler: Make):
    with pytest.raises(ConfigurationError) as info:
        make_scheduler(
            {"sync": entry(10)},
            anarchon_jiter_ms=5,
            anarchon_grace_ms=-5,
            anarchon_task_id="uuid4",
        )
    text = str(info.value)
    assert "did you mean 'anarchon_jitter_ms'?" in text
    assert "anarchon_grace_ms = -5" in text and "anarchon_task_id = 'uuid4'" in text


def test_scheduler_settings_reach_the_core(make_scheduler: Make):
    sched = make_scheduler(
        {"sync": entry(10)},
        anarchon_heartbeat_ms=500,
        anarchon_lease_ms=2000,
        anarchon_history_retention="2d",
        anarchon_enabled=False,
    )
    assert sched._core is not None
    core = sched._core
    assert (core.heartbeat_ms, core.lease_ms, core.enabled) == (500, 2000, False)
    assert core.history_retention_ms == 2 * 86_400_000


def test_entry_options_reach_the_job(make_scheduler: Make):
    sched = make_scheduler(
        {"sync": entry(60), "cron": entry(crontab(minute=5))},
        anarchon_jitter_ms=100,
        anarchon_entries={
            "sync": {"offset": "20s", "max_attempts": 2, "retries": 1, "timeout_ms": 9000},
            "cron": {"jitter_ms": 7, "catch_up": "all"},
        },
    )
    assert sched._core is not None
    sync, cron = sched._core.jobs["sync"], sched._core.jobs["cron"]
    assert isinstance(sync.schedule, Every) and sync.schedule.offset_ms == 20_000
    assert (sync.options.max_attempts, sync.options.retries) == (2, 1)
    assert sync.options.timeout_ms == 9000 and sync.options.jitter_ms == 100
    assert cron.options.jitter_ms == 7 and cron.options.catch_up == "all"
    assert sync.options.catch_up == "latest"  # the default on lease backends


def test_claim_only_store_ignores_the_default_catch_up_and_refuses_lease_options(make_scheduler):
    url = "redis://127.0.0.1:6379/13?strategy=script"
    sched = make_scheduler({"sync": entry(60)}, anarchon_backend=url)
    assert sched._core is not None
    assert "catch_up" not in sched._core.jobs["sync"].explicit  # not given: not refused
    with pytest.raises(CapabilityError, match="catch_up"):
        make_scheduler({"sync": entry(60)}, anarchon_backend=url, anarchon_catch_up="latest")


def test_the_default_store_is_the_env_then_the_brokers_redis(make_app, monkeypatch):
    monkeypatch.setenv("ANARCHON_BACKEND", "memory://")
    app = make_app({"sync": entry(5)}, anarchon_backend=None, broker_url="redis://h:1/0")
    sched = anarchon_celery.Scheduler(app=app)
    assert sched._core is not None and sched._core.backend.name == "memory"
    assert "(in memory: it coordinates this process only)" in sched.info
    monkeypatch.delenv("ANARCHON_BACKEND")
    broker = "redis://:secret@h:1/3?visibility_timeout=60"
    app = make_app({"sync": entry(5)}, anarchon_backend=None, broker_url=broker)
    info = anarchon_celery.Scheduler(app=app, lazy=True).info
    assert "redis://:***@h:1/3?strategy=lease" in info and "local" not in info


@pytest.mark.parametrize("broker", [None, "amqp://guest@rabbit//", "memory://"])
def test_no_store_and_a_broker_that_is_not_redis_stops_beat(make_app, monkeypatch, broker):
    """A per-host file as a silent default would let every host send each entry once."""
    monkeypatch.delenv("ANARCHON_BACKEND", raising=False)
    app = make_app({"sync": entry(5)}, anarchon_backend=None, broker_url=broker)
    with pytest.raises(ConfigurationError) as info:
        anarchon_celery.Scheduler(app=app)
    text = str(info.value)
    assert "anarchon_backend is not set" in text and "is not Redis" in text
    assert "'sqlite:///anarchon.sqlite3' when every beat runs on this one host" in text


def test_a_local_store_says_so_in_the_banner(make_app, tmp_path):
    url = f"sqlite:///{tmp_path}/a.sqlite3"
    app = make_app({"sync": entry(5)}, anarchon_backend=url)
    info = anarchon_celery.Scheduler(app=app, lazy=True).info
    assert "(a local store: it coordinates the processes of this host only)" in info


def test_missing_namespace_is_an_error(make_app):
    app = make_app({"sync": entry(5)})
    app.main = None
    with pytest.raises(ConfigurationError, match="anarchon_namespace is not set"):
        anarchon_celery.Scheduler(app=app)


def test_a_main_name_that_is_no_namespace_names_the_key_to_set(make_app):
    app = make_app({"sync": entry(5)})
    app.main = "__main__"  # Celery(__name__) in a script
    with pytest.raises(ConfigurationError) as info:
        anarchon_celery.Scheduler(app=app)
    text = str(info.value)
    assert "anarchon_namespace = '__main__' is not valid: give a name of" in text
    assert "(default: the app's name)" in text and "is not set" not in text


def test_cron_expression_compresses_sets():
    assert anarchon_celery.cron_expression(crontab()) == "* * * * *"
    spec = crontab(minute="0,1,2,10", hour="*/6", day_of_month="1,15", month_of_year="*/3")
    assert anarchon_celery.cron_expression(spec) == "0-2,10 0,6,12,18 1,15 1,4,7,10 *"


def test_every_configuration_problem_is_reported_at_once(make_scheduler):
    """A settings typo, an unknown entry name and an unknown per-entry key: one start,
    one message naming the three, each with its did-you-mean."""
    with pytest.raises(ConfigurationError) as raised:
        make_scheduler(
            {"sync": entry(30), "bad": entry(_solar())},
            anarchon_jiter_ms=5,
            anarchon_entries={"synk": {}, "sync": {"jitter": 3}},
        )
    text = str(raised.value)
    assert text.startswith("4 problems in the anarchon configuration:")
    assert "did you mean 'anarchon_jitter_ms'" in text
    assert "'synk', which is not a beat_schedule entry; did you mean 'sync'?" in text
    assert "unknown key 'jitter'; did you mean 'jitter_ms'" in text
    assert "beat entry 'bad': solar schedules are not supported" in text
