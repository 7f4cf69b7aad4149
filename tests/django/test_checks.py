"""System checks: one id per kind of bad setting or job definition (see anarchon_django.checks)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.test import override_settings
from procs import manage

from anarchon_django import _scheduler
from anarchon_django.apps import discover
from anarchon_django.checks import check_anarchon
from anarchon_django.conf import alias_from_url, read_settings

DATABASES = {"default": {}, "other": {}}


def ids(raw: Any) -> list[str]:
    return [p.id for p in read_settings(raw, DATABASES).problems]


def messages(raw: Any) -> list[str]:
    return [f"{p.msg} {p.hint}" for p in read_settings(raw, DATABASES).problems]


def test_defaults_map_onto_scheduler_kwargs() -> None:
    conf = read_settings({}, DATABASES)
    assert conf.problems == ()
    assert conf.backend == "django://default"
    assert alias_from_url(conf.backend) == "default"
    assert conf.scheduler_kwargs() == {
        "namespace": None,
        "instance_id": None,
        "heartbeat_ms": 2000,
        "lease_ms": None,
        "history_retention": "7d",
        "grace_ms": 10_000,
        "candidates": 2,
        "enabled": None,
        "sync_code_jobs": True,
        "jitter_ms": 500,
    }


def test_every_key_maps() -> None:
    raw = {
        "BACKEND": "django://other",
        "NAMESPACE": "shop",
        "AUTODISCOVER": "scheduled",
        "IMPORT_PATHS": ["a.b"],
        "INSTANCE_ID": "web-1",
        "JITTER_MS": 0,
        "HEARTBEAT_MS": 500,
        "LEASE_MS": 1000,
        "CATCH_UP": "latest",
        "HISTORY_RETENTION": "3d",
        "GRACE_MS": 0,
        "CANDIDATES": None,
        "ENABLED": False,
        "SYNC_CODE_JOBS": False,
    }
    conf = read_settings(raw, DATABASES)
    assert conf.problems == ()
    assert alias_from_url(conf.backend) == "other"
    assert conf.autodiscover == "scheduled"
    assert conf.import_paths == ("a.b",)
    scheduler = _scheduler.build_scheduler(conf)
    assert scheduler.namespace == "shop"
    assert scheduler.instance_id == "web-1"
    assert (scheduler.heartbeat_ms, scheduler.lease_ms, scheduler.grace_ms) == (500, 1000, 0)
    assert scheduler.history_retention_ms == 3 * 86_400_000
    assert scheduler.enabled is False
    assert scheduler.candidates is None
    assert scheduler.sync_at_start is False
    job = scheduler.every("x", "1s", lambda ctx: None)
    assert (job.options.jitter_ms, job.options.catch_up) == (0, "latest")
    assert job.store_name == "shop:x"


@pytest.mark.parametrize("value", [0, 1001, "2", 1.5, True])
def test_a_bad_candidate_count(value: object) -> None:
    assert ids({"CANDIDATES": value}) == ["anarchon.E005"]
    assert "CANDIDATES" in messages({"CANDIDATES": value})[0]


def test_not_a_dict() -> None:
    assert ids(["BACKEND"]) == ["anarchon.E001"]


def test_unknown_key_suggests_the_right_one() -> None:
    assert ids({"HEARTBEAT": 100}) == ["anarchon.E002"]
    assert "did you mean 'HEARTBEAT_MS'?" in messages({"HEARTBEAT": 100})[0]


@pytest.mark.parametrize("url", ["nope", "ftp://x", 42, "sqlite://relative"])
def test_bad_backend_url(url: object) -> None:
    assert ids({"BACKEND": url}) == ["anarchon.E003"]


def test_unknown_database_alias() -> None:
    assert ids({"BACKEND": "django://replica"}) == ["anarchon.E004"]
    assert "'replica'" in messages({"BACKEND": "django://replica"})[0]


@pytest.mark.parametrize(
    ("key", "value", "form"),
    [
        ("NAMESPACE", "a b", "None or a name"),
        ("AUTODISCOVER", "my-jobs", "module name"),
        ("IMPORT_PATHS", "shop.jobs", "list of dotted module paths"),
        ("INSTANCE_ID", "", "non-empty string"),
        ("JITTER_MS", -1, "int of milliseconds >= 0"),
        ("HEARTBEAT_MS", "2s", "int of milliseconds >= 1"),
        ("LEASE_MS", 3000, ">= 2 × HEARTBEAT_MS"),  # 1.5 × the default heartbeat
        ("CATCH_UP", "some", "'none', 'latest', 'all'"),
        ("HISTORY_RETENTION", 7, '"7d"'),
        ("GRACE_MS", 1.5, ">= 0"),
        ("ENABLED", "yes", "True, False or None"),
    ],
)
def test_bad_value_names_key_value_and_form(key: str, value: object, form: str) -> None:
    assert ids({key: value}) == ["anarchon.E005"]
    text = messages({key: value})[0]
    assert f"ANARCHON[{key!r}] = {value!r}" in text
    assert form in text


def test_bad_values_fall_back_to_defaults_so_every_problem_is_listed() -> None:
    conf = read_settings({"HEARTBEAT_MS": 0, "CATCH_UP": "x", "TYPO": 1}, DATABASES)
    assert sorted(p.id for p in conf.problems) == [
        "anarchon.E002",
        "anarchon.E005",
        "anarchon.E005",
    ]
    assert conf.heartbeat_ms == 2000
    _scheduler.build_scheduler(conf)  # still constructible: the checks report, run refuses


def test_bad_backend_scheduler_refuses_to_open() -> None:
    import asyncio

    from anarchon_core.errors import ConfigurationError

    scheduler = _scheduler.build_scheduler(read_settings({"BACKEND": "ftp://x"}, DATABASES))
    assert scheduler.backend_url == "ftp://x"  # never silently another store
    with pytest.raises(ConfigurationError, match="ftp"):
        asyncio.run(scheduler.history())


# -- jobs modules ---------------------------------------------------------------------


@pytest.fixture
def jobs_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh package ``fakeapps`` on sys.path and a fresh project scheduler."""
    package = tmp_path / "fakeapps"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    old = _scheduler.reset_scheduler(
        _scheduler.build_scheduler(read_settings({"BACKEND": "memory://"}, DATABASES))
    )
    try:
        yield package
    finally:
        _scheduler.reset_scheduler(old)
        for name in [m for m in sys.modules if m == "fakeapps" or m.startswith("fakeapps.")]:
            del sys.modules[name]


