"""The ``django.tasks`` bridge: enqueue a task once per slot of a schedule.

Django's tasks framework (``django.tasks``, Django ≥ 6.0; the ``django-tasks`` backport
``django_tasks`` on 5.2) runs tasks in the background but schedules nothing. Given a
task instead of a handler, :meth:`~anarchon_django._scheduler.DjangoScheduler.every`
and ``cron()`` define a job whose handler enqueues the task once per slot::

    from django.tasks import task            # or: from django_tasks import task
    from anarchon_django import scheduler

    @task
    def send_report(*, anarchon_slot: int) -> None: ...

    scheduler.cron("reports.daily", "0 7 * * *", task=send_report)

The task receives the slot it was enqueued for as the keyword argument
``anarchon_slot`` (epoch milliseconds, the same for every instance and every attempt),
and ``anarchon_job`` / ``anarchon_attempt`` too if it names them (or takes
``**kwargs``). Delivery is at least once: after a takeover (attempt 2 or later) the
task may be enqueued a second time for the same slot, so the task must use
``anarchon_slot`` as its idempotency key.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from anarchon_core.context import RunContext
from anarchon_core.errors import ConfigurationError

__all__ = [
    "SLOT_ARGUMENT",
    "EnqueueableTask",
    "enqueue_handler",
    "slot_datetime",
    "task_classes",
    "tasks_module",
]

#: The keyword argument that carries the slot (epoch ms); every task must accept it.
SLOT_ARGUMENT = "anarchon_slot"
#: Passed only to tasks that name them (or take ``**kwargs``).
OPTIONAL_ARGUMENTS = ("anarchon_job", "anarchon_attempt")

_MODULES = ("django.tasks", "django_tasks")


@runtime_checkable
class EnqueueableTask(Protocol):
    """What the bridge needs of a task: ``django.tasks.Task`` / ``django_tasks`` ``Task``."""

    def enqueue(self, *args: Any, **kwargs: Any) -> Any: ...


@functools.cache
def tasks_module() -> ModuleType:
    """``django.tasks`` if importable (Django ≥ 6.0), else the ``django_tasks`` backport.

    :raises ConfigurationError: neither is installed.
    """
    for name in _MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ConfigurationError(
        "task=: neither django.tasks (Django >= 6.0) nor django_tasks (the backport) is "
        "installed: upgrade Django to 6.0, or pip install django-tasks"
    )


@functools.cache
def task_classes() -> tuple[type, ...]:
    """The ``Task`` classes of every tasks module installed (the resolved one first)."""
    tasks_module()  # raises if neither is installed
    classes: list[type] = []
    for name in _MODULES:
        try:
            base = importlib.import_module(f"{name}.base")
        except ImportError:
            continue
        cls = getattr(base, "Task", None)
        if isinstance(cls, type):
            classes.append(cls)
    return tuple(classes)


def slot_datetime(slot: int) -> dt.datetime:
    """The aware UTC datetime of a slot (``anarchon_slot`` is epoch milliseconds)."""
    return dt.datetime.fromtimestamp(slot / 1000, tz=dt.UTC)


def _describe(value: object) -> str:
    return str(getattr(value, "__qualname__", None) or repr(value))


def check_task(task: object, owner: str) -> None:
    """Raise :class:`ConfigurationError` unless ``task`` is a task of the tasks framework."""
    module = tasks_module().__name__
    if isinstance(task, task_classes()):
        return
    if callable(task) and not isinstance(task, EnqueueableTask):
        raise ConfigurationError(
            f"{owner}: task={_describe(task)} is a plain callable, not a task: decorate it "
            f"with @task (from {module} import task), or pass it as the handler instead"
        )
    raise ConfigurationError(
        f"{owner}: task={task!r} is not a task: give a function decorated with @task "
        f"(from {module} import task)"
    )


def _accepts(func: Callable[..., Any]) -> tuple[inspect.Signature | None, set[str], bool]:
    """The signature of ``func``, its keyword-passable parameter names, and ``**kwargs``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None, set(), True
    names = {
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return signature, names, var_kw


def enqueue_handler(
    task: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str = "?",
) -> Callable[[RunContext], str]:
    """A handler that enqueues ``task`` once per run, with the run's slot.

    Each run calls ``task.enqueue(*args, **kwargs, anarchon_slot=ctx.slot)`` (plus
    ``anarchon_job=ctx.job`` and ``anarchon_attempt=ctx.attempt`` if the task function
    names them or takes ``**kwargs``), records ``ctx.meta["task"]`` (the task's path)
    and ``ctx.meta["task_id"]`` (the enqueued result's id), and returns that id. It
    enqueues nothing once the run is cancelled (lease lost, stopping).

    Everything is checked now, at definition: ``task`` is a task, its function accepts
    ``anarchon_slot`` and the given arguments, and those are JSON-serialisable.

    :raises ConfigurationError: any of the above does not hold.
    """
    owner = f"job {name!r}"
    check_task(task, owner)
    func = getattr(task, "func", None)
    label = _describe(func if func is not None else task)
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ConfigurationError(
            f"{owner}: task_args={args!r} is not a list: give the positional arguments of "
            f"the task as a list or tuple, e.g. task_args=[{args!r}]"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(
            f"{owner}: task_kwargs={kwargs!r} is not a dict: give the keyword arguments of "
            f"the task as a dict"
        )
    args = tuple(args)
    kwargs = dict(kwargs or {})
    reserved = sorted(k for k in kwargs if k == SLOT_ARGUMENT or k in OPTIONAL_ARGUMENTS)
    if reserved:
        raise ConfigurationError(
            f"{owner}: task_kwargs may not set {', '.join(reserved)}: the scheduler passes "
            f"them for each slot"
        )
    try:
        json.dumps([args, kwargs])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{owner}: the arguments of task {label} are not JSON-serialisable ({exc}): "
            f"tasks take JSON values (str, int, float, bool, None, lists and dicts of them)"
        ) from None
    signature, names, var_kw = _accepts(func) if callable(func) else (None, set(), True)
    if not var_kw and SLOT_ARGUMENT not in names:
        raise ConfigurationError(
            f"{owner}: task {label} must accept the keyword argument {SLOT_ARGUMENT!r} (the "
            f"slot it is enqueued for, epoch ms; its idempotency key), e.g. "
            f"'def {getattr(func, '__name__', 'task')}(*, {SLOT_ARGUMENT}: int): ...'"
        )
    passed = [n for n in OPTIONAL_ARGUMENTS if var_kw or n in names]
    if signature is not None:
        leading = [None] if getattr(task, "takes_context", False) else []
        probe = {SLOT_ARGUMENT: 0, **dict.fromkeys(passed, 0)}
        try:
            signature.bind(*leading, *args, **kwargs, **probe)
        except TypeError as exc:
            raise ConfigurationError(
                f"{owner}: task {label} cannot be called with task_args={list(args)!r}, "
                f"task_kwargs={kwargs!r} and {SLOT_ARGUMENT}: {exc}"
            ) from None
    path = str(getattr(task, "module_path", None) or label)

    def enqueue(ctx: RunContext) -> str:
        ctx.raise_if_cancelled()  # a lost lease: the slot is another instance's now
        extra: dict[str, Any] = {SLOT_ARGUMENT: ctx.slot}
        if "anarchon_job" in passed:
            extra["anarchon_job"] = ctx.job
        if "anarchon_attempt" in passed:
            extra["anarchon_attempt"] = ctx.attempt
        result = task.enqueue(*args, **kwargs, **extra)
        result_id = str(result.id)
        ctx.meta["task"] = path
        ctx.meta["task_id"] = result_id
        ctx.logger.info("enqueued task %s for slot %d: %s", path, ctx.slot, result_id)
        return result_id

    enqueue.__name__ = enqueue.__qualname__ = f"enqueue_{getattr(func, '__name__', 'task')}"
    enqueue.__doc__ = f"Enqueue the task {path} once per slot."
    if func is not None and getattr(func, "__module__", None):
        enqueue.__module__ = func.__module__
    return enqueue
