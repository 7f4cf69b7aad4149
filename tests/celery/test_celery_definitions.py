"""Stored definitions through a beat: the app's tasks as targets, ``target_options`` as
Celery's send options, sent on the path of a beat entry's run (in process, memory store)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from typing import Any

import pytest
from celery import Celery

import anarchon_celery
from anarchon_celery import send_options
from anarchon_core.context import RunContext
from anarchon_core.definitions import Definition
from anarchon_core.errors import ConfigurationError
from anarchon_core.records import Origin, Status

SLOT = 1_800_000_000_000


class Sent:
    """Stands in for ``app.send_task``: records each call, thread-safe."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        options.pop("producer", None)
        with self.lock:
            self.calls.append((name, args, kwargs, options))


def tasked_app(make_app: Any, beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
    app = make_app(beat_schedule, **conf)

    @app.task(name="proj.report", shared=False)
    def report(*args: Any, **kwargs: Any) -> None: ...

    @app.task(name="proj.sync", shared=False)
    def sync() -> None: ...

    return app


def send(sched: anarchon_celery.Scheduler, definition: Definition, attempt: int = 1) -> RunContext:
    """Run ``definition`` once here as the engine runs a won slot (nothing claimed)."""
    assert sched._core is not None
    job = sched._core._build_stored(definition)

    async def call() -> RunContext:
        ctx = RunContext(
            job=definition.name,
            slot=SLOT,
            attempt=attempt,
            instance_id="test",
            origin=Origin.SCHEDULE,
            loop=asyncio.get_running_loop(),
            logger=logging.getLogger("anarchon"),
        )
        await job.handler(ctx)
        return ctx

    return asyncio.run(call())


def test_the_apps_tasks_entry_tasks_and_anarchon_targets_are_the_targets(make_app):
    app = tasked_app(
        make_app,
        {"beat": {"task": "other.service.task", "schedule": 5}},
        anarchon_targets=["remote.task"],
        result_expires=3600,  # adds beat's celery.backend_cleanup entry
    )
    sched = anarchon_celery.Scheduler(app=app)
    assert sched._core is not None
    assert sorted(sched._core.targets) == [
        "other.service.task",
        "proj.report",
        "proj.sync",
        "remote.task",
    ]
    assert "4 tasks for stored definitions" in sched.info


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"anarchon_target": ["x"]}, "did you mean 'anarchon_targets'?"),
        ({"anarchon_targets": "proj.x"}, "anarchon_targets = 'proj.x' is not valid: give a list"),
        ({"anarchon_targets": ["bad name"]}, "anarchon_targets"),
    ],
)
def test_anarchon_targets_is_checked(make_app, conf: dict[str, Any], message: str):
    with pytest.raises(ConfigurationError, match="anarchon_target") as info:
        anarchon_celery.Scheduler(app=make_app(**conf))
    assert message in str(info.value)


def test_a_definition_is_sent_as_a_beat_entry_is(make_app, monkeypatch):
    app = tasked_app(make_app)
    sent = Sent()
    monkeypatch.setattr(app, "send_task", sent)
    sched = anarchon_celery.Scheduler(app=app)
    definition = Definition.create(
        "nightly",
        {"every": "1s"},
        "proj.report",
        args=[42],
        kwargs={"fmt": "pdf"},
        target_options={
            "queue": "reports",
            "exchange": "ex",
            "routing_key": "rk",
            "headers": {"tenant": "t1", "anarchon_job": "forged"},
            "priority": 7,
            "expire_seconds": 30,
        },
        version=3,
    )
    ctx = send(sched, definition, attempt=2)
    ((name, args, kwargs, options),) = sent.calls
    assert (name, args, kwargs) == ("proj.report", [42], {"fmt": "pdf"})
    expected = anarchon_celery.task_id_for("proj:nightly", SLOT)
    assert options == {
        "queue": "reports",
        "exchange": "ex",
        "routing_key": "rk",
        "priority": 7,
        "expires": 30.0,
        "headers": {
            "tenant": "t1",
            "celery_beat_task": True,
            "anarchon_job": "proj:nightly",
            "anarchon_slot": SLOT,
            "anarchon_attempt": 2,
        },
        "task_id": expected,
    }
    assert ctx.meta["task_id"] == expected
    send(sched, definition)
    assert sent.calls[1][3]["task_id"] == expected  # a takeover resends with the same id