def write(package: Path, name: str, body: str) -> str:
    (package / f"{name}.py").write_text(
        "from anarchon_django import scheduler\n\n" + textwrap.dedent(body)
    )
    return f"fakeapps.{name}"


@pytest.mark.parametrize(
    ("body", "check_id", "words"),
    [
        ('scheduler.every("bad name", "1s", lambda ctx: None)\n', "anarchon.E011", "job name"),
        ('scheduler.every("a", "10", lambda ctx: None)\n', "anarchon.E012", "bare number"),
        ('scheduler.cron("a", "61 * * * *", lambda ctx: None)\n', "anarchon.E013", "cron"),
        (
            'scheduler.cron("a", "0 3 * * *", lambda ctx: None, tz="Mars/Base")\n',
            "anarchon.E014",
            "time zone 'Mars/Base'",
        ),
        ('scheduler.every("a", "1s", lambda ctx: None, jiter_ms=5)\n', "anarchon.E015", "jiter_ms"),
        ("import nonexistent_module_xyz\n", "anarchon.E010", "ModuleNotFoundError"),
        ("1 / 0\n", "anarchon.E010", "ZeroDivisionError"),
    ],
)
def test_bad_jobs_module(jobs_package: Path, body: str, check_id: str, words: str) -> None:
    module = write(jobs_package, "jobs", body)
    [problem] = discover([module])
    assert problem.id == check_id
    assert words in problem.msg
    assert "fakeapps.jobs" in problem.msg and "line 3" in problem.msg


def test_bad_decorator_line_is_reported(jobs_package: Path) -> None:
    module = write(
        jobs_package,
        "jobs",
        """
        @scheduler.every("a", "1x")
        def a(ctx):
            pass
        """,
    )
    [problem] = discover([module])
    assert problem.id == "anarchon.E012"
    assert "'1x'" in problem.msg and '"500ms"' in problem.msg


def test_duplicate_job_names_across_apps(jobs_package: Path) -> None:
    first = write(jobs_package, "one", 'scheduler.every("sync", "1s", lambda ctx: None)\n')
    second = write(jobs_package, "two", 'scheduler.every("sync", "5s", lambda ctx: None)\n')
    [problem] = discover([first, second])
    assert problem.id == "anarchon.E016"
    assert "fakeapps.one" in problem.msg and "fakeapps.two" in problem.msg


def test_a_name_defined_twice_in_one_module_names_both_lines(jobs_package: Path) -> None:
    module = write(
        jobs_package,
        "twice",
        """
        @scheduler.every("sync", "1s")
        def first(ctx):
            pass

        @scheduler.every("sync", "5s")
        def second(ctx):
            pass
        """,
    )
    [problem] = discover([module])
    assert problem.id == "anarchon.E016"
    assert "in fakeapps.twice (line " in problem.msg
    lines = [part.split(")")[0] for part in problem.msg.split("(line ")[1:]]
    assert len(set(lines)) == 2, problem.msg  # two places, not one module twice


def test_missing_import_path(jobs_package: Path) -> None:
    [problem] = discover(["fakeapps.absent"])
    assert problem.id == "anarchon.E010"


