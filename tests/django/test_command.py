"""``manage.py anarchon``: the core CLI's subcommands on the project's scheduler and store."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import override_settings
from procs import manage

from anarchon_core import Scheduler
from anarchon_django import _scheduler, scheduler


def anarchon(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("anarchon", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """A core SQLite store with some history: three runs of ``shop.sync``."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    core = Scheduler(url, instance_id="writer", jitter_ms=0, heartbeat_ms=100)
    core.every("shop.sync", "100ms", lambda ctx: None)

    async def produce() -> None:
        await core.start()
        while len(await core.history(job="shop.sync")) < 3:
            await asyncio.sleep(0.05)
        await core.stop()

    asyncio.run(produce())
    yield url


def test_jobs_lists_the_jobs_py_of_installed_apps() -> None:
    out, _ = anarchon("jobs", "--count", "2")
    assert "2 job(s)" in out
    assert "shop.sync" in out and "every 10m" in out
    assert "shop.nightly" in out and "Europe/Athens" in out
    lines = [json.loads(line) for line in anarchon("jobs", "--json")[0].splitlines()]
    assert {line["job"] for line in lines} == {"shop.sync", "shop.nightly"}
    assert all(len(line["next_slots"]) == 5 for line in lines)


def test_project_scheduler_is_the_one_jobs_py_used() -> None:
    from django_project.shop import jobs

    assert scheduler is _scheduler.get_scheduler()
    assert scheduler.jobs["shop.sync"].options.jitter_ms == 2000  # the job's own
    assert scheduler.heartbeat_ms == 200  # from the test settings' ANARCHON
    assert scheduler.backend_url == "django://default"
    assert jobs.sync_orders.__name__ == "sync_orders"  # the decorator returns the function


def test_history_json_and_table(store: str) -> None:
    out, _ = anarchon("history", "--backend", store, "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) >= 3
    assert {r["job"] for r in records} == {"shop.sync"}
    assert {r["status"] for r in records} == {"success"}
    table, _ = anarchon("history", "--backend", store, "--limit", "2")
    assert table.splitlines()[0].split()[:3] == ["JOB", "SCHEDULED", "(UTC)"]
    assert len(table.splitlines()) == 4


def test_history_defaults_to_the_projects_store(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler, "backend_url", store)
    out, _ = anarchon("history", "--json", "--job", "shop.sync", "--limit", "1")
    assert json.loads(out)["job"] == "shop.sync"


def test_pause_resume_instances_prune_cancel(store: str) -> None:
    out, _ = anarchon("pause", "shop.sync", "--backend", store)
    assert "paused shop.sync" in out
    out, _ = anarchon("resume", "shop.sync", "--backend", store)
    assert "resumed shop.sync" in out
    out, _ = anarchon("instances", "--backend", store, "--json")
    assert out == ""  # the writer stopped: no live instance
    out, _ = anarchon("prune", "--backend", store, "--older-than", "1d", "--job", "shop.sync")
    assert "0 history record(s) pruned" in out
    with pytest.raises(CommandError) as raised:
        anarchon("cancel", "shop.sync", "1000000000000", "--backend", store)
    assert raised.value.returncode == 1


def test_trigger_without_a_live_instance_fails(store: str) -> None:
    with pytest.raises(CommandError) as raised:
        anarchon("trigger", "shop.sync", "--backend", store)
    assert raised.value.returncode == 1
    assert "shop.sync" in str(raised.value)


def test_bad_store_url_is_a_usage_error() -> None:
    with pytest.raises(CommandError) as raised:
        anarchon("history", "--backend", "ftp://nowhere")
    assert raised.value.returncode == 2
    assert "ftp" in str(raised.value)


@pytest.mark.django_db  # Django >= 6.1 runs its model checks against the database
def test_run_refuses_on_failing_checks() -> None:
    with override_settings(ANARCHON={"HEARTBEAT": 5}), pytest.raises(SystemCheckError) as raised:
        anarchon("run")
    assert "anarchon.E002" in str(raised.value)


def test_help_lists_every_subcommand() -> None:
    result = manage("anarchon", "--help")
    assert result.returncode == 0, result.stderr
    for name in (
        "run",
        "jobs",
        "history",
        "instances",
        "pause",
        "resume",
        "trigger",
        "cancel",
        "prune",
    ):
        assert name in result.stdout
    result = manage("anarchon", "history", "--help")
    assert result.returncode == 0, result.stderr
    assert "--json" in result.stdout and "--since" in result.stdout and "--backend" in result.stdout


def test_a_django_url_outside_the_project_says_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "nowhere_project.settings"}
    result = subprocess.run(
        [sys.executable, "-m", "anarchon_core", "history", "--backend", "django://default"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "DJANGO_SETTINGS_MODULE='nowhere_project.settings' could not be imported" in (
        result.stderr
    )
    assert "manage.py anarchon" in result.stderr and "Traceback" not in result.stderr