def test_unknown_target_options_fail_the_run_naming_the_key(make_app, monkeypatch):
    app = tasked_app(make_app)
    sent = Sent()
    monkeypatch.setattr(app, "send_task", sent)
    sched = anarchon_celery.Scheduler(app=app)
    bad = Definition.create("d", {"every": "1s"}, "proj.sync", target_options={"queu": "q"})
    with pytest.raises(ConfigurationError) as info:
        send(sched, bad)
    assert str(info.value) == (
        "definition 'd' (target 'proj.sync'): target_options: unknown key 'queu'; did you "
        "mean 'queue'? accepted keys: queue, exchange, routing_key, headers, priority, "
        "expires, expire_seconds"
    )
    assert not sent.calls


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"task_id": "x"}, "unknown key 'task_id'"),
        ({"priority": 256}, "priority 256 is not valid: give an integer from 0 to 255"),
        ({"priority": True}, "priority True is not valid"),
        ({"queue": ""}, "queue '' is not valid: give a non-empty string"),
        ({"headers": [1]}, "headers [1] is not valid"),
        ({"expires": "tomorrow"}, "expires 'tomorrow' is not valid: give a number of seconds"),
        ({"expires": "2030-01-01T00:00:00"}, "ISO 8601 instant with a UTC offset"),
        ({"expires": -1}, "expires -1 is not valid"),
        ({"expire_seconds": "60"}, "expire_seconds '60' is not valid"),
        ({"expires": 5, "expire_seconds": 5}, "give expires or expire_seconds, not both"),
    ],
)
def test_send_options_refuse_bad_values(given: dict[str, Any], message: str):
    with pytest.raises(ConfigurationError, match=r"^target_options: ") as info:
        send_options(given)
    assert message in str(info.value)


def test_expires_takes_seconds_or_an_iso_instant():
    assert send_options({"expires": 90}) == {"expires": 90.0}
    at = send_options({"expires": "2030-01-01T00:00:00Z"})["expires"]
    assert at == dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert send_options({}) == {}


def test_a_beat_follows_stored_definitions_and_sends_code_jobs_once(make_app, monkeypatch):
    # The entry's name is also a task name: its code-owned copy in the store names a
    # held target, and must still be sent once per slot (by the entry, not the copy).
    app = tasked_app(
        make_app, {"proj.sync": {"task": "proj.sync", "schedule": 1}}, anarchon_jitter_ms=0
    )
    sent = Sent()
    monkeypatch.setattr(app, "send_task", sent)
    sched = anarchon_celery.Scheduler(app=app)
    try:
        sched.tick()
        background = sched._background
        assert background is not None
        deadline = time.monotonic() + 5
        while background.get_definition("proj.sync") is None:  # the start's sync
            assert time.monotonic() < deadline, "the code job was not synced"
            time.sleep(0.05)
        code = background.get_definition("proj.sync")
        assert code is not None and code.owner == "code" and code.target == "proj.sync"
        background.add_definition(
            Definition.create(
                "stored", {"every": "1s"}, "proj.report", args=[1], target_options={"queue": "q"}
            )
        )
        time.sleep(3.5)
    finally:
        sched.close()
    with sent.lock:
        calls = list(sent.calls)
    by_job: dict[str, list[int]] = {}
    for name, args, _kwargs, options in calls:
        headers = options["headers"]
        by_job.setdefault(headers["anarchon_job"], []).append(headers["anarchon_slot"])
        if headers["anarchon_job"] == "proj:stored":
            assert (name, args, options["queue"]) == ("proj.report", [1], "q")
        else:
            assert (name, args) == ("proj.sync", [])
    for job, slots in by_job.items():
        assert len(slots) == len(set(slots)), f"{job} sent a slot twice: {sorted(slots)}"
    assert len(by_job.get("proj:proj.sync", [])) >= 3
    assert len(by_job.get("proj:stored", [])) >= 2
    assert sched._core is not None
    history = asyncio.run(sched._core.history(job="proj:stored", status=Status.SUCCESS))
    assert {record.meta.get("task_id") for record in history} == {
        anarchon_celery.task_id_for("proj:stored", slot) for slot in by_job["proj:stored"]
    }


def test_a_bad_key_is_logged_when_the_beat_reads_it_and_fails_each_run(
    make_app, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="anarchon")
    app = tasked_app(make_app, anarchon_jitter_ms=0)
    sent = Sent()
    monkeypatch.setattr(app, "send_task", sent)
    sched = anarchon_celery.Scheduler(app=app)
    try:
        sched.tick()
        assert sched._background is not None
        sched._background.add_definition(
            Definition.create("typo", {"every": "1s"}, "proj.sync", target_options={"queu": "q"})
        )
        time.sleep(2.5)
    finally:
        sched.close()
    assert not sent.calls
    warned = [r.getMessage() for r in caplog.records if "cannot run as it is" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "stored job proj:typo (version" in warned[0]
    assert "unknown key 'queu'; did you mean 'queue'? accepted keys: queue," in warned[0]
    assert sched._core is not None
    failed = asyncio.run(sched._core.history(job="proj:typo", status=Status.FAILED))
    assert failed and all("unknown key 'queu'" in str(record.error) for record in failed)