def test_cron_without_tz_warns_in_a_non_utc_project(jobs_package: Path) -> None:
    module = write(
        jobs_package,
        "jobs",
        """
        scheduler.cron("naive", "0 3 * * *", lambda ctx: None)
        scheduler.cron("explicit", "0 3 * * *", lambda ctx: None, tz="Europe/Athens")
        """,
    )
    assert discover([module]) == []
    assert _scheduler.get_scheduler().jobs["naive"].schedule.tz == "UTC"
    with override_settings(TIME_ZONE="Europe/Athens"):
        warnings = [m for m in check_anarchon() if m.id == "anarchon.W001"]
    assert len(warnings) == 1
    assert isinstance(warnings[0], checks.Warning)
    assert "'naive'" in warnings[0].msg and "UTC" in warnings[0].msg
    assert "Europe/Athens" in warnings[0].msg
    with override_settings(TIME_ZONE="UTC"):
        assert not [m for m in check_anarchon() if m.id == "anarchon.W001"]


def test_settings_problems_reach_the_check_framework() -> None:
    with override_settings(ANARCHON={"BACKEND": "django://nowhere", "GRACE": 1}):
        found = {m.id for m in checks.run_checks(tags=["anarchon"])}
    assert found == {"anarchon.E002", "anarchon.E004"}
    assert not checks.run_checks(tags=["anarchon"])  # the test project is clean


@pytest.mark.parametrize(
    ("settings_json", "check_id"),
    [
        ('{"JITER_MS": 5}', "anarchon.E002"),
        ('{"BACKEND": "django://replica"}', "anarchon.E004"),
        ('{"HISTORY_RETENTION": "7 days"}', "anarchon.E005"),
    ],
)
def test_manage_py_check_reports_the_id(settings_json: str, check_id: str) -> None:
    result = manage("check", env={"ANARCHON_TEST_SETTINGS": settings_json})
    assert result.returncode == 1
    assert check_id in result.stderr


def test_manage_py_check_is_clean_and_opens_no_store(tmp_path: Path) -> None:
    store = tmp_path / "never.db"
    result = manage("check", env={"ANARCHON_TEST_BACKEND": f"sqlite:///{store}"})
    assert result.returncode == 0, result.stderr
    assert not store.exists()


def test_manage_py_check_warns_about_cron_in_utc_when_time_zone_differs() -> None:
    env = {
        "ANARCHON_TEST_SETTINGS": '{"IMPORT_PATHS": ["django_project.extra_jobs"]}',
        "ANARCHON_TEST_TIME_ZONE": "Europe/Athens",
    }
    result = manage("check", env=env)
    assert result.returncode == 0, result.stderr
    assert "anarchon.W001" in result.stderr and "'naive.report'" in result.stderr
    utc = manage("check", env={**env, "ANARCHON_TEST_TIME_ZONE": "UTC"})
    assert utc.returncode == 0 and "anarchon.W001" not in utc.stderr + utc.stdout


def test_manage_py_check_reports_a_duplicate_job_name_across_modules() -> None:
    env = {
        "ANARCHON_TEST_SETTINGS": '{"IMPORT_PATHS": ["django_project.extra_jobs"]}',
        "ANARCHON_TEST_DUPLICATE": "1",
    }
    result = manage("check", env=env)
    assert result.returncode == 1
    assert "anarchon.E016" in result.stderr
    assert "django_project.shop.jobs" in result.stderr
    assert "django_project.extra_jobs" in result.stderr


def test_manage_py_anarchon_jobs_refuses_to_list_a_partial_set() -> None:
    """A jobs module that fails half-way must not list the jobs before the failure."""
    result = manage(
        "anarchon", "jobs", env={"ANARCHON_TEST_SETTINGS": '{"IMPORT_PATHS": ["nowhere.jobs"]}'}
    )
    assert result.returncode != 0
    assert "anarchon.E010" in result.stderr and "nowhere.jobs" in result.stderr
    assert "job(s)" not in result.stdout


def test_manage_py_check_reports_a_missing_import_path() -> None:
    result = manage("check", env={"ANARCHON_TEST_SETTINGS": '{"IMPORT_PATHS": ["nowhere.jobs"]}'})
    assert result.returncode == 1
    assert "anarchon.E010" in result.stderr and "nowhere.jobs" in result.stderr


def test_a_missing_driver_is_an_error_before_a_run_fails_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg 3 without its pool: ``manage.py check`` names what is missing (E006)."""
    import sys

    from anarchon_django.backend import missing_driver
    from anarchon_django.checks import _driver_messages

    postgres = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "app"}}
    for name in [m for m in sys.modules if m.startswith("anarchon_core.backends.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)  # import fails
    problem = missing_driver("postgresql")
    assert problem is not None and "psycopg_pool" in problem
    assert "pip install 'anarchon[django,postgres]'" in problem
    (message,) = _driver_messages("django://default", postgres)
    assert message.id == "anarchon.E006" and "psycopg_pool" in message.msg
    assert _driver_messages("django://default", {"default": {"ENGINE": "x.sqlite3"}}) == []
    assert _driver_messages("redis://h/0", postgres) == []
