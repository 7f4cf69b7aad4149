"""The ``django.tasks`` bridge: ``every()``/``cron()`` with ``task=`` enqueue once per slot.

Every test of a task runs once per tasks framework installed: Django 6's own
``django.tasks`` and the ``django_tasks`` backport (the only one on Django 5.2), each
with the same tasks in a module of its own (``bridge_tasks_django``,
``bridge_tasks_backport``). Enqueues are counted through the framework's
``task_enqueued`` signal: backends are per thread, and every run of a sync handler has a
worker thread of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from anarchon_core.context import RunContext
from anarchon_core.records import Origin
from anarchon_core.schedules import Every
from anarchon_core.testing import run_once
from anarchon_django import tasks as bridge
from anarchon_django._scheduler import DjangoScheduler, JobDefinitionError


def plain_function(*, anarchon_slot: int) -> None: ...


@dataclass(frozen=True)
class Framework:
    """One tasks framework: its module of tasks (``bridge_tasks_*``) and its signal."""

    name: str
    tasks: ModuleType
    task_enqueued: Any

    def backend(self, kind: str) -> dict[str, Any]:
        """The ``TASKS`` setting for its ``dummy`` or ``immediate`` backend."""
        return {"default": {"BACKEND": f"{self.name}.backends.{kind}.{kind.title()}Backend"}}


def _framework(tasks_module: str) -> Framework | None:
    try:
        tasks = importlib.import_module(tasks_module)
    except ImportError:  # django.tasks before Django 6.0, or no backport installed
        return None
    signals = importlib.import_module(f"{tasks.FRAMEWORK}.signals")
    return Framework(tasks.FRAMEWORK, tasks, signals.task_enqueued)


FRAMEWORKS = [
    f for f in map(_framework, ("bridge_tasks_django", "bridge_tasks_backport")) if f is not None
]


@pytest.fixture(params=FRAMEWORKS, ids=[f.name for f in FRAMEWORKS])
def framework(request: pytest.FixtureRequest) -> Framework:
    result: Framework = request.param
    return result


@pytest.fixture
def enqueued(framework: Framework) -> Iterator[list[Any]]:
    """Every ``TaskResult`` the framework enqueued during the test, from any thread."""
    results: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        results.append(task_result)

    framework.task_enqueued.connect(receiver, weak=False)
    framework.tasks.ran.clear()
    yield results
    framework.task_enqueued.disconnect(receiver)
    framework.tasks.ran.clear()


def test_the_resolved_module_is_django_tasks_on_django_6_else_the_backport() -> None:
    import django

    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert bridge.tasks_module().__name__ == expected
    assert [f.name for f in FRAMEWORKS][:1] == [expected]


def test_a_task_of_any_installed_framework_is_accepted(framework: Framework) -> None:
    assert type(framework.tasks.send_report) in bridge.task_classes()


def test_neither_tasks_module_installed_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "django.tasks", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "django_tasks", None)  # type: ignore[arg-type]
    bridge.tasks_module.cache_clear()
    bridge.task_classes.cache_clear()
    try:
        with pytest.raises(Exception, match="pip install django-tasks") as info:
            DjangoScheduler("memory://").every("r", "1m", task=FRAMEWORKS[0].tasks.send_report)
        assert "django.tasks" in str(info.value) and "django_tasks" in str(info.value)
        assert isinstance(info.value, JobDefinitionError)
    finally:
        monkeypatch.undo()
        bridge.tasks_module.cache_clear()
        bridge.task_classes.cache_clear()


@pytest.mark.django_db(transaction=True)
def test_two_instances_enqueue_the_task_once_per_slot_with_that_slot(
    settings: Any, framework: Framework, enqueued: list[Any]
) -> None:
    settings.TASKS = framework.backend("dummy")
    instances = [
        DjangoScheduler("django://default", instance_id=f"i{n}", jitter_ms=0, heartbeat_ms=100)
        for n in range(2)
    ]
    task = framework.tasks.send_report
    jobs = [s.every("reports.often", "200ms", task=task) for s in instances]
    assert jobs[0].name == "reports.often"
    assert instances[0].origins["reports.often"] == __name__  # where the job is defined

    async def main() -> None:
        for s in instances:
            await s.start()
        for _ in range(100):
            if len(enqueued) >= 5:
                break
            await asyncio.sleep(0.05)
        for s in instances:
            await s.stop()

    asyncio.run(main())
    records = asyncio.run(instances[0].history(job="reports.often"))
    runs = [r for r in records if r.status.value == "success"]
    assert len(enqueued) >= 5
    slots = [r.kwargs["anarchon_slot"] for r in enqueued]
    assert len(slots) == len(set(slots))  # exactly one enqueue per slot
    assert sorted(slots) == sorted(r.slot for r in runs)  # …and one per run, its slot
    assert all(s % 200 == 0 for s in slots)
    assert all(r.args == [] and set(r.kwargs) == {"anarchon_slot"} for r in enqueued)
    assert all(r.task.func is framework.tasks.send_report.func for r in enqueued)
    ids = {r.kwargs["anarchon_slot"]: r.id for r in enqueued}
    for run in runs:  # the history shows which task result each slot enqueued
        assert run.meta["task_id"] == ids[run.slot]
        assert run.meta["task"] == f"{framework.tasks.__name__}.send_report"


def test_the_task_gets_the_slot_job_attempt_and_its_arguments(
    settings: Any, framework: Framework, enqueued: list[Any]
) -> None:
    settings.TASKS = framework.backend("immediate")
    scheduler = DjangoScheduler("memory://", jitter_ms=0)
    scheduler.cron(
        "reports.daily",
        "0 7 * * *",
        task=framework.tasks.send_detailed,
        task_args=["sales"],
        task_kwargs={"lang": "el"},
    )
    slot = 1_767_250_800_000  # 2026-01-01 07:00 UTC
    first = run_once(scheduler, "reports.daily", slot=slot)
    assert framework.tasks.ran == [
        {
            "kind": "sales",
            "lang": "el",
            "anarchon_slot": slot,
            "anarchon_job": "reports.daily",
            "anarchon_attempt": 1,
        }
    ]
    assert first.value == enqueued[0].id == first.ctx.meta["task_id"]
    assert enqueued[0].return_value == f"sales@{slot}"
    assert str(bridge.slot_datetime(slot)) == "2026-01-01 07:00:00+00:00"

    # a takeover re-runs the slot: the task is enqueued again with the same slot
    run_once(scheduler, "reports.daily", slot=slot, attempt=2)
    assert [c["anarchon_slot"] for c in framework.tasks.ran] == [slot, slot]
    assert [c["anarchon_attempt"] for c in framework.tasks.ran] == [1, 2]


def test_a_task_taking_kwargs_gets_all_three(
    settings: Any, framework: Framework, enqueued: list[Any]
) -> None:
    settings.TASKS = framework.backend("dummy")
    scheduler = DjangoScheduler("memory://", jitter_ms=0)
    scheduler.every("any", "1m", task=framework.tasks.takes_anything)
    run_once(scheduler, "any", slot=60_000, attempt=3)
    assert enqueued[0].kwargs == {
        "anarchon_slot": 60_000,
        "anarchon_job": "any",
        "anarchon_attempt": 3,
    }


def test_a_cancelled_run_enqueues_nothing(
    settings: Any, framework: Framework, enqueued: list[Any]
) -> None:
    settings.TASKS = framework.backend("dummy")
    scheduler = DjangoScheduler("memory://", jitter_ms=0)
    job = scheduler.every("r", "1m", task=framework.tasks.send_report)

    async def main() -> None:
        ctx = RunContext(
            job="r",
            slot=0,
            attempt=1,
            instance_id="t",
            origin=Origin.MANUAL,
            loop=asyncio.get_running_loop(),
            logger=logging.getLogger("anarchon"),
        )
        ctx._cancel("lease lost")
        with pytest.raises(Exception, match="lease lost"):
            job.handler(ctx)

    asyncio.run(main())
    assert enqueued == []


def test_the_decorator_form_is_unchanged() -> None:
    scheduler = DjangoScheduler("memory://", jitter_ms=0)

    @scheduler.cron("plain", "0 7 * * *")
    def plain(ctx: RunContext) -> str:
        return "ran"

    assert plain(None) == "ran"  # type: ignore[arg-type]
    assert run_once(scheduler, "plain").value == "ran"


def test_add_job_takes_a_task_too(settings: Any, framework: Framework, enqueued: list[Any]) -> None:
    settings.TASKS = framework.backend("dummy")
    scheduler = DjangoScheduler("memory://", jitter_ms=0)
    scheduler.add_job("added", Every("1m"), task=framework.tasks.send_report)
    assert scheduler.origins["added"] == __name__
    run_once(scheduler, "added", slot=120_000)
    assert [r.kwargs for r in enqueued] == [{"anarchon_slot": 120_000}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": plain_function}, "plain callable, not a task: decorate it with @task"),
        ({"task": 42}, "task=42 is not a task"),
        ({"task": "send_report", "handler": lambda ctx: None}, "not both"),
        ({"task": "no_slot"}, "must accept the keyword argument 'anarchon_slot'"),
        ({"task_kwargs": {"x": 1}}, "need task="),
        ({"task": "send_report", "task_kwargs": {"anarchon_slot": 1}}, "may not set anarchon_slot"),
        ({"task": "send_detailed", "task_args": [object()]}, "not JSON-serialisable"),
        ({"task": "send_detailed", "task_args": "sales"}, "task_args='sales' is not a list"),
        ({"task": "send_detailed"}, "cannot be called with task_args=\\[\\]"),
        ({"task": "send_report", "task_kwargs": {"lang": "el"}}, "cannot be called"),
    ],
)
def test_bad_task_definitions_fail_at_the_definition(
    framework: Framework, kwargs: dict[str, Any], message: str
) -> None:
    scheduler = DjangoScheduler("memory://", jitter_ms=0)
    kwargs = dict(kwargs)
    handler = kwargs.pop("handler", None)
    if isinstance(kwargs.get("task"), str):  # a task of this module, by its name
        kwargs["task"] = getattr(framework.tasks, kwargs["task"])
    for define in (
        lambda: scheduler.every("bad.every", "1m", handler, **kwargs),
        lambda: scheduler.cron("bad.cron", "0 7 * * *", handler, **kwargs),
    ):
        with pytest.raises(JobDefinitionError, match=message) as info:
            define()
        assert info.value.check_id == "anarchon.E015"
    assert scheduler.jobs == {}
    assert scheduler.default_zone_jobs == []
